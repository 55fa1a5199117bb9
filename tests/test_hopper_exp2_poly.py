"""The Gluon forward's exponential on the FMA pipes (hopper.fwd._exp2_poly_ptx), its arithmetic replayed in
numpy fp32 step by step, and the rule choosing its share of the exponentials."""

from __future__ import annotations

import numpy as np
import pytest

from flashtile.errors import FlashtileValueError
from flashtile.kernels.hopper import fwd


def _f32(bits: str) -> np.float32:
    return np.uint32(int(bits.removeprefix("0f"), 16)).view(np.float32)


def exp2_as_the_ptx(x: np.ndarray) -> np.ndarray:
    """The PTX's steps in fp32: clamp, round by 1.5·2^23, Horner (each FMA rounded once), the rounded
    integer shifted into the exponent field."""
    c0, c1, c2, c3 = (_f32(c) for c in fwd._EXP2_COEFFICIENTS)
    magic = _f32("0f4B400000")
    x = np.maximum(x, _f32("0fC2FA0000"))
    t = (x + magic).astype(np.float32)
    f = (x - (t - magic).astype(np.float32)).astype(np.float32)

    def fma(a, b, c):
        return (a.astype(np.float64) * b + c).astype(np.float32)

    p = fma(fma(fma(f, c3, c2), f, c1), f, c0)
    bits = (p.view(np.uint32).astype(np.uint64) + (t.view(np.uint32).astype(np.uint64) << 23)) & 0xFFFFFFFF
    return bits.astype(np.uint32).view(np.float32)


def test_the_polynomial_exponential_is_within_8e_5_of_exp2_down_to_the_clamp():
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [-rng.random(1_000_000, dtype=np.float32) * 125, -rng.random(100_000, dtype=np.float32) * 2]
    )
    x = np.concatenate([x, np.array([0.0, -0.5, -1.5, -124.5, -125.0], dtype=np.float32)])
    got = exp2_as_the_ptx(x).astype(np.float64)
    relative = np.abs(got / np.exp2(x.astype(np.float64)) - 1)
    assert relative.max() < 8e-5


def test_exponents_past_the_clamp_give_a_tiny_positive_number():
    # Where the MUFU's exp2 underflows to 0, the polynomial gives 2^−125 (about 2e-38): against a row
    # sum of at least 1 it changes nothing, and it is never negative, NaN or infinite.
    got = exp2_as_the_ptx(np.array([-125.5, -200.0, -1e30, -np.inf], dtype=np.float32))
    assert np.all((got > 0) & (got < 1e-37))


def test_the_ptx_holds_every_share_and_the_polynomial_once_an_instance():
    for every in (2, 4, 8):
        ptx = fwd._exp2_shared_ptx(every)
        assert ptx.count("ex2.approx.ftz.f32") == every - 1
        assert ptx.count("fma.rn.f32") == 3
        # Outputs $0 … $(every − 1), inputs $every … $(2·every − 1): the polynomial takes the last pair.
        assert f"mov.b32 ${every - 1}, pb;" in ptx and f"max.f32 x, ${2 * every - 1}," in ptx


@pytest.mark.parametrize(
    ("softcap", "head_dim", "forced", "share"),
    [
        (True, 64, "", fwd.SOFTCAP_EXP2_SHARE),
        (True, 128, "", 0),
        (True, 256, "", 0),
        (False, 64, "", 0),
        (True, 64, "0", 0),
        (False, 128, " 8 ", 8),
        (True, 256, "2", 2),
    ],
)
def test_the_share_is_softcaps_at_d64_by_default_and_the_knobs_where_set(softcap, head_dim, forced, share):
    assert fwd.exp2_share({"HAS_SOFTCAP": softcap, "HEAD_DIM": head_dim}, forced) == share


def test_the_knob_names_what_it_accepts():
    with pytest.raises(
        FlashtileValueError, match=r"FLASHTILE_HOPPER_FWD_EXP2_POLY='3'; accepted: 0, 2, 4 or 8"
    ):
        fwd.exp2_share({"HAS_SOFTCAP": True}, "3")
