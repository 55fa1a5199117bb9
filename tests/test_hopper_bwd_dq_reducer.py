"""Who issues the Hopper backward's dQ reduce-adds (kernels/hopper/bwd.py, ``dq_by_producer``;
docs/design/hopper_bwd.md, "dQ reduces issued by the producer warp"): the producer warp for calls that add
dQ (not deterministic) of the "keys" split and causal ones of the "dim" split (its joined partition),
without dropout or a block mask; the consumers otherwise. FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1 takes
dropout and block masks too, =0 none. The launches are prepared on the CPU (no kernel runs)."""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels.hopper import bwd

CPU = torch.device("cpu")


@pytest.fixture
def knob(monkeypatch):
    monkeypatch.delenv(bwd.DQ_BY_PRODUCER_ENV, raising=False)
    monkeypatch.delenv(bwd.VARIANT_ENV, raising=False)
    return lambda value: monkeypatch.setenv(bwd.DQ_BY_PRODUCER_ENV, value)


def fused_flag(
    head_dim: int, *, causal=False, deterministic=False, sink=False, softcap=0.0, dropout_p=0.0
) -> bool:
    """The DQ_BY_PRODUCER the fused kernel of such a call is launched with."""
    window = (-1, 0) if causal else (-1, -1)
    plain = bwd.is_plain_call(window, softcap, None, dropout_p)
    _, cfg = bwd.select_variant(head_dim, plain)
    strides = (300 * 4 * head_dim, 4 * head_dim, head_dim)
    fused = bwd._bwd_launches(
        CPU, (2, 300, 4, head_dim), (300, 2), head_dim**-0.5, causal, deterministic, cfg, strides, strides,
        window, softcap, None, None, False, None, dropout_p, sink, False,
        bwd.dq_by_producer(cfg, causal, deterministic, dropout_p > 0, False),
    )[1]  # fmt: skip
    arguments = fused.arguments((None,) * len(bwd.FUSED_POINTERS))
    values = dict(zip(bwd.attn_bwd_kernel.arg_names, arguments, strict=True))
    return values["DQ_BY_PRODUCER"]


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
    cfg = bwd.VARIANTS[128][bwd.DEFAULT_VARIANT[128]]
    assert not bwd.dq_by_producer(cfg, True, False, False, True)


def test_the_dim_split_takes_it_in_the_causal_joined_partition_only(knob):
    # D = 256 ("dim" split): the causal joined partition stages its dQ for the producer (4-7 % on an H200,
    # s48b); the non-causal split partitions add their halves of dQ themselves, even under the knob.
    assert fused_flag(256, causal=True)
    assert not fused_flag(256) and not fused_flag(256, causal=True, deterministic=True)
    knob("1")
    assert fused_flag(256, causal=True)
    assert not fused_flag(256)
    knob("0")
    assert not fused_flag(256, causal=True)


def test_the_knob_takes_every_call_that_adds_dq_or_none(knob):
    knob("1")
    assert fused_flag(128, dropout_p=0.1) and fused_flag(64, causal=True, dropout_p=0.1, sink=True)
    cfg = bwd.VARIANTS[128][bwd.DEFAULT_VARIANT[128]]
    assert bwd.dq_by_producer(cfg, True, False, False, True)
    # Deterministic calls add no dQ in the fused kernel: nothing to reduce.
    assert not fused_flag(128, deterministic=True)
    knob("0")
    assert not fused_flag(64) and not fused_flag(128, causal=True, softcap=5.0)
