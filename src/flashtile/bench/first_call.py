"""The child process of ``flashtile bench --masks``' first-call measurement.

``python -m flashtile.bench.first_call IMPL CASE SEQLEN [--heads 16] [--device cuda]`` times one new
mask's first training step with ``IMPL`` ("flashtile" or "flex") on ``CASE`` (:mod:`flashtile.bench.masks`):
building the block mask, the forward and the backward, compilation included, then the same step again. The
parent starts it with empty ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR``. The imports (torch,
Triton, flashtile and its backends and, for Flex, Dynamo and Inductor), the inputs and the CUDA context come
before the clock starts: a process pays them once whatever the mask. Prints one JSON line: ``mask_s``,
``forward_s``, ``backward_s``, ``warm_s``.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import time
from collections.abc import Sequence

import torch

from flashtile import backend
from flashtile.bench import masks


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_step(impl: str, case: str, seqlen: int, heads: int, device: torch.device) -> dict[str, float]:
    """Seconds of the block mask, first forward and first backward of ``impl`` on ``case``, and of the next
    forward + backward."""
    if impl == "flex":
        for module in ("torch._dynamo", "torch._inductor.compile_fx", "torch.nn.attention.flex_attention"):
            importlib.import_module(module)
    else:
        for name in backend.available_backends(device):
            backend.module(name)
    shape = (1, seqlen, heads, masks.HEAD_DIM)
    q, k, v = (torch.randn(shape, device=device, dtype=masks.DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=masks.DTYPE)
    _sync(device)
    marks = [time.perf_counter()]
    fn = masks.implementation(impl, case, seqlen, device)
    _sync(device)
    marks.append(time.perf_counter())
    for _ in range(2):
        out = fn(q, k, v)
        _sync(device)
        marks.append(time.perf_counter())
        torch.autograd.grad(out, (q, k, v), dout)
        _sync(device)
        marks.append(time.perf_counter())
    steps = [b - a for a, b in itertools.pairwise(marks)]
    return {
        "mask_s": steps[0],
        "forward_s": steps[1],
        "backward_s": steps[2],
        "warm_s": steps[3] + steps[4],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench.first_call", description=__doc__)
    parser.add_argument("impl", choices=("flashtile", "flex"))
    parser.add_argument("case", choices=masks.CASES)
    parser.add_argument("seqlen", type=int)
    parser.add_argument("--heads", type=int, default=masks.HEADS)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        # The CUDA context is created here, before the clock.
        torch.zeros(1, device=device)
    print(json.dumps(first_step(args.impl, args.case, args.seqlen, args.heads, device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
