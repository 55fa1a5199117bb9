"""Where the host time of a dense call's backward goes, on a GPU: one `flashtile bench --paper` cell.

Prints host µs (calls issued back to back, the GPU kept busy), per-call ms (CUDA events, as `flashtile
bench` times a call) and kernel ms (the profiler) for flashtile's forward (inputs requiring grad), its
backward alone (``torch.autograd.grad`` on a kept graph, as the bench times it; in autograd's device thread,
PyTorch's default, and on the calling thread), the forward + backward, and the backend's backward called
directly; the same for SDPA's cuDNN backend. Then a cProfile of the backward (or, with ``--profile fwd``,
the forward) on the calling thread.

    PYTHONPATH=src python scripts/host_profile_dense.py [--batch 32 --seqlen 512 --heads 16 --head-dim 128]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from launch_overhead import host_us, kernels_ms, per_call_event_ms

import flashtile
from flashtile import flash_attn_func, ops


def caller_thread(fn):
    """``fn`` with the backward on the calling thread (no autograd device thread)."""

    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return fn()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--window", type=int, nargs=2, default=(-1, -1))
    parser.add_argument(
        "--cpus",
        type=int,
        nargs="+",
        help="pin the process to these CPUs before the first backward (autograd's device thread, started "
        "then, inherits the set): whether the device thread's slower Python is its wake-up on another core",
    )
    parser.add_argument(
        "--profile", choices=("fwd", "bwd"), default="bwd", help="which call the cProfile runs (100 calls)"
    )
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, set(args.cpus))
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    window = tuple(args.window)

    def attention(q, k, v):
        return flash_attn_func(q, k, v, causal=args.causal, window_size=window)

    kept = attention(q, k, v)

    def fwd():
        return attention(q, k, v)

    def bwd():
        return torch.autograd.grad(kept, (q, k, v), dout, retain_graph=True)

    def fwd_bwd():
        return torch.autograd.grad(attention(q, k, v), (q, k, v), dout)

    qd, kd, vd = (t.detach() for t in (q, k, v))
    scale = args.head_dim**-0.5
    left, right = (window[0], 0) if args.causal else window
    out, lse = ops.run_attn_fwd(qd, kd, vd, scale, args.causal, "hopper", left, right)

    def bwd_direct():
        return ops.run_attn_bwd(dout, qd, kd, vd, out, lse, scale, args.causal, "hopper", left, right)

    qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_(True) for t in (q, k, v))
    douts = dout.transpose(1, 2)

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=args.causal)

    sdpa_kept = sdpa(qs, ks, vs)
    rows = [
        ("flashtile fwd (grad)", fwd),
        ("flashtile bwd (engine thread)", bwd),
        ("flashtile bwd (calling thread)", caller_thread(bwd)),
        ("flashtile fwd+bwd (engine thread)", fwd_bwd),
        ("flashtile fwd+bwd (calling thread)", caller_thread(fwd_bwd)),
        ("flashtile ops.run_attn_bwd", bwd_direct),
        ("sdpa cudnn fwd (grad)", lambda: sdpa(qs, ks, vs)),
        ("sdpa cudnn bwd", lambda: torch.autograd.grad(sdpa_kept, (qs, ks, vs), douts, retain_graph=True)),
        ("sdpa cudnn fwd+bwd", lambda: torch.autograd.grad(sdpa(qs, ks, vs), (qs, ks, vs), douts)),
    ]
    print(
        f"{torch.cuda.get_device_name()}; flashtile from {Path(flashtile.__file__).parent}; B={args.batch} "
        f"N={args.seqlen} H={args.heads} D={args.head_dim} bf16 causal={args.causal} window={window} "
        f"cpus={sorted(os.sched_getaffinity(0))}"
    )
    print(f"{'call':36s} {'host µs':>9s} {'call ms':>8s} {'kernels ms':>11s}")
    for name, fn in rows:
        for _ in range(5):
            fn()
        times = f"{host_us(fn):9.1f} {per_call_event_ms(fn):8.3f} {kernels_ms(fn):11.3f}"
        print(f"{name:36s} {times}", flush=True)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiled = fwd if args.profile == "fwd" else bwd
    with torch.autograd.set_multithreading_enabled(False):
        profiler.enable()
        for _ in range(100):
            profiled()
        profiler.disable()
    torch.cuda.synchronize()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(35)
        title = f"cProfile of 100 {args.profile} calls on the calling thread, by {order}"
        print(f"\n== {title}\n{text.getvalue()}")


if __name__ == "__main__":
    main()
