"""Where the host time of the training example's attention goes, on a GPU: one packed row of 8192 tokens
(8 heads, 2 KV heads, D = 64, bf16, causal, documents of mixed lengths), as examples/train_llama.py runs it.

Prints host µs (issuing calls back to back), per-call ms (CUDA events) and kernel ms of flashtile's varlen
forward, forward + backward and backward alone (``ops.run_attn_bwd`` in this thread, as the autograd
engine's device thread calls it), beside SDPA's cuDNN and flash backends on the same tokens as one dense
causal sequence; then a cProfile of the backward (this thread) and of the forward, by own time.

    PYTHONPATH=src python scripts/host_profile_packed.py [--out profile.txt]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import sys
import threading
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from launch_overhead import host_us, kernels_ms, per_call_event_ms

from flashtile import flash_attn_varlen_func, ops
from flashtile.autograd import FlashAttnFunction

TOTAL, HEADS, HEADS_KV, HEAD_DIM = 8192, 8, 2, 64
DOCUMENT_ENDS = [0, 412, 1630, 1904, 3300, 4821, 5002, 6950, 8192]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    dev, dt = "cuda", torch.bfloat16
    cu = torch.tensor(DOCUMENT_ENDS, dtype=torch.int32, device=dev)
    longest = max(b - a for a, b in itertools.pairwise(DOCUMENT_ENDS))
    q = torch.randn(TOTAL, HEADS, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
    kv_shape = (TOTAL, HEADS_KV, HEAD_DIM)
    k, v = (torch.randn(kv_shape, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    dout = torch.randn(TOTAL, HEADS, HEAD_DIM, device=dev, dtype=dt)

    def fwd():
        return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)

    def fwd_bwd():
        return torch.autograd.grad(fwd(), (q, k, v), dout)

    qd, kd, vd = (t.detach() for t in (q, k, v))
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    out, lse = ops.run_attn_fwd(qd, kd, vd, HEAD_DIM**-0.5, True, "triton", -1, 0, **varlen)
    backend = "hopper" if torch.cuda.get_device_capability()[0] == 9 else "triton"

    def bwd_only():
        return ops.run_attn_bwd(dout, qd, kd, vd, out, lse, HEAD_DIM**-0.5, True, backend, -1, 0, **varlen)

    # SDPA on the same tokens as one causal sequence (no document mask: its kernel-time floor and host cost).
    qs = q.detach().transpose(0, 1).unsqueeze(0).requires_grad_(True)
    group = HEADS // HEADS_KV
    ks, vs = (t.detach().transpose(0, 1).unsqueeze(0).repeat_interleave(group, 1).requires_grad_(True)
              for t in (k, v))  # fmt: skip
    douts = dout.transpose(0, 1).unsqueeze(0)

    def sdpa_fwd_bwd(backend):
        def call():
            with sdpa_kernel(backend):
                o = scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            return torch.autograd.grad(o, (qs, ks, vs), douts)

        return call

    report = io.StringIO()

    def say(line: str) -> None:
        print(line)
        report.write(line + "\n")

    say(f"{torch.cuda.get_device_name()}; packed row {TOTAL} tokens, {len(DOCUMENT_ENDS) - 1} documents, "
        f"H={HEADS} H_kv={HEADS_KV} D={HEAD_DIM} bf16 causal; backward backend {backend}")  # fmt: skip
    say(f"{'call':34s} {'host µs':>9s} {'call ms':>8s} {'kernels ms':>11s}")
    rows = [("flashtile varlen fwd (grad)", fwd), ("flashtile varlen fwd+bwd", fwd_bwd),
            ("flashtile ops.run_attn_bwd", bwd_only),
            ("sdpa cudnn fwd+bwd (dense causal)", sdpa_fwd_bwd(SDPBackend.CUDNN_ATTENTION)),
            ("sdpa flash fwd+bwd (dense causal)", sdpa_fwd_bwd(SDPBackend.FLASH_ATTENTION))]  # fmt: skip
    for name, fn in rows:
        for _ in range(5):
            fn()
        say(f"{name:34s} {host_us(fn):9.1f} {per_call_event_ms(fn):8.3f} {kernels_ms(fn):11.3f}")
    for name, fn in (("backward (ops.run_attn_bwd)", bwd_only), ("forward (grad)", fwd)):
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(50):
            fn()
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        say(f"\n== cProfile of 50 calls: {name}, by own time\n{text.getvalue()}")
    # The backward as the autograd engine runs it (its device thread): wall time inside
    # FlashAttnFunction.backward and a cProfile of it there, against an empty Function's engine overhead.
    inner = FlashAttnFunction.backward
    spent, threads, inside = [], set(), cProfile.Profile()

    def timed_backward(ctx, *grads):
        threads.add(threading.get_ident())
        inside.enable()
        begin = time.perf_counter()
        result = inner(ctx, *grads)
        spent.append(time.perf_counter() - begin)
        inside.disable()
        return result

    FlashAttnFunction.backward = staticmethod(timed_backward)
    for _ in range(50):
        fwd_bwd()
    torch.cuda.synchronize()
    FlashAttnFunction.backward = staticmethod(inner)
    text = io.StringIO()
    pstats.Stats(inside, stream=text).sort_stats("tottime").print_stats(30)
    say(
        f"\n== FlashAttnFunction.backward in the engine: {sum(spent) / len(spent) * 1e6:.1f} µs a call "
        f"(profiled), thread {'main' if threads == {threading.get_ident()} else 'other'}\n{text.getvalue()}"
    )

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    def identity_fwd_bwd():
        return torch.autograd.grad(Identity.apply(q), (q,), dout)

    for _ in range(5):
        identity_fwd_bwd()
    say(f"empty autograd.Function fwd+bwd host µs: {host_us(identity_fwd_bwd):.1f}")
    # Every operator's CPU time in both threads (the engine's device thread runs the backward).
    for name, fn in (("flashtile varlen fwd+bwd", fwd_bwd),
                     ("sdpa cudnn fwd+bwd", sdpa_fwd_bwd(SDPBackend.CUDNN_ATTENTION))):  # fmt: skip
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60
        )
        say(f"\n== torch.profiler, 20 calls of {name}, by self CPU time\n{table}")
    if args.out:
        args.out.write_text(report.getvalue())


if __name__ == "__main__":
    main()
