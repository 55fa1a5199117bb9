"""Causal masking, bottom-right aligned: query i sees key j iff j ≤ i + causal_offset, with
causal_offset = seqlen_k − seqlen_q. The loop bounds that skip invisible tiles and the masks of the rest."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_bounds(
    m0, seqlen_k, causal_offset, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """For queries [m0, m0 + BLOCK_M): keys [0, unmasked_end) are visible to every row, keys
    [unmasked_end, hi) need a mask, keys from hi on are visible to none."""
    if IS_CAUSAL:
        hi = tl.minimum(seqlen_k, tl.maximum(0, m0 + BLOCK_M + causal_offset))
        unmasked_end = tl.minimum(hi, tl.maximum(0, m0 + causal_offset + 1)) // BLOCK_N * BLOCK_N
    else:
        hi = seqlen_k
        unmasked_end = seqlen_k // BLOCK_N * BLOCK_N
    return unmasked_end, hi


@triton.jit
def query_bounds(
    n0, seqlen_q, causal_offset, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """For keys [n0, n0 + BLOCK_N): queries before start_m see none of them, queries
    [start_m, masked_end) need a mask, queries from masked_end on see the whole block."""
    if IS_CAUSAL:
        start_m = tl.maximum(0, n0 - causal_offset) // BLOCK_M * BLOCK_M
        masked_end = tl.minimum(
            seqlen_q, tl.cdiv(tl.maximum(0, n0 + BLOCK_N - 1 - causal_offset), BLOCK_M) * BLOCK_M
        )
        masked_end = tl.maximum(masked_end, start_m)
    else:
        start_m = 0
        masked_end = 0
    return start_m, masked_end


@triton.jit
def visible(offs_m, offs_n, seqlen_k, causal_offset, IS_CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N]: which (query, key) pairs of a tile exist and are visible."""
    keep = offs_n[None, :] < seqlen_k
    if IS_CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    return keep
