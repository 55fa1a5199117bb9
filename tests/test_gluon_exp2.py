"""The Gluon forward's exponential on the FMA pipes (kernels/hopper/fwd.py ``_exp2_fma``), step by step in
fp32 torch on the CPU: Gluon kernels do not run in the interpreter, so this checks the constants and the
exponent-field arithmetic; the GPU suite's softcap cases check the kernel that uses them."""

from __future__ import annotations

import torch

from flashtile.kernels.hopper import fwd


def exp2_fma(x: torch.Tensor) -> torch.Tensor:
    """``_exp2_fma`` in fp32 torch, operation for operation."""
    magic = torch.tensor(fwd.ROUND_MAGIC.value, dtype=torch.float32)
    x = torch.clamp(x, min=-125.0)
    j = x + magic
    f = x - (j - magic)
    p = torch.full_like(f, fwd.EXP2_C3.value)
    for c in (fwd.EXP2_C2, fwd.EXP2_C1, fwd.EXP2_C0):
        p = p * f + c.value
    bits = p.view(torch.int32) + (j.view(torch.int32) << 23)
    return bits.view(torch.float32)


def test_exp2_fma_relative_error_over_the_softmax_domain() -> None:
    """Every fp32 exponent a softmax step meets, 0 down to −125, and fractions near the rounding ties:
    relative error ≤ 8e-5 (P is then rounded to bf16 or fp16, 2^−9 or 2^−11)."""
    x = torch.cat([
        -torch.linspace(0, 125, 2_000_003, dtype=torch.float64),
        -torch.arange(0, 125, dtype=torch.float64) - 0.5,  # f = ±1/2 at the ties
        torch.tensor([-1e-30, -2.0**-24, -0.4999999, -0.5000001]),
    ]).to(torch.float32)  # fmt: skip
    got = exp2_fma(x).double()
    want = torch.exp2(x.double())
    assert torch.isfinite(got).all() and (got > 0).all()
    assert ((got - want).abs() / want).max() <= 8e-5


def test_exp2_fma_clamps_below_the_normal_range() -> None:
    """Far below −125 the result is 2^−125 within the polynomial's error (a normal number, never a wrapped
    exponent or a negative)."""
    x = torch.tensor([-126.0, -200.0, -1e30, -3.4e38], dtype=torch.float32)
    got = exp2_fma(x).double()
    assert ((got / 2.0**-125 - 1).abs() <= 8e-5).all()
