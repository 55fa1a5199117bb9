"""Host µs a call of the Gluon launchers and the API on a GPU, at a tiny shape (the kernels take a few µs,
so calls never wait for the GPU): best of seven means of ``--reps`` calls, wall time. Run it with one
version's ``PYTHONPATH`` after another, alternating, on one machine (docs/design/host_path.md); its rows
say which ``flashtile`` they timed.

    PYTHONPATH=src python scripts/host_launchers_gpu.py --label new --csv host_launchers.csv
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
from launch_overhead import host_us

import flashtile
from flashtile import flash_attn_func
from flashtile.bench import results as results_csv
from flashtile.kernels.hopper import bwd as hopper_bwd
from flashtile.kernels.hopper import fwd as hopper_fwd

COLUMNS = ("label", "call", "host_us")


def per_call_us(fn, reps: int, repeats: int = 7) -> float:
    """After 50 warm-up calls, the best of ``repeats`` means of ``reps`` calls, wall time, the GPU drained
    before each mean (launch_overhead.host_us)."""
    for _ in range(50):
        fn()
    return host_us(fn, reps, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=500)
    parser.add_argument("--label", default="")
    parser.add_argument("--csv", help="append one row per measurement to this CSV")
    args = parser.parse_args()
    batch, seqlen, heads, head_dim = 1, 128, 2, 128
    dev, dtype = "cuda", torch.bfloat16
    q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device=dev, dtype=dtype) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    scale = head_dim**-0.5
    out, lse = hopper_fwd.attn_fwd(q, k, v, scale, False)
    graph_out = flash_attn_func(qg, kg, vg)
    rows = {
        "kernels.hopper.fwd.attn_fwd": lambda: hopper_fwd.attn_fwd(q, k, v, scale, False),
        "kernels.hopper.bwd (3 launches)": lambda: hopper_bwd._launch(
            dout, q, k, v, out, lse, scale, False, False
        ),
        "flash_attn_func, no grad": lambda: flash_attn_func(q, k, v),
        "flash_attn_func, inputs requiring grad": lambda: flash_attn_func(qg, kg, vg),
        "backward (torch.autograd.grad)": lambda: torch.autograd.grad(
            graph_out, (qg, kg, vg), dout, retain_graph=True
        ),
    }
    where = os.path.dirname(os.path.dirname(flashtile.__file__))
    shape = f"B={batch} N={seqlen} H={heads} D={head_dim}"
    print(f"{torch.cuda.get_device_name()}; flashtile from {where}; {shape}")
    results = []
    for name, fn in rows.items():
        us = per_call_us(fn, args.reps)
        print(f"  {name:40s} {us:7.1f} µs")
        results.append({"label": args.label, "call": name, "host_us": round(us, 2)})
    if args.csv:
        results_csv.append_rows(pathlib.Path(args.csv), results, COLUMNS)


if __name__ == "__main__":
    main()
