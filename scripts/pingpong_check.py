"""The Gluon forward with its consumers' wgmmas in turn (ping-pong) and without, kernel time only.

Each cell (bf16, B·N = 16k tokens, H·D = 2048, as `flashtile bench --options`: softcap 30, ALiBi with
(H,) slopes, dropout 0.1, or none) runs the Hopper launcher with FLASHTILE_HOPPER_FWD_PINGPONG=0 and =1.
Their outputs and LSEs must be bitwise equal (ping-pong changes when a warpgroup issues its wgmmas, not
what it computes). Time is CUDA-graph replays of 20 back-to-back calls (no host path), median of 7
replays, the two variants alternating over ``--rounds`` rounds, each variant's median round reported.

    PYTHONPATH=src python scripts/pingpong_check.py [--head-dims 128] [--seqlens 4096 16384] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch

from flashtile.bench.decode import graph_time_ms
from flashtile.bench.results import append_rows
from flashtile.kernels.hopper.fwd import PINGPONG_ENV
from flashtile.kernels.hopper.fwd import attn_fwd as hopper_fwd

TOKENS, HIDDEN = 16384, 2048
CALLS, REPLAYS = 20, 7
OPTIONS = ("plain", "softcap", "alibi", "dropout")


def call(q, k, v, option: str, causal: bool, pingpong: str):
    """One forward of ``option`` with the ping-pong knob at ``pingpong`` ("0" or "1"; the knob is read at
    each launch, so the graph captures the launch it picked)."""
    heads = q.shape[2]
    extra: dict[str, object] = {}
    if option == "softcap":
        extra["softcap"] = 30.0
    elif option == "alibi":
        extra["alibi_slopes"] = torch.linspace(0.01, 0.5, heads, device=q.device, dtype=torch.float32)
    elif option == "dropout":
        extra["dropout_p"] = 0.1
        extra["rng_state"] = torch.tensor([1234, 0], device=q.device, dtype=torch.int64)
    window = (-1, 0) if causal else (-1, -1)

    def run():
        os.environ[PINGPONG_ENV] = pingpong
        return hopper_fwd(q, k, v, q.shape[-1] ** -0.5, causal, window_size=window, **extra)

    return run


def flops(batch: int, seqlen: int, heads: int, head_dim: int, causal: bool) -> float:
    pairs = seqlen * (seqlen + 1) / 2 if causal else seqlen * seqlen
    return 4.0 * batch * heads * head_dim * pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--options", nargs="+", choices=OPTIONS, default=list(OPTIONS))
    parser.add_argument("--causal", choices=("true", "false", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--csv", help="append one row per cell and variant to this CSV")
    args = parser.parse_args()
    causals = {"true": [True], "false": [False], "both": [False, True]}[args.causal]
    rows = []
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            batch, heads = TOKENS // seqlen, HIDDEN // head_dim
            gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
            q, k, v = (
                torch.randn(
                    batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen
                )
                for _ in range(3)
            )
            for causal in causals:
                for option in args.options:
                    fns = {p: call(q, k, v, option, causal, p) for p in ("0", "1")}
                    (out0, lse0), (out1, lse1) = fns["0"](), fns["1"]()
                    equal = torch.equal(out0, out1) and torch.equal(lse0, lse1)
                    times: dict[str, list[float]] = {"0": [], "1": []}
                    for r in range(args.rounds):
                        for p in ("0", "1") if r % 2 == 0 else ("1", "0"):
                            times[p].append(graph_time_ms([fns[p]] * CALLS, reps=REPLAYS)[1])
                    work = flops(batch, seqlen, heads, head_dim, causal)
                    ms = {p: statistics.median(t) for p, t in times.items()}
                    for p in ("0", "1"):
                        rows.append(
                            dict(
                                head_dim=head_dim,
                                seqlen=seqlen,
                                causal=causal,
                                option=option,
                                pingpong=p,
                                ms=round(ms[p], 4),
                                tflops=round(work / ms[p] / 1e9, 1),
                                bitwise_equal=equal,
                                rounds=" ".join(f"{t:.4f}" for t in times[p]),
                            )
                        )
                    print(
                        f"D={head_dim} N={seqlen} causal={causal} {option:8s} off {ms['0']:.4f} ms "
                        f"({work / ms['0'] / 1e9:.0f} TFLOP/s)  on {ms['1']:.4f} ms "
                        f"({work / ms['1'] / 1e9:.0f})  on/off speed {ms['0'] / ms['1']:.3f}  equal={equal}",
                        flush=True,
                    )
    os.environ.pop(PINGPONG_ENV, None)
    if args.csv and rows:
        append_rows(Path(args.csv), rows, list(rows[0]))


if __name__ == "__main__":
    main()
