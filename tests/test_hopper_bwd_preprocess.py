"""The Gluon backward's preprocess (a plain Triton kernel, so the interpreter runs it on the CPU): Δ, the
base-2 LSE with +inf for padding rows and rows without a key, and the fp32 dQ accumulator zeroed for the
fused kernel's reduce-add, over dense (B, N, H, D) and packed (total, H, D) inputs, NaN-poisoned."""

from __future__ import annotations

import math

import pytest
import torch

from flashtile.kernels._layout import cdiv
from flashtile.kernels.hopper import bwd

LOG2_E = 1 / math.log(2)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("zero_dq", [True, False], ids=["zero-dq", "deterministic"])
@pytest.mark.parametrize("seed", [0, 1])
def test_preprocess_rows_and_zeroed_dq(packed: bool, zero_dq: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, seqlen, heads, head_dim, block = (1, 77, 3, 64, 64) if packed else (2, 37, 3, 64, 64)
    shape = (seqlen, heads, head_dim) if packed else (batch, seqlen, heads, head_dim)
    out, dout = (torch.randn(shape, generator=gen, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(batch * heads * seqlen, generator=gen)
    lse[5] = -math.inf  # a row without a visible key
    seqlen_pad = cdiv(seqlen, block) * block
    lse2, delta = torch.full((2, batch * heads * seqlen_pad), math.nan)
    dq_accum = torch.full(shape, math.nan)
    (_, _, _, _), strides = bwd._dims4(out)
    grid = (seqlen_pad // block * batch * heads,)
    bwd.attn_bwd_preprocess_kernel[grid](
        out, dout, lse, lse2, delta, dq_accum if zero_dq else lse2, *strides[:3], *strides[:3],
        seqlen, seqlen_pad, seqlen_pad // block, heads, HEAD_DIM=head_dim, BLOCK=block, ZERO_DQ=zero_dq,
    )  # fmt: skip
    o4, do4 = (t.reshape(batch, seqlen, heads, head_dim).float() for t in (out, dout))
    want_delta = (o4 * do4).sum(-1).permute(0, 2, 1).reshape(batch * heads, seqlen)
    want_lse2 = torch.where(lse.isneginf(), math.inf, lse * LOG2_E).reshape(batch * heads, seqlen)
    got_delta, got_lse2 = (t.reshape(batch * heads, seqlen_pad) for t in (delta, lse2))
    torch.testing.assert_close(got_delta[:, :seqlen], want_delta, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got_lse2[:, :seqlen], want_lse2, rtol=1e-6, atol=0)
    # Padding rows: P = 0 (LSE +inf) and Δ = 0, never NaN.
    assert (got_lse2[:, seqlen:] == math.inf).all()
    assert (got_delta[:, seqlen:] == 0).all()
    if zero_dq:
        assert (dq_accum == 0).all()
    else:
        assert dq_accum.isnan().all(), "the deterministic path leaves the accumulator alone"


def test_packed_tensors_are_seen_as_one_batch_without_views() -> None:
    """A packed (total, H, D) tensor is (1, total, H, D) to the descriptors and the preprocess: its strides
    are the tensor's own behind a batch stride of its size; a layout TMA cannot read becomes a copy."""
    packed = torch.empty(37, 3, 64, dtype=torch.float16)
    shape, strides = bwd._dims4(packed)
    assert shape == (1, 37, 3, 64)
    assert strides == (37 * 3 * 64, 3 * 64, 64, 1)
    dense = torch.empty(2, 37, 3, 64, dtype=torch.float16)
    assert bwd._dims4(dense) == (tuple(dense.shape), dense.stride())
    assert bwd._tma_ready(packed) is packed
    # Heads not packed next to each other (a slice of a wider tensor): copied to a contiguous tensor.
    sliced = torch.randn(37, 6, 64).half()[:, ::2]
    ready = bwd._tma_ready(sliced)
    assert ready is not sliced and ready.is_contiguous() and torch.equal(ready, sliced)
