"""One GPU run: does the split decode's speed at batch 1 and long caches depend on where its caches lie?

In the ninth session the whole `flashtile bench --decode` grid read 80.1 and 146.0 µs at 64k and 128k
(batch 1, GQA 4) where scripts/decode_stages_check.py had read 72.5 and 129.1 minutes before, cuDNN the same
in both. This times those two cells, flashtile then cuDNN, with the caches allocated three ways: fresh in a
new process, after a large allocation was freed (as after the grid's batch-256 cells), and shifted by a
small pad tensor; each with the caches' addresses modulo 2 MiB printed.

    PYTHONPATH=src python scripts/decode_two_speeds.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_check import HEAD_DIM, Problem

from flashtile.bench.decode import graph_time_ms
from flashtile.kernels.decode import decode_fwd


def time_cell(seqlen: int, how: str) -> None:
    keep = None
    if how == "after a freed 40 GiB block":
        big = torch.empty(40 << 30, dtype=torch.uint8, device="cuda")
        del big
    elif how == "shifted by 1 MiB":
        keep = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    problem = Problem(1, seqlen, 4)
    k, v = problem.caches[0][:2]
    where = f"k at {k.data_ptr() % (2 << 20):#x}, v at {v.data_ptr() % (2 << 20):#x} (mod 2 MiB)"

    def ours(i: int) -> torch.Tensor:
        kc, vc = problem.caches[i][:2]
        return decode_fwd(
            problem.q, kc, vc, problem.seqlens, softmax_scale=HEAD_DIM**-0.5, window_size=(-1, 0)
        )[0]

    def cudnn(i: int) -> torch.Tensor:
        return problem.sdpa(i, SDPBackend.CUDNN_ATTENTION)

    for name, fn in (("flashtile", ours), ("cudnn", cudnn)):
        p20, p50, p80 = graph_time_ms([lambda i=i, fn=fn: fn(i) for i in range(problem.copies)], reps=100)
        print(f"{seqlen // 1024}k {how:<28} {name:<9} p20 {p20 * 1e3:7.2f} p50 {p50 * 1e3:7.2f} "
              f"p80 {p80 * 1e3:7.2f} µs  {where}", flush=True)  # fmt: skip
    del keep


def main() -> int:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for how in ("fresh", "after a freed 40 GiB block", "shifted by 1 MiB", "fresh"):
        for seqlen in (65536, 131072):
            time_cell(seqlen, how)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
