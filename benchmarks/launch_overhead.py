"""Where the time of one flashtile call goes at short sequences: host overhead against kernel time.

For each shape it prints the per-call time as `flashtile bench` measures it (CUDA events around each call),
the host time of one call (wall clock, the GPU kept busy), and the GPU time of each kernel the call launches
(torch.profiler). PYTHONPATH=src python benchmarks/launch_overhead.py
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from flashtile import flash_attn_func

SHAPES = [
    # (batch, seqlen, heads, head_dim, causal)
    (32, 512, 16, 128, False),
    (32, 512, 16, 128, True),
    (4, 4096, 16, 128, True),
    (1, 128, 1, 64, False),
]


def per_call_event_ms(fn, reps=50):
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


def host_ms(fn, reps=50):
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(reps):
        fn()
    mid = time.perf_counter()
    torch.cuda.synchronize()
    return 1e3 * (mid - begin) / reps


def kernel_table(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        total = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
        if total > 0 and ev.count >= reps:
            rows.append((ev.key[:60], ev.count // reps, total / reps / 1e3))
    return sorted(rows, key=lambda r: -r[2])


def measure(batch: int, seqlen: int, heads: int, head_dim: int, causal: bool) -> None:
    q, k, v, dout = (
        torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flash_attn_func(q, k, v, causal=causal)
    fns = {
        "fwd": lambda: flash_attn_func(q, k, v, causal=causal),
        "fwd no-grad": lambda: flash_attn_func(q.detach(), k.detach(), v.detach(), causal=causal),
        "bwd": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
    }
    print(f"\nB={batch} N={seqlen} H={heads} D={head_dim} causal={causal}")
    for name, fn in fns.items():
        ev = per_call_event_ms(fn)
        host = host_ms(fn)
        kernels = kernel_table(fn)
        gpu = sum(r[2] for r in kernels)
        print(f"  {name:12s} event {ev:7.3f} ms  host {host:7.3f} ms  kernels {gpu:7.3f} ms")
        for key, count, ms in kernels[:6]:
            print(f"      {ms:7.3f} ms  x{count}  {key}")


for shape in SHAPES:
    measure(*shape)
