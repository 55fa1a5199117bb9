"""The Gluon forward's exponential on the FMA pipes (hopper.fwd._exp2_poly_ptx), its arithmetic replayed in
numpy fp32 step by step, and the rule choosing its share of the exponentials."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashtile.errors import FlashtileValueError
from flashtile.kernels import configs
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
    ("softcap", "head_dim", "consumers", "plain", "forced", "share"),
    [
        (True, 64, 2, False, "", fwd.SOFTCAP_EXP2_SHARE),
        (True, 128, 2, False, "", 0),
        (True, 256, 2, False, "", 0),
        (False, 64, 2, False, "", 0),
        (False, 64, 2, True, "", fwd.PLAIN_TWO_CONSUMERS_EXP2_SHARE),
        (False, 64, 3, True, "", 0),
        (False, 128, 2, True, "", 0),
        (False, 256, 2, True, "", 0),
        (False, 64, 2, True, "0", 0),
        (True, 64, 2, False, "0", 0),
        (False, 128, 2, False, " 8 ", 8),
        (True, 256, 2, False, "2", 2),
    ],
)
def test_the_share_is_softcaps_and_plain_two_consumers_at_d64_by_default_and_the_knobs_where_set(
    softcap, head_dim, consumers, plain, forced, share
):
    values = {"HAS_SOFTCAP": softcap, "HEAD_DIM": head_dim, "CONSUMERS": consumers}
    assert fwd.exp2_share(values, forced, plain) == share


def test_the_knob_names_what_it_accepts():
    with pytest.raises(
        FlashtileValueError, match=r"FLASHTILE_HOPPER_FWD_EXP2_POLY='3'; accepted: 0, 2, 4 or 8"
    ):
        fwd.exp2_share({"HAS_SOFTCAP": True}, "3")


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "causal", "window", "softcap", "share"),
    [
        (64, 4096, True, (-1, 0), 0.0, fwd.PLAIN_TWO_CONSUMERS_EXP2_SHARE),
        (64, 1024, False, (-1, -1), 0.0, fwd.PLAIN_TWO_CONSUMERS_EXP2_SHARE),
        (64, 8192, True, (-1, 0), 0.0, 0),
        (64, 2048, False, (-1, -1), 0.0, 0),
        (64, 8192, False, (256, 0), 0.0, 0),
        (64, 4096, False, (-1, -1), 30.0, fwd.SOFTCAP_EXP2_SHARE),
        (128, 4096, True, (-1, 0), 0.0, 0),
    ],
    ids=["causal-4k", "full-1k", "causal-8k-three", "full-2k-three", "window", "softcap", "d128"],
)
def test_the_launcher_gives_plain_d64_calls_with_two_consumers_one_in_8(
    monkeypatch, head_dim, seqlen, causal, window, softcap, share
):
    # What a launch of the call compiles (no kernel runs: the launch is only prepared, on the CPU).
    monkeypatch.delenv(fwd.EXP2_POLY_ENV, raising=False)
    monkeypatch.delenv(fwd.CONSUMERS_ENV, raising=False)
    fwd._fwd_launch.cache_clear()
    plain = fwd.plain_call(window, softcap, False, 0.0, False, False, False, False)
    cfg = configs.hopper_fwd_config(head_dim, plain)
    consumers = fwd.consumer_count(head_dim, seqlen, window, softcap, False, 0.0, False, False)
    launch = fwd._fwd_launch(
        torch.device("cpu"), 2, seqlen, seqlen, 8, 8, head_dim, head_dim**-0.5, causal, window, softcap, None,
        cfg.BLOCK_N, cfg.STAGES, consumers=consumers,
    )  # fmt: skip
    values = dict(
        zip(fwd.attn_fwd_kernel.arg_names, launch.arguments((None,) * len(fwd.FWD_POINTERS)), strict=True)
    )
    assert values["EXP2_SHARE"] == share
