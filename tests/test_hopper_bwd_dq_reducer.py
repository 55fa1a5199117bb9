"""Who issues the Hopper backward's dQ reduce-adds (kernels/hopper/bwd.py, ``dq_by_producer``;
docs/design/hopper_bwd.md, "dQ reduces issued by the producer warp"): the producer warp for calls that add
dQ (not deterministic) without dropout or a block mask; the consumers otherwise.
FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1 takes dropout and block masks too, =0 none. And the order of the
"keys" split's dK and dQ wgmmas (``dk_after_dq``): dK after dQ in plain non-causal calls at kernel head dim
128 without a sink, FLASHTILE_HOPPER_BWD_DK_LAST=1 in every call of the split that adds dQ, =0 none. The
launches are prepared on the CPU (no kernel runs)."""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels.hopper import bwd

CPU = torch.device("cpu")


@pytest.fixture
def knob(monkeypatch):
    monkeypatch.delenv(bwd.DQ_BY_PRODUCER_ENV, raising=False)
    monkeypatch.delenv(bwd.VARIANT_ENV, raising=False)
    monkeypatch.delenv(bwd.DK_LAST_ENV, raising=False)
    return lambda value, env=bwd.DQ_BY_PRODUCER_ENV: monkeypatch.setenv(env, value)


def fused_flag(
    head_dim: int,
    *,
    causal=False,
    deterministic=False,
    sink=False,
    softcap=0.0,
    dropout_p=0.0,
    flag="DQ_BY_PRODUCER",
) -> bool:
    """The switch ``flag`` the fused kernel of such a call is launched with."""
    window = (-1, 0) if causal else (-1, -1)
    plain = bwd.is_plain_call(window, softcap, None, dropout_p)
    _, cfg = bwd.select_variant(head_dim, plain)
    strides = (300 * 4 * head_dim, 4 * head_dim, head_dim)
    fused = bwd._bwd_launches(
        CPU, (2, 300, 4, head_dim), (300, 2), head_dim**-0.5, causal, deterministic, cfg, strides, strides,
        window, softcap, None, None, False, None, dropout_p, sink, False,
        bwd.dq_by_producer(deterministic, dropout_p > 0, False),
        bwd.dk_after_dq(head_dim, cfg, causal, plain, sink, deterministic),
    )[1]  # fmt: skip
    arguments = fused.arguments((None,) * len(bwd.FUSED_POINTERS))
    values = dict(zip(bwd.attn_bwd_kernel.arg_names, arguments, strict=True))
    return values[flag]


OPTIONS = [dict(sink=True), dict(softcap=30.0), dict(causal=True, softcap=5.0, sink=True)]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_plain_keys_split_calls_have_the_producer_reduce(knob, head_dim, causal):
    assert fused_flag(head_dim, causal=causal)


@pytest.mark.parametrize("call", OPTIONS, ids=["sink", "softcap", "causal-softcap-sink"])
def test_option_calls_have_it_too(knob, call):
    assert fused_flag(64, **call) and fused_flag(128, **call)


def test_deterministic_dropout_and_block_mask_calls_keep_the_consumers_reduce(knob):
    assert not fused_flag(64, deterministic=True) and not fused_flag(128, causal=True, deterministic=True)
    assert not fused_flag(64, dropout_p=0.1) and not fused_flag(128, causal=True, dropout_p=0.1)
    assert not bwd.dq_by_producer(False, False, True)


def test_the_dim_split_takes_it_causal_or_not(knob):
    # D = 256 ("dim" split, one joined partition): 4-7 % faster causal on an H200 (s48b), 2-3 % without a
    # mask (s49b).
    assert fused_flag(256, causal=True) and fused_flag(256)
    assert not fused_flag(256, deterministic=True) and not fused_flag(256, causal=True, deterministic=True)
    knob("0")
    assert not fused_flag(256, causal=True) and not fused_flag(256)


def test_the_knob_takes_every_call_that_adds_dq_or_none(knob):
    knob("1")
    assert fused_flag(128, dropout_p=0.1) and fused_flag(64, causal=True, dropout_p=0.1, sink=True)
    assert bwd.dq_by_producer(False, False, True)
    # Deterministic calls add no dQ in the fused kernel: nothing to reduce.
    assert not fused_flag(128, deterministic=True)
    knob("0")
    assert not fused_flag(64) and not fused_flag(128, causal=True, softcap=5.0)


def dk_last(head_dim: int, **call) -> bool:
    return fused_flag(head_dim, flag="DK_LAST", **call)


def test_dk_goes_after_dq_in_plain_non_causal_calls_at_d128_only(knob):
    # On an H200: 2-4 % faster there, 3-5 % slower causal at D = 128, 2-4 % slower at D = 64 (s49a).
    assert dk_last(128)
    assert not dk_last(128, causal=True) and not dk_last(64) and not dk_last(64, causal=True)
    assert not dk_last(128, softcap=30.0) and not dk_last(128, sink=True) and not dk_last(128, dropout_p=0.1)
    # Deterministic calls add no dQ in the fused kernel; D = 256's joined partition takes it under the knob
    # only.
    assert not dk_last(128, deterministic=True) and not dk_last(256)


def test_the_dk_last_knob_takes_every_keys_split_call_that_adds_dq_or_none(knob):
    knob("1", bwd.DK_LAST_ENV)
    assert dk_last(64, causal=True) and dk_last(128, dropout_p=0.1) and dk_last(128, causal=True, sink=True)
    # Not the "dim" split's joined partition (D = 192/256): 8-16 % slower with it on an H200 (s50a).
    assert not dk_last(128, deterministic=True) and not dk_last(256) and not dk_last(256, causal=True)
    knob("0", bwd.DK_LAST_ENV)
    assert not dk_last(128)
