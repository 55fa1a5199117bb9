"""One GPU run: where a batch-1 decode step's time goes, kernel by kernel (torch.profiler), for flashtile's
split kernel and combine and for SDPA cuDNN, at GQA 1, 4 and 8 and caches of 4k to 64k.

    PYTHONPATH=src python scripts/decode_profile.py [--steps 50] [--rounds 3]

Each implementation runs ``steps`` eager calls (after a warm-up) under the profiler; the table gives each
kernel's mean device time a call. Eager launches leave gaps between kernels that CUDA graphs close: the
sum here is the kernels' time, not a step's; a step's time in a CUDA graph follows. With programmatic
dependent launch the combine starts while the split kernel runs, so its kernel time includes the wait: the
variant without it shows the combine's own time; ``FLASHTILE_DECODE_PDL=1`` forces it (the TMA split
kernel's default is without). In s16g (at 4221b1b) a third variant released the combine's launch after
the TMA kernel's key loop rather than at its start: no better than none (docs/design/decode.md, "Combine").
The graph timings run the variants in turn, ``rounds`` times (their medians).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_check import Problem

from flashtile.kernels.decode import PDL_ENV


def kernel_times(fn, steps: int) -> dict[str, float]:
    """Mean device µs a call of each kernel ``fn`` launches."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name[:70]] += event.device_time / steps
    return dict(total)


def _pdl(problem: Problem, setting: str, i: int = 0) -> torch.Tensor:
    """The step with FLASHTILE_DECODE_PDL=``setting``: "0" launches the combine after the split kernel ends
    (its kernel time is then its own, not the split kernel's remainder as well), "1" by programmatic
    dependent launch (the TMA kernel's default is without since the sixteenth session; the portable
    kernel's with)."""
    os.environ[PDL_ENV] = setting
    try:
        return problem.ours(i)
    finally:
        os.environ.pop(PDL_ENV)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="graph timings, the calls in turn")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for group, seqlen in ((1, 4096), (1, 16384), (1, 65536), (4, 4096), (4, 16384), (8, 16384)):
        problem = Problem(1, seqlen, group)
        calls = (
            ("flashtile", problem.ours),
            ("flashtile without PDL", functools.partial(_pdl, problem, "0")),
            ("flashtile with PDL", functools.partial(_pdl, problem, "1")),
            ("sdpa cudnn", functools.partial(problem.sdpa, backend=SDPBackend.CUDNN_ATTENTION)),
        )
        for name, fn in calls:
            times = kernel_times(functools.partial(fn, 0), args.steps)
            for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"{problem.label()},{name},{kernel},{us:.2f}", flush=True)
            print(f"## {problem.label()} {name}: {sum(times.values()):.2f} µs of kernels a call", flush=True)
        p50s = problem.time_rounds(dict(calls), args.rounds, 50)
        for name, times in p50s.items():
            ms = statistics.median(times)
            print(f"## {problem.label()} {name}: {ms * 1e3:.2f} µs a step in a CUDA graph", flush=True)
        problem = calls = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
