"""Rotary embedding of one tile of rows, shared by the rotary kernel and the KV-cache append kernel.

Each feature ``d < ROTARY_DIM`` pairs with a partner: ``d ± ROTARY_DIM / 2`` (GPT-NeoX) or ``d ^ 1``
(GPT-J, ``INTERLEAVED``), and becomes ``x[d] · cos − x[partner] · sin`` for the first of a pair,
``x[d] · cos + x[partner] · sin`` for the second; features from ``ROTARY_DIM`` on pass through (cos 1,
sin 0). Loading the partner as a second gather of the same row keeps the tile 2-D.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rotate_rows(
    row_ptrs, offs_d, pos, row_mask, cos_ptr, sin_ptr, seqlen_ro,
    HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr,
):  # fmt: skip
    """Load rows ``row_ptrs + d`` (``[BLOCK_M, 1]`` pointers, features ``offs_d`` ``[1, BLOCK_D]``) and
    return them rotated to positions ``pos`` ``[BLOCK_M, 1]``, in float32; positions outside
    ``[0, seqlen_ro)`` stay unrotated."""
    d_mask = offs_d < HEAD_DIM
    x = tl.load(row_ptrs + offs_d, mask=row_mask & d_mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
    if ROTARY_DIM > 0:
        half: tl.constexpr = ROTARY_DIM // 2
        in_rotary = offs_d < ROTARY_DIM
        if INTERLEAVED:
            partner = offs_d ^ 1
            pair = offs_d // 2
            first = (offs_d % 2) == 0
        else:
            first = offs_d < half
            partner = tl.where(first, offs_d + half, offs_d - half)
            pair = tl.where(first, offs_d, offs_d - half)
        partner = tl.where(in_rotary, partner, offs_d)
        x_partner = tl.load(row_ptrs + partner, mask=row_mask & d_mask, other=0.0).to(tl.float32)
        table_mask = row_mask & in_rotary & (pos >= 0) & (pos < seqlen_ro)
        table = pos.to(tl.int64) * half + pair
        cos = tl.load(cos_ptr + table, mask=table_mask, other=1.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
        sin = tl.load(sin_ptr + table, mask=table_mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
        if CONJUGATE:
            sin = -sin
        x = x * cos + tl.where(first, -x_partner, x_partner) * sin
    return x
