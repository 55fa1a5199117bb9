"""Where the packed (varlen) backward loses against the dense one, on one H100/H200: kernel times.

The `bench --options varlen` cell (4 documents of 7384, 2976, 1258 and 4766 tokens) reads 0.80 of the dense
causal backward at 8k. This times, kernel by kernel, the backward of:

- dense causal batches and packed batches of the same equal lengths (the same work: any difference is the
  packed kernel's own cost: its masked epilogue, its row statistics loaded by pointer, its sequence bounds);
- the bench's four documents packed, and each document alone as a dense batch of one (the sum of the four is
  what the packed batch would cost at dense speed per length);

bf16, D = 128, H = 16, causal, the backward through ``ops.run_attn_bwd`` (no autograd engine, no forward).
TFLOP/s count 2.5 · 4 · H · D · Σ n² / 2 FLOPs, as the bench does. Rows go to --csv.

    PYTHONPATH=src python scripts/varlen_bwd_gap.py [--csv varlen_gap.csv] [--label new] [--reps 10]
        [--cases 4x4096]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from launch_overhead import kernel_times_us

from flashtile import ops
from flashtile.bench.results import append_rows

HEADS, HEAD_DIM = 16, 128
BENCH_DOCS = (7384, 2976, 1258, 4766)
# (name, lengths, packed): a dense batch needs equal lengths.
CASES = (
    ("dense 4x4096", (4096,) * 4, False),
    ("packed 4x4096", (4096,) * 4, True),
    ("dense 2x8192", (8192,) * 2, False),
    ("packed 2x8192", (8192,) * 2, True),
    ("packed bench docs", BENCH_DOCS, True),
    *((f"dense 1x{n}", (n,), False) for n in BENCH_DOCS),
)


def _inputs(lengths: tuple[int, ...], packed: bool):
    total = sum(lengths)
    shape = (total, HEADS, HEAD_DIM) if packed else (len(lengths), lengths[0], HEADS, HEAD_DIM)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = HEAD_DIM**-0.5
    if not packed:
        out, lse = ops.run_attn_fwd(q, k, v, scale, True, "hopper", -1, 0)
        return lambda: ops.run_attn_bwd(dout, q, k, v, out, lse, scale, True, "hopper", -1, 0)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
    out, lse = ops.run_attn_fwd(q, k, v, scale, True, "hopper", -1, 0, **varlen)
    return lambda: ops.run_attn_bwd(dout, q, k, v, out, lse, scale, True, "hopper", -1, 0, **varlen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default="varlen_gap.csv")
    parser.add_argument("--label", default="")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--cases", nargs="*", help="only the cases whose name holds one of these words")
    parser.add_argument(
        "--no-profiler", action="store_true", help="run each case 3 times without timing (under ncu)"
    )
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name()
    knob = os.environ.get("FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE", "")
    print(f"{gpu}; label {args.label!r}; VARLEN_TMA_STORE={knob!r}")
    rows = []
    for name, lengths, packed in CASES:
        if args.cases and not any(word in name for word in args.cases):
            continue
        if args.no_profiler:
            fn = _inputs(lengths, packed)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            continue
        times = kernel_times_us(_inputs(lengths, packed), args.reps, warmup=3)
        total = sum(times.values())
        flops = 2.5 * 4 * HEADS * HEAD_DIM * sum(n * n for n in lengths) / 2
        print(f"{name:20s} {total:9.1f} µs  {flops / total / 1e6:6.1f} TFLOP/s")
        for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"    {us:9.1f} µs  {kernel}")
            rows.append(dict(label=args.label, gpu=gpu, case=name, kernel=kernel, us=round(us, 2)))
        rows.append(dict(label=args.label, gpu=gpu, case=name, kernel="total", us=round(total, 2)))
        torch.cuda.empty_cache()
    if rows:
        append_rows(Path(args.csv), rows, list(rows[0]))


if __name__ == "__main__":
    main()
