"""Tilings of the float8 forward (flashtile.fp8 on the portable Triton kernel), kernel time beside the bf16
call of the same shape.

Each cell (B·N = 16k tokens, H·D = 2048, as `flashtile bench --options fp8`) times
``kernels.fwd.attn_fwd`` on e4m3 inputs (descales of 1, V's host transpose included) with each listed
(BLOCK_M, BLOCK_N, warps, stages), and ``flash_attn_func`` on the bf16 inputs (the Hopper kernel), as
CUDA-graph replays of 20 calls, median of 7, every implementation once in turn over two rounds. The first
config of each head dim is the one the launcher picks today.

    PYTHONPATH=src python scripts/fp8_configs.py [--head-dims 64 128 256] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from flashtile import flash_attn_func
from flashtile.bench.decode import graph_time_ms
from flashtile.bench.results import append_rows
from flashtile.kernels import configs
from flashtile.kernels.fwd import attn_fwd

TOKENS, HIDDEN = 16384, 2048
CALLS, REPLAYS, ROUNDS = 20, 7, 2
CONFIGS = {
    64: [(128, 128, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 256, 8, 2), (64, 128, 4, 3)],
    128: [
        (128, 128, 8, 3),
        (128, 128, 4, 3),
        (128, 256, 8, 2),
        (128, 64, 8, 3),
        (128, 128, 8, 2),
        (64, 128, 4, 3),
    ],
    256: [(128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 2), (128, 64, 4, 2), (64, 64, 4, 3)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--csv")
    args = parser.parse_args()
    rows = []
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            batch, heads = TOKENS // seqlen, HIDDEN // head_dim
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda") for _ in range(3))
            q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
            qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
            descale = torch.ones(batch, heads, 3, device="cuda")
            for causal in (False, True):
                window = (-1, 0) if causal else (-1, -1)
                scale = head_dim**-0.5
                fns = {"bf16": lambda qb=qb, kb=kb, vb=vb, c=causal: flash_attn_func(qb, kb, vb, causal=c)}
                for cfg in CONFIGS[head_dim]:
                    tiling = configs.FwdConfig(*cfg)

                    def run(tiling=tiling, w=window, c=causal, t=(q8, k8, v8), d=descale, s=scale):
                        return attn_fwd(*t, s, c, window_size=w, descale=d, config=tiling)

                    try:
                        run()
                    except Exception as exc:  # a tiling past shared memory or registers
                        print(f"D={head_dim} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                        continue
                    fns["fp8 " + "/".join(map(str, cfg))] = run
                times: dict[str, list[float]] = {name: [] for name in fns}
                for r in range(ROUNDS):
                    for name in list(fns)[r % 2 :: 1] + list(fns)[: r % 2]:
                        times[name].append(graph_time_ms([fns[name]] * CALLS, reps=REPLAYS)[1])
                pairs = seqlen * (seqlen + 1) / 2 if causal else seqlen * seqlen
                work = 4.0 * batch * heads * head_dim * pairs
                for name, t in times.items():
                    ms = statistics.median(t)
                    tflops = work / ms / 1e9
                    label = f"D={head_dim} N={seqlen} causal={causal} {name:22s}"
                    print(f"{label} {ms:.4f} ms {tflops:.0f} TFLOP/s", flush=True)
                    rows.append(
                        dict(head_dim=head_dim, seqlen=seqlen, causal=causal, impl=name, ms=round(ms, 4),
                             tflops=round(tflops, 1))
                    )  # fmt: skip
    if args.csv and rows:
        append_rows(Path(args.csv), rows, list(rows[0]))


if __name__ == "__main__":
    main()
