"""flashtile.rotary.apply_rotary_emb: the reference against rotation by complex multiplication, the Triton
kernel (interpreter) against the float64 reference, offsets, varlen, partial rotary dims, in place, autograd,
bad arguments and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch

from flashtile.errors import FlashtileValueError
from flashtile.reference.rotary import apply_rotary
from flashtile.rotary import apply_rotary_emb
from tests.helpers import assert_matches_oracle


def _cos_sin(seqlen_ro: int, rotary_dim: int, dtype: torch.dtype = torch.float64):
    angle = torch.rand(seqlen_ro, rotary_dim // 2, dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _complex_rotation(x, cos, sin, pos, interleaved):
    """Rotary as z · e^{iθ} on complex pairs: an independent formulation of the same map."""
    half = cos.shape[-1]
    rot = x[..., : 2 * half]
    pairs = rot.unflatten(-1, (half, 2)) if interleaved else rot.unflatten(-1, (2, half)).transpose(-1, -2)
    z = torch.view_as_complex(pairs.contiguous())
    inside = ((pos >= 0) & (pos < cos.shape[0]))[..., None]
    idx = pos.clamp(0, cos.shape[0] - 1)
    phase = torch.complex(torch.where(inside, cos[idx], 1.0), torch.where(inside, sin[idx], 0.0))[
        ..., None, :
    ]
    out = torch.view_as_real(z * phase)
    out = out.flatten(-2) if interleaved else out.transpose(-1, -2).flatten(-2)
    return torch.cat((out, x[..., 2 * half :]), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
def test_reference_is_a_rotation(interleaved: bool, offsets: str, seed: int) -> None:
    batch, seqlen, head_dim = 3, 7, 20
    x = torch.randn(batch, seqlen, 2, head_dim, dtype=torch.float64)
    cos, sin = _cos_sin(9, 12)
    seqlen_offsets = {"zero": 0, "int": 4, "tensor": torch.tensor([0, 3, 5])}[offsets]
    pos = torch.arange(seqlen)[None, :] + (
        seqlen_offsets[:, None] if isinstance(seqlen_offsets, torch.Tensor) else seqlen_offsets
    )
    pos = pos.expand(batch, seqlen)
    ours = apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets)
    expected = _complex_rotation(x, cos, sin, pos, interleaved)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    back = apply_rotary(
        ours, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, conjugate=True
    )
    torch.testing.assert_close(back, x, rtol=0, atol=1e-12)


CASES = [
    pytest.param(False, 1.0, 0, False, id="neox-full"),
    pytest.param(True, 0.5, 3, False, id="gptj-half-int-offset"),
    pytest.param(False, 0.25, "tensor", False, id="neox-quarter-tensor-offsets"),
    pytest.param(True, 1.0, "tensor", True, id="gptj-varlen"),
    pytest.param(False, 0.5, 2, True, id="neox-half-varlen"),
]


@pytest.mark.parametrize(("interleaved", "fraction", "offsets", "varlen"), CASES)
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_matches_reference(
    interleaved: bool, fraction: float, offsets, varlen: bool, backend: str, seed: int, monkeypatch
) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    batch, seqlen, nheads, head_dim = 3, 11, 3, 40
    rotary_dim = int(fraction * head_dim) // 2 * 2
    cos64, sin64 = _cos_sin(20, rotary_dim)
    cos, sin = cos64.half(), sin64.half()
    seqlen_offsets = torch.tensor([0, 4, 9], dtype=torch.int32) if offsets == "tensor" else offsets
    if varlen:
        cu = torch.tensor([0, 5, 5, 16], dtype=torch.int32)
        x = torch.randn(16, nheads, head_dim, dtype=torch.float16, requires_grad=True)
        kwargs = dict(cu_seqlens=cu, max_seqlen=11)
    else:
        x = torch.randn(batch, seqlen, nheads, head_dim, dtype=torch.float16, requires_grad=True)
        kwargs = {}
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=seqlen_offsets, **kwargs)
    oracle = apply_rotary(
        x.detach().double(), cos64, sin64, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
        cu_seqlens=kwargs.get("cu_seqlens"),
    )  # fmt: skip
    baseline = apply_rotary(
        x.detach(), cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
        cu_seqlens=kwargs.get("cu_seqlens"),
    )  # fmt: skip
    assert_matches_oracle("out", out, oracle, baseline, seed=seed)
    assert torch.equal(out[..., rotary_dim:], x.detach()[..., rotary_dim:])
    dout = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, dout)
    cu = kwargs.get("cu_seqlens")
    dx_oracle = apply_rotary(
        dout.double(), cos64, sin64, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu,
        conjugate=True,
    )  # fmt: skip
    dx_baseline = apply_rotary(
        dout, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu, conjugate=True
    )
    assert_matches_oracle("dx", dx, dx_oracle, dx_baseline, grad=True, seed=seed)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_inplace_writes_x_and_backpropagates(backend: str, seed: int, monkeypatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    cos, sin = (t.float() for t in _cos_sin(8, 16))
    leaf = torch.randn(2, 6, 2, 16, requires_grad=True)
    x = leaf * 1.0
    expected = apply_rotary(x.detach(), cos, sin, interleaved=True)
    out = apply_rotary_emb(x, cos, sin, interleaved=True, inplace=True)
    assert out is x
    torch.testing.assert_close(x.detach(), expected)
    (grad,) = torch.autograd.grad(out.sum(), leaf)
    torch.testing.assert_close(
        grad, apply_rotary(torch.ones_like(x), cos, sin, interleaved=True, conjugate=True)
    )


def test_positions_a_tensor_offset_puts_past_the_table_are_not_rotated(monkeypatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    cos, sin = _cos_sin(8, 8, torch.float32)
    x = torch.randn(1, 6, 1, 8)
    offsets = torch.tensor([4])
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets)
    torch.testing.assert_close(out[:, 4:], x[:, 4:])
    torch.testing.assert_close(out, apply_rotary(x, cos, sin, seqlen_offsets=offsets))


@pytest.mark.parametrize(
    ("rows", "offset", "match"),
    [(4, 0, "at least seqlen"), (8, 3, r"= \[0, 2\] .*; got 3"), (8, -1, r"= \[0, 2\] .*; got -1")],
    ids=["table-shorter-than-seqlen", "int-offset-past-the-table", "negative-int-offset"],
)
def test_a_table_too_short_for_the_positions_is_an_error(rows: int, offset: int, match: str) -> None:
    # flash_attn's apply_rotary asserts these; positions past the table would otherwise pass unrotated.
    cos, sin = _cos_sin(rows, 8, torch.float32)
    with pytest.raises(FlashtileValueError, match=match):
        apply_rotary_emb(torch.randn(1, 6, 1, 8), cos, sin, seqlen_offsets=offset)


def test_a_table_shorter_than_max_seqlen_is_an_error() -> None:
    cos, sin = _cos_sin(4, 8, torch.float32)
    cu_seqlens = torch.tensor([0, 2, 7], dtype=torch.int32)
    with pytest.raises(FlashtileValueError, match="at least max_seqlen = 5 rows"):
        apply_rotary_emb(torch.randn(7, 1, 8), cos, sin, cu_seqlens=cu_seqlens, max_seqlen=5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(cos=torch.ones(8, 9)), "rotary_dim ≤ headdim"),
        (dict(sin=torch.ones(7, 4)), "same shape"),
        (dict(seqlen_offsets=torch.zeros(3, dtype=torch.int32)), r"seqlen_offsets must be .*\(2,\)"),
        (dict(seqlen_offsets=torch.zeros(2)), "int32/int64"),
    ],
    ids=["rotary-dim-too-large", "cos-sin-shapes", "offsets-shape", "offsets-dtype"],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    args = dict(x=torch.randn(2, 3, 1, 16), cos=torch.ones(8, 4), sin=torch.zeros(8, 4))
    args.update(kwargs)
    with pytest.raises(FlashtileValueError, match=match):
        apply_rotary_emb(**args)


def test_compiles_fullgraph(seed: int) -> None:
    torch.compiler.reset()
    cos, sin = (t.float() for t in _cos_sin(16, 8))
    x = torch.randn(2, 5, 2, 16, requires_grad=True)
    offsets = torch.tensor([1, 7])
    compiled = torch.compile(apply_rotary_emb, fullgraph=True, backend="aot_eager")
    out = compiled(x, cos, sin, seqlen_offsets=offsets)
    torch.testing.assert_close(out, apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets))
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(
        grad, apply_rotary(torch.ones_like(x), cos, sin, seqlen_offsets=offsets, conjugate=True)
    )
