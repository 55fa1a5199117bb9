"""Where the time of one flashtile call goes at short sequences: host overhead against kernel time, on a GPU.

For each cell it prints, for the forward (inputs requiring grad, as in training) and the forward + backward:
- host µs: wall clock of issuing one call, the GPU kept busy (the Python path, Triton's launch included);
- call ms: CUDA events around each call, as `flashtile bench` times it (host-bound when host > kernels);
- kernels ms: the GPU time of the kernels the call launches (torch.profiler).
With ``--peer``, SDPA's cuDNN backend is measured the same way on the same inputs, so each cell shows
whether flashtile trails it on the host or in the kernels.
The cells are `flashtile bench --paper`'s at N = 512, 1k, 2k (B·N = 16k tokens, H·D = 2048, bf16), and
one tiny shape where only the host counts. benchmarks/host_path.py breaks the host time down by layer on a
CPU. Compare two versions on one machine by running each with its own PYTHONPATH:

    PYTHONPATH=src python benchmarks/launch_overhead.py [--head-dim 64 128] [--csv out.csv --label after]
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention
from torch.profiler import ProfilerActivity, profile

from flashtile import flash_attn_func

TOKENS, HIDDEN = 16384, 2048


def per_call_event_ms(fn, reps: int = 30) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))[reps // 2]


def host_us(fn, reps: int = 20, repeats: int = 5) -> float:
    """Best of ``repeats`` means over ``reps`` calls issued back to back, before any synchronisation."""
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - begin) / reps * 1e6)
        torch.cuda.synchronize()
    return best


def kernel_times_us(fn, reps: int = 5, warmup: int = 1) -> dict[str, float]:
    """Mean µs a call of each kernel ``fn`` launches (torch.profiler; the name cut to 60 characters)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for ev in prof.key_averages():
        device_us = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if device_us:
            times[ev.key[:60]] = times.get(ev.key[:60], 0.0) + device_us / reps
    return times


def kernels_ms(fn, reps: int = 5) -> float:
    return sum(kernel_times_us(fn, reps).values()) / 1e3


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA's cuDNN backend on flash_attn's (B, N, H, D) layout, as `flashtile bench` calls it."""
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
        )
    return out.transpose(1, 2)


def measure(
    batch: int, seqlen: int, heads: int, head_dim: int, causal: bool, attention=None
) -> dict[str, float]:
    q, k, v, dout = (
        torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(True)
    attention = attention or (lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal))

    def fwd():
        return attention(q, k, v, causal)

    def fwd_bwd():
        return torch.autograd.grad(attention(q, k, v, causal), (q, k, v), dout)

    row: dict[str, float] = {}
    for name, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        row[f"{name}_host_us"] = host_us(fn)
        row[f"{name}_call_ms"] = per_call_event_ms(fn)
        row[f"{name}_kernels_ms"] = kernels_ms(fn)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[128])
    parser.add_argument("--seqlen", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--csv", help="append one row per cell to this CSV")
    parser.add_argument("--label", default="", help="a label for the CSV rows (e.g. the version)")
    parser.add_argument("--peer", action="store_true", help="also measure SDPA's cuDNN backend per cell")
    args = parser.parse_args()

    cells = [(1, 128, 1, 64, False)]
    for head_dim in args.head_dim:
        for seqlen in args.seqlen:
            for causal in (False, True):
                cells.append((TOKENS // seqlen, seqlen, HIDDEN // head_dim, head_dim, causal))
    print(f"{torch.cuda.get_device_name()}; flashtile from {os.environ.get('PYTHONPATH', '(installed)')}")
    print("  B     N   H    D causal | fwd: host µs  call ms  kernels ms | fwd+bwd: host µs  call ms "
          " kernels ms")  # fmt: skip
    impls = [("flashtile", None)] + ([("sdpa-cudnn", _cudnn)] if args.peer else [])
    rows = []
    for batch, seqlen, heads, head_dim, causal in cells:
        for impl, attention in impls:
            row = measure(batch, seqlen, heads, head_dim, causal, attention)
            print(
                f"{batch:3d} {seqlen:5d} {heads:3d} {head_dim:4d} {causal!s:>6} | "
                f"{row['fwd_host_us']:12.1f} {row['fwd_call_ms']:8.3f} {row['fwd_kernels_ms']:11.3f} | "
                f"{row['fwd_bwd_host_us']:16.1f} {row['fwd_bwd_call_ms']:8.3f} "
                f"{row['fwd_bwd_kernels_ms']:11.3f}  {impl}"
            )
            cell = dict(batch=batch, seqlen=seqlen, heads=heads, head_dim=head_dim, causal=causal)
            rows.append(dict(label=args.label, impl=impl, **cell, gpu=torch.cuda.get_device_name(), **row))
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
