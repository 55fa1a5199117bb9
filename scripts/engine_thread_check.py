"""Why does flashtile's backward cost more host time inside the autograd engine than called directly?

On a GPU, one packed row of the training example's attention (8192 tokens, 8 documents, H = 8, H_kv = 2,
D = 64, bf16, causal). Host µs a call, calls issued back to back:
  - fwd+bwd through torch.autograd.grad, with the engine's device thread (the default) and with
    ``torch.autograd.set_multithreading_enabled(False)`` (the backward runs on the calling thread);
  - the backward's launcher called directly on this thread;
  - a pure-Python loop of fixed work, on this thread and inside an autograd.Function's backward on the
    engine's device thread: whether Python itself runs slower there (two H100 runs disagreed; see
    docs/design/host_path.md, "The backward in autograd's device thread").

    PYTHONPATH=src python scripts/engine_thread_check.py
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from launch_overhead import host_us

from flashtile import flash_attn_varlen_func, ops

TOTAL, HEADS, HEADS_KV, HEAD_DIM = 8192, 8, 2, 64
DOCUMENT_ENDS = [0, 412, 1630, 1904, 3300, 4821, 5002, 6950, 8192]


def python_work(n: int = 3000) -> int:
    """Fixed interpreter work (dict and attribute traffic, as a launcher does)."""
    total = 0
    table = {"a": 1, "b": 2}
    for i in range(n):
        total += table["a"] + (i & 7)
    return total


class PythonInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        python_work()
        return grad


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    cu = torch.tensor(DOCUMENT_ENDS, dtype=torch.int32, device=dev)
    longest = max(b - a for a, b in itertools.pairwise(DOCUMENT_ENDS))
    q = torch.randn(TOTAL, HEADS, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
    k, v = (
        torch.randn(TOTAL, HEADS_KV, HEAD_DIM, device=dev, dtype=dt, requires_grad=True) for _ in range(2)
    )
    dout = torch.randn(TOTAL, HEADS, HEAD_DIM, device=dev, dtype=dt)

    def fwd_bwd():
        out = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    qd, kd, vd = (t.detach() for t in (q, k, v))
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    out, lse = ops.run_attn_fwd(qd, kd, vd, HEAD_DIM**-0.5, True, "hopper", -1, 0, **varlen)

    def bwd_only():
        return ops.run_attn_bwd(dout, qd, kd, vd, out, lse, HEAD_DIM**-0.5, True, "hopper", -1, 0, **varlen)

    def python_in_engine():
        return torch.autograd.grad(PythonInBackward.apply(q), (q,), dout)

    def measure(name, fn):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        print(f"{name:58s} {host_us(fn):8.1f}", flush=True)

    print(f"{torch.cuda.get_device_name()}; host µs a call")
    for _ in range(2):
        measure("fwd+bwd, engine device thread (default)", fwd_bwd)
        with torch.autograd.set_multithreading_enabled(False):
            measure("fwd+bwd, backward on the calling thread", fwd_bwd)
        measure("backward launcher called directly", bwd_only)
        measure("python_work() on this thread", python_work)
        measure("identity Function + python_work() in its backward, engine", python_in_engine)
        with torch.autograd.set_multithreading_enabled(False):
            measure("the same, backward on the calling thread", python_in_engine)


if __name__ == "__main__":
    main()
