"""The float8 forward (flashtile.fp8) against the float64 oracle on the dequantised inputs.

The low-precision baseline of the 2× rule is PyTorch computing the same quantised problem: for the output,
the dequantised inputs in float32, P rounded to float8 e4m3 relative to its row's max (the kernel rounds
each tile's P against the running max before its product with V), the output rounded to bfloat16
(``flashtile.fp8.rounded_like_the_kernel``); for the LSE, bf16 attention of the dequantised inputs. On the
CPU the Triton forward runs in the interpreter (float8 tiles upcast: its float8 rounding is broken, so P
stays fp32 there) and the reference backend in PyTorch; the GPU cases (``-m gpu``) run the float8 kernel.
"""

from __future__ import annotations

import re

import pytest
import torch

import flashtile
from flashtile import backend, flash_attn_fp8_func, fp8, quantize_fp8
from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.fp8 import rounded_like_the_kernel
from flashtile.reference import naive
from tests.helpers import HEAD_LAYOUTS, assert_matches_oracle

# (N_q, N_k, head dim, layout, causal, window, softcap)
CASES = [
    (17, 17, 64, "mha", False, (-1, -1), 0.0),
    (113, 203, 32, "gqa", True, (-1, -1), 0.0),
    (203, 113, 16, "mqa", False, (40, 7), 0.0),
    (64, 129, 64, "gqa", False, (-1, -1), 5.0),
    (130, 70, 48, "mha", True, (-1, -1), 20.0),
]
GPU_CASES = [
    (1, 1, 64, "mha", False, (-1, -1), 0.0),
    (1000, 1000, 128, "gqa", True, (-1, -1), 0.0),
    (777, 1500, 128, "mqa", False, (256, 0), 0.0),
    (513, 300, 256, "gqa", False, (-1, -1), 30.0),
    (2048, 2048, 64, "mha", True, (-1, -1), 0.0),
    (300, 513, 256, "mha", True, (100, 100), 0.0),
]


def _case_id(case) -> str:
    sq, sk, d, layout, causal, window, softcap = case
    parts = [f"{sq}x{sk}", f"d{d}", layout, "causal" if causal else "full"]
    parts += [f"w{window[0]},{window[1]}"] if window != (-1, -1) else []
    parts += [f"cap{softcap:g}"] if softcap else []
    return "-".join(parts)


def _problem(case, device: str):
    sq, sk, d, layout, *_ = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    q = torch.randn(2, sq, heads, d, device=device) * 3
    k, v = (torch.randn(2, sk, heads_kv, d, device=device) * s for s in (0.5, 2))
    q8, q_descale = quantize_fp8(q, group=heads // heads_kv)
    (k8, k_descale), (v8, v_descale) = quantize_fp8(k), quantize_fp8(v)
    return (q8, k8, v8), (q_descale, k_descale, v_descale)


def _dequantized(fp8, descales, dtype) -> tuple[torch.Tensor, ...]:
    group = fp8[0].shape[2] // fp8[1].shape[2]
    out = []
    for t, d, g in zip(fp8, descales, (group, 1, 1), strict=True):
        out.append(t.to(dtype) * d.to(dtype).repeat_interleave(g, dim=1)[:, None, :, None])
    return tuple(out)


def _check(case, device: str, seed: int) -> None:
    _, _, _, _, causal, window, softcap = case
    fp8, descales = _problem(case, device)
    out, lse = flash_attn_fp8_func(
        *fp8, *descales, causal=causal, window_size=window, softcap=softcap, return_softmax_lse=True
    )
    assert out.dtype == torch.bfloat16 and out.shape == (*fp8[0].shape[:-1], fp8[2].shape[-1])
    options = dict(causal=causal, window_size=window if not causal else (window[0], 0), softcap=softcap)
    oracle_out, oracle_lse = naive.attention(*_dequantized(fp8, descales, torch.float64), **options)
    dequantized = _dequantized(fp8, descales, torch.float32)
    base_out = rounded_like_the_kernel(*dequantized, **options)
    # The LSE's baseline is bf16 attention: Hopper's float8 wgmma accumulates S in about 14 bits, not fp32
    # (the LSE off by 1e-4 to 3.5e-4 relative, measured on an H200), which no PyTorch float32 path rounds.
    _, base_lse = naive.attention(*(t.to(torch.bfloat16) for t in dequantized), **options)
    assert_matches_oracle("out", out, oracle_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, oracle_lse, base_lse, seed=seed)


@pytest.fixture(params=["triton", "reference"])
def cpu_backend(request, monkeypatch) -> str:
    monkeypatch.setenv(backend.ENV_VAR, request.param)
    return request.param


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_fp8_forward_matches_oracle(seed, cpu_backend, case):
    _check(case, "cpu", seed)


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_rows_that_see_no_key_give_zero_and_minus_inf(cpu_backend):
    # Window (0, 0) with N_q > N_k: queries before N_q − N_k see no key.
    fp8, descales = _problem((40, 16, 16, "gqa", False, (0, 0), 0.0), "cpu")
    out, lse = flash_attn_fp8_func(*fp8, *descales, window_size=(0, 0), return_softmax_lse=True)
    assert torch.equal(out[:, :24], torch.zeros_like(out[:, :24]))
    assert torch.isneginf(lse[:, :, :24]).all() and torch.isfinite(lse[:, :, 24:]).all()
    assert torch.isfinite(out).all()


def test_descales_scale_the_scores_and_the_output(cpu_backend):
    # Doubling k's descale is doubling the scale; doubling v's doubles the output (exact powers of two).
    fp8, (qd, kd, vd) = _problem((33, 47, 32, "mha", False, (-1, -1), 0.0), "cpu")
    base = flash_attn_fp8_func(*fp8, qd, kd, vd, softmax_scale=0.25)
    assert torch.equal(flash_attn_fp8_func(*fp8, qd, kd * 2, vd, softmax_scale=0.125), base)
    assert torch.equal(flash_attn_fp8_func(*fp8, qd, kd, vd * 2, softmax_scale=0.25), base * 2)
    # None is a descale of 1; a negative scale is taken as it is.
    ones = torch.ones_like(qd)
    assert torch.equal(flash_attn_fp8_func(*fp8), flash_attn_fp8_func(*fp8, ones, ones, ones))
    flipped = flash_attn_fp8_func(*fp8, -qd, kd, vd, softmax_scale=0.25)
    assert torch.equal(flipped, flash_attn_fp8_func(*fp8, qd, kd, vd, softmax_scale=-0.25))


def test_quantize_fp8_groups_heads_and_round_trips():
    x = torch.randn(2, 9, 6, 16) * torch.arange(1, 7).view(1, 1, 6, 1)
    x[1, :, 4:] = 0
    x8, descale = quantize_fp8(x, group=2)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 3) and descale.dtype == torch.float32
    back = x8.float() * descale.repeat_interleave(2, dim=1)[:, None, :, None]
    # e4m3 keeps 3 mantissa bits: within 2⁻⁴ of each value, or of the smallest normal step of its group.
    tol = (x.abs() * 2**-4).clamp_min(descale.repeat_interleave(2, dim=1)[:, None, :, None] * 2**-6)
    assert ((back - x).abs() <= tol).all()
    # Each group's largest magnitude maps to 448; an all-zero group gets descale 1.
    assert torch.equal(x8.float().abs().reshape(2, 9, 3, 32).amax(dim=(1, 3))[0], torch.full((3,), 448.0))
    assert descale[1, 2] == 1.0
    with pytest.raises(FlashtileValueError, match="group must be a positive divisor of nheads = 6; got 4"):
        quantize_fp8(x, group=4)
    with pytest.raises(
        FlashtileTypeError, match=r"x\.dtype is torch\.int32; quantize_fp8 takes torch\.float16"
    ):
        quantize_fp8(x.to(torch.int32))
    with pytest.raises(FlashtileTypeError, match=r"x\.dtype is torch\.float8_e4m3fn"):
        quantize_fp8(x8)


def test_bad_inputs_get_clear_errors(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "reference")
    fp8, (qd, kd, vd) = _problem((8, 8, 16, "gqa", False, (-1, -1), 0.0), "cpu")
    q8, k8, v8 = fp8
    with pytest.raises(
        FlashtileTypeError, match=re.escape("q, k, v must have the same dtype; got q torch.float8_e4m3fn")
    ):
        flash_attn_fp8_func(q8, k8.float(), v8)
    with pytest.raises(
        FlashtileTypeError, match=re.escape("q.dtype is torch.bfloat16; flash_attn_fp8_func takes")
    ):
        flash_attn_fp8_func(*(t.to(torch.bfloat16) for t in fp8))
    with pytest.raises(
        FlashtileValueError, match=r"k_descale must have shape \(batch_size, nheads_k\) = \(2, 2\)"
    ):
        flash_attn_fp8_func(*fp8, qd, kd[:, :1], vd)
    with pytest.raises(
        FlashtileTypeError, match=re.escape("v_descale.dtype must be torch.float32; got torch.float16")
    ):
        flash_attn_fp8_func(*fp8, qd, kd, vd.half())
    with pytest.raises(
        FlashtileTypeError, match=re.escape("q_descale must be a torch.Tensor or None; got float")
    ):
        flash_attn_fp8_func(*fp8, 1.0)
    odd = torch.zeros(2, 8, 4, 24).to(torch.float8_e4m3fn)
    with pytest.raises(
        FlashtileValueError, match="q's head dim is 24; the float8 forward takes multiples of 16"
    ):
        flash_attn_fp8_func(odd, odd[:, :, :2], odd[:, :, :2])
    with pytest.raises(FlashtileValueError, match="forward \\(inference\\) only"):
        flash_attn_fp8_func(q8.float().requires_grad_().to(torch.float8_e4m3fn), k8, v8)
    with pytest.raises(FlashtileTypeError, match="window_size must be a pair of integers"):
        flash_attn_fp8_func(*fp8, window_size=3)
    # flash_attn_func points float8 inputs here.
    with pytest.raises(
        FlashtileTypeError, match=re.escape("float8 inputs take flashtile.flash_attn_fp8_func")
    ):
        flashtile.flash_attn_func(*fp8)
    monkeypatch.setenv(backend.ENV_VAR, "hopper")
    with pytest.raises(FlashtileValueError, match="FLASHTILE_BACKEND=hopper was asked for"):
        flash_attn_fp8_func(*fp8)


@pytest.mark.parametrize("cpu_backend", ["triton", "reference"], indirect=True)
def test_torch_compile_traces_it_whole(cpu_backend):
    fp8_inputs, descales = _problem((16, 24, 16, "gqa", True, (-1, -1), 0.0), "cpu")

    def attend(q8, k8, v8, qd, kd, vd):
        out, lse = flash_attn_fp8_func(q8, k8, v8, qd, kd, vd, causal=True, return_softmax_lse=True)
        return out * 2, lse

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    (out_c, lse_c), (out_e, lse_e) = compiled(*fp8_inputs, *descales), attend(*fp8_inputs, *descales)
    assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)


@pytest.mark.parametrize("cpu_backend", ["triton", "reference"], indirect=True)
def test_the_custom_op_passes_opcheck(cpu_backend):
    fp8_inputs, descales = _problem((17, 33, 16, "gqa", False, (-1, -1), 0.0), "cpu")
    descale = torch.stack(descales, dim=-1)
    for args in (
        (*fp8_inputs, descale, 0.25, True, -1, 0, 0.0),
        (*fp8_inputs, descale, 0.25, False, 7, 3, 5.0),
    ):
        # (test_schema perturbs the inputs with arithmetic PyTorch has no float8 kernels for on the CPU.)
        torch.library.opcheck(
            fp8.fp8_fwd,
            args,
            test_utils=("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration"),
        )


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["gluon", "portable"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[_case_id(c) for c in GPU_CASES])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_fp8_kernel_matches_oracle_on_the_gpu(seed, monkeypatch, case, kernel):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 products need a CUDA GPU of compute capability ≥ 8.9")
    if kernel == "gluon" and backend.hopper_unavailable_reason(torch.device("cuda")) is not None:
        pytest.skip("the Gluon float8 forward runs on compute capability 9.x")
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    monkeypatch.setenv(fp8.FP8_KERNEL_ENV, kernel)
    # The Gluon forward takes head dims 64, 128 and 256: every GPU case has one.
    calls = []
    real = fp8._fp8_backend
    monkeypatch.setattr(fp8, "_fp8_backend", lambda *a: calls.append(real(*a)) or calls[-1])
    _check(case, "cuda", seed)
    assert calls == ["hopper" if kernel == "gluon" else "triton"]


@pytest.mark.gpu
def test_gluon_and_portable_fp8_forwards_agree(monkeypatch):
    # The same roundings (P in e4m3 against the running max, fp32 softmax): close, not bitwise (the tiles'
    # sizes and the order of the sums differ).
    if not torch.cuda.is_available() or backend.hopper_unavailable_reason(torch.device("cuda")) is not None:
        pytest.skip("the Gluon float8 forward runs on compute capability 9.x")
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    fp8_inputs, descales = _problem((700, 900, 128, "gqa", True, (-1, -1), 0.0), "cuda")
    results = {}
    for kernel in ("gluon", "portable"):
        monkeypatch.setenv(fp8.FP8_KERNEL_ENV, kernel)
        results[kernel] = flash_attn_fp8_func(*fp8_inputs, *descales, causal=True, return_softmax_lse=True)
    (out_g, lse_g), (out_p, lse_p) = results["gluon"], results["portable"]
    assert (out_g.float() - out_p.float()).abs().max() < 0.1 * out_p.float().abs().max()
    assert (lse_g - lse_p).abs().max() < 1e-2
