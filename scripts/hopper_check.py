"""Correctness and speed of the Hopper (Gluon) forward, in one process, beside the portable Triton kernel and
SDPA's cuDNN backend.

Correctness: the Gluon forward against the float64 oracle under the 2× rule (odd lengths, GQA/MQA, causal
with N_q ≠ N_k, fully masked rows, NaN in another batch's and another head's K/V). Speed: bf16, B·N = 16k
tokens, H·D = 2048, D 64/128/256, N 1k/4k/16k, causal and not; TFLOP/s from triton.testing.do_bench's
median, cuDNN timed in the same process for the ratio.

    PYTHONPATH=src python scripts/hopper_check.py [--only correctness|timing] [--heads-dims 128]
"""

from __future__ import annotations

import argparse
import faulthandler
import itertools
import math
import sys
import time
from functools import partial

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from flashtile import flash_attn_func
from flashtile.backend import resolve
from flashtile.kernels import configs
from flashtile.kernels.fwd import attn_fwd as portable_fwd
from flashtile.kernels.hopper.fwd import attn_fwd as hopper_fwd
from flashtile.reference import naive
from flashtile.reference.compare import OUTPUT_FACTOR, compare

LAYOUTS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (3, 1)}
SEQLENS = [(1, 1), (17, 17), (113, 203), (203, 113), (255, 257), (128, 128), (1023, 1025)]


def _check(name: str, ours: torch.Tensor, oracle: torch.Tensor, baseline: torch.Tensor) -> bool:
    result = compare(name, ours, oracle, baseline, OUTPUT_FACTOR)
    if not result.passed:
        print(f"    {result}", flush=True)
    return result.passed


def _oracle_case(q, k, v, causal) -> bool:
    scale = q.shape[-1] ** -0.5
    out, lse = hopper_fwd(q, k, v, scale, causal)
    ref_out, ref_lse = naive.attention(*(t.double() for t in (q, k, v)), softmax_scale=scale, causal=causal)
    base_out, base_lse = naive.attention(q, k, v, softmax_scale=scale, causal=causal)
    return _check("out", out, ref_out, base_out) & _check("lse", lse, ref_lse, base_lse)


def correctness(head_dims: list[int]) -> bool:
    torch.manual_seed(0)
    ok = True
    layouts = itertools.cycle(LAYOUTS)
    cases = itertools.product(head_dims, (torch.bfloat16, torch.float16), (False, True), SEQLENS)
    for d, dtype, causal, (sq, sk) in cases:
        layout = next(layouts)
        h, h_kv = LAYOUTS[layout]
        batch = 2
        q = torch.randn(batch, sq, h, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(batch, sk, h_kv, d, dtype=dtype, device="cuda") for _ in range(2))
        t0 = time.perf_counter()
        passed = _oracle_case(q, k, v, causal)
        ok &= passed
        dt = time.perf_counter() - t0
        print(f"  d{d} {dtype} {'causal' if causal else 'full'} {sq}x{sk} {layout}: "
              f"{'ok' if passed else 'FAIL'} ({dt:.1f} s)", flush=True)  # fmt: skip

    for d in head_dims:
        # Causal with N_q > N_k: the first N_q − N_k rows see no key (out 0, lse −inf).
        q = torch.randn(1, 300, 2, d, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(1, 100, 2, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        out, lse = hopper_fwd(q, k, v, 0.1, True)
        masked = bool(torch.equal(out[:, :200], torch.zeros_like(out[:, :200])))
        masked &= bool(torch.isneginf(lse[:, :, :200]).all()) and bool(torch.isfinite(lse[:, :, 200:]).all())
        ok &= masked
        print(f"  d{d} fully masked rows: {'ok' if masked else 'FAIL'}", flush=True)

        # NaN in batch 1's K/V and in KV head 1 must not reach batch 0 / the query heads of KV head 0.
        q = torch.randn(2, 100, 4, d, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(2, 77, 2, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        k[1], v[1] = float("nan"), float("nan")
        k[0, :, 1], v[0, :, 1] = float("nan"), float("nan")
        out, lse = hopper_fwd(q, k, v, d**-0.5, False)
        clean = (q[:1, :, :2], k[:1, :, :1], v[:1, :, :1])
        ref_out, ref_lse = naive.attention(*(t.double() for t in clean))
        base_out, base_lse = naive.attention(*clean)
        leak = _check("out", out[:1, :, :2], ref_out, base_out)
        leak &= _check("lse", lse[:1, :2], ref_lse, base_lse)
        ok &= leak
        print(f"  d{d} NaN in another batch / head: {'ok' if leak else 'FAIL'}", flush=True)

    # The public API picks the Hopper backend on this device.
    print(f"  auto backend on this device: {resolve(torch.device('cuda'))}", flush=True)
    q = torch.randn(2, 333, 8, 128, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 444, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    api = flash_attn_func(q, k, v, causal=True)
    ref, _ = naive.attention(q.double(), k.double(), v.double(), causal=True)
    base, _ = naive.attention(q, k, v, causal=True)
    ok &= _check("api out", api, ref, base)
    return ok


def _tflops(batch: int, heads: int, n: int, d: int, causal: bool, ms: float) -> float:
    flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    return flops / ms / 1e9


def _cudnn(q, k, v, causal, scale):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _time_shape(d: int, n: int, causal: bool) -> None:
    heads, batch = 2048 // d, 16384 // n
    q, k, v = (torch.randn(batch, n, heads, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    scale = d**-0.5
    # cuDNN reads the same memory through (B, H, N, D) views, as a flash_attn-layout caller would pass it.
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    impls = {
        "cudnn": partial(_cudnn, qt, kt, vt, causal, scale),
        "hopper": partial(hopper_fwd, q, k, v, scale, causal),
        "api": partial(flash_attn_func, q, k, v, causal=causal),
        "portable": partial(portable_fwd, q, k, v, scale, causal),
    }
    if d <= 128:
        three = configs.HopperFwdConfig(BLOCK_N=128, STAGES=3)
        impls["hopper_3stages"] = partial(hopper_fwd, q, k, v, scale, causal, config=three)
    if d == 128:
        narrow = configs.HopperFwdConfig(BLOCK_N=64, STAGES=2)
        impls["hopper_bn64"] = partial(hopper_fwd, q, k, v, scale, causal, config=narrow)
    ref = None
    for name, fn in impls.items():
        try:
            ms = triton.testing.do_bench(fn, warmup=25, rep=100)
        except Exception as error:  # a peer that cannot run this shape is reported, not fatal
            print(f"{name},{d},{n},{causal},error: {str(error)[:200]}", flush=True)
            continue
        ref = ms if name == "cudnn" else ref
        ratio = ref / ms if ref else math.nan
        tflops = _tflops(batch, heads, n, d, causal, ms)
        print(f"{name},{d},{n},{causal},{ms:.4f},{tflops:.1f},{ratio:.3f}", flush=True)
    out_h, _ = hopper_fwd(q[:1], k[:1], v[:1], scale, causal)
    out_c = _cudnn(qt[:1], kt[:1], vt[:1], causal, scale)
    diff = (out_h.float() - out_c.transpose(1, 2).float()).abs().max().item()
    print(f"# max|hopper - cudnn| d{d} n{n} causal={causal}: {diff:.3e}", flush=True)


def timing(head_dims: list[int]) -> None:
    print("impl,d,n,causal,ms,tflops,ratio_vs_cudnn", flush=True)
    for d, n, causal in itertools.product(head_dims, (1024, 4096, 16384), (False, True)):
        _time_shape(d, n, causal)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["correctness", "timing"])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--watchdog-s", type=float, default=0, help="dump stacks and exit after this long")
    args = parser.parse_args()
    if args.watchdog_s:
        faulthandler.dump_traceback_later(args.watchdog_s, exit=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    ok = True
    if args.only != "timing":
        t0 = time.perf_counter()
        ok = correctness(args.head_dims)
        print(f"correctness: {'PASS' if ok else 'FAIL'} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.only != "correctness":
        timing(args.head_dims)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
