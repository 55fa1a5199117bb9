"""Correctness and speed of the Hopper (Gluon) backward, in one process on one H100/H200.

Correctness: gradients against the float64 oracle under the 3× rule (odd lengths, GQA/MQA, causal with
N_q ≠ N_k, fully masked rows), no NaN crossing from another batch or head, and ``deterministic=True``
bitwise stable over 50 runs. Speed: TFLOP/s (backward FLOPs = 2.5 · 4·B·H·N²·D, halved when causal) of
this backward, the portable Triton backward and SDPA's cuDNN backward, bf16, B·N = 16k, H·D = 2048.

    PYTHONPATH=src python scripts/hopper_bwd_check.py [--skip-correctness] [--skip-timing]
"""

from __future__ import annotations

import argparse
import traceback

import torch
import triton

from flashtile.kernels import bwd as portable_bwd
from flashtile.kernels import fwd as portable_fwd
from flashtile.kernels.hopper import bwd as hopper_bwd
from flashtile.reference import naive
from flashtile.reference.compare import GRAD_FACTOR, compare

CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, dtype)
    (2, 113, 203, 4, 2, 64, True, torch.bfloat16),
    (2, 203, 113, 4, 2, 128, True, torch.float16),
    (1, 1025, 1023, 4, 1, 128, False, torch.bfloat16),
    (3, 77, 77, 6, 3, 64, False, torch.float16),
    (2, 256, 256, 2, 2, 128, True, torch.bfloat16),
    (1, 1, 1, 2, 2, 128, True, torch.bfloat16),
    (1, 300, 1000, 8, 2, 128, True, torch.bfloat16),
    (2, 1000, 130, 2, 1, 64, True, torch.bfloat16),
]


def _inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    dout = torch.randn_like(q)
    return q, k, v, dout


def _forward(q, k, v, causal):
    scale = q.shape[-1] ** -0.5
    window = (-1, 0) if causal else (-1, -1)
    out, lse = portable_fwd.attn_fwd(q, k, v, scale, causal, window_size=window)
    return out, lse, scale


def _oracle_grads(q, k, v, dout, causal, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = naive.attention(*leaves, causal=causal)
    out.backward(dout.to(dtype))
    return [t.grad for t in leaves]


def check_case(case, deterministic: bool) -> bool:
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, dtype = case
    q, k, v, dout = _inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype)
    out, lse, scale = _forward(q, k, v, causal)
    grads = hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
    oracle = _oracle_grads(q, k, v, dout, causal, torch.float64)
    baseline = _oracle_grads(q, k, v, dout, causal, dtype)
    ok = True
    for name, ours, ref, base in zip(("dq", "dk", "dv"), grads, oracle, baseline, strict=True):
        result = compare(name, ours, ref, base, GRAD_FACTOR)
        ok &= result.passed
        print(f"  {case} det={deterministic} {result}")
    return ok


def check_no_leak() -> bool:
    """NaN in another batch and in another head of the same batch must not reach batch 0, head 0."""
    ok = True
    for head_dim in (64, 128):
        for causal in (False, True):
            for deterministic in (False, True):
                q, k, v, dout = _inputs(3, 97, 75, 2, 2, head_dim, torch.bfloat16)
                out, lse, scale = _forward(q, k, v, causal)
                for t in (q, k, v, dout, out):
                    t[1:] = float("nan")
                    t[0, :, 1] = float("nan")
                lse[1:] = float("nan")
                lse[0, 1] = float("nan")
                grads = hopper_bwd.attn_bwd(
                    dout, q, k, v, out, lse, scale, causal, deterministic=deterministic
                )
                sel = [g[:1, :, :1] for g in grads]
                oracle = _oracle_grads(*(t[:1, :, :1] for t in (q, k, v, dout)), causal, torch.float64)
                base = _oracle_grads(*(t[:1, :, :1] for t in (q, k, v, dout)), causal, torch.bfloat16)
                for name, ours, ref, b in zip(("dq", "dk", "dv"), sel, oracle, base, strict=True):
                    result = compare(name, ours, ref, b, GRAD_FACTOR)
                    ok &= result.passed
                    print(f"  leak D={head_dim} causal={causal} det={deterministic} {result}")
    return ok


def check_deterministic(runs: int = 50) -> bool:
    q, k, v, dout = _inputs(2, 1000, 1100, 8, 2, 128, torch.bfloat16)
    out, lse, scale = _forward(q, k, v, True)
    first = hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, True, deterministic=True)
    same = all(
        all(torch.equal(a, b) for a, b in zip(first, hopper_bwd.attn_bwd(
            dout, q, k, v, out, lse, scale, True, deterministic=True), strict=True))
        for _ in range(runs - 1)
    )  # fmt: skip
    print(f"  deterministic=True bitwise equal over {runs} runs: {same}")
    return same


def _tflops(batch, seqlen, heads, head_dim, causal, ms):
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops / ms * 1e-9


def _bench(fn) -> float:
    try:
        return triton.testing.do_bench(fn)
    except Exception:
        traceback.print_exc()
        return float("nan")


def time_cell(head_dim: int, seqlen: int, causal: bool) -> list[float]:
    """TFLOP/s of this backward, the portable one and cuDNN's at one cell of the grid."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads = 16384 // seqlen, 2048 // head_dim
    q, k, v, dout = _inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
    out, lse, scale = _forward(q, k, v, causal)
    window = (-1, 0) if causal else (-1, -1)
    times = [
        _bench(lambda: hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal)),
        _bench(lambda: portable_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal, window_size=window)),
    ]
    qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dt = dout.transpose(1, 2).contiguous()
        times.append(_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)))
    return [_tflops(batch, seqlen, heads, head_dim, causal, ms) for ms in times]


def time_grid() -> None:
    print("D,N,causal,hopper_tflops,portable_tflops,cudnn_tflops,hopper/cudnn")
    for head_dim in (64, 128):
        for seqlen in (1024, 4096, 16384):
            for causal in (False, True):
                row = time_cell(head_dim, seqlen, causal)
                cells = ",".join(f"{x:.1f}" for x in row)
                print(f"{head_dim},{seqlen},{causal},{cells},{row[0] / row[2]:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    if not args.skip_correctness:
        results = {}
        for name, fn in (
            ("cases", lambda: all([check_case(c, d) for c in CASES for d in (False, True)])),
            ("no_leak", check_no_leak),
            ("deterministic", check_deterministic),
        ):
            try:
                results[name] = fn()
            except Exception:
                traceback.print_exc()
                results[name] = False
        print("CORRECTNESS", results)
    if not args.skip_timing:
        time_grid()


if __name__ == "__main__":
    main()
