"""What a program owns: its query block, batch and head from the program id, and descriptors over the rows
of one head. Shared by the forward and the backward kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def query_block_of_program(num_m_blocks, H, GROUP):
    """(m_block, b·H + h, b, h, h_kv) for a 1-D grid over (batch, head, query block), in int64.

    Consecutive programs share a head (its K/V stay in L2); the longest causal rows start first."""
    pid = tl.program_id(0).to(tl.int64)
    m_block = num_m_blocks - 1 - pid % num_m_blocks
    bh = pid // num_m_blocks
    h = bh % H
    return m_block, bh, bh // H, h, h // GROUP


@triton.jit
def head_desc(
    ptr, b, h, stride_b, stride_h, stride_n, seqlen,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The (seqlen, HEAD_DIM) rows of head h in batch b of a (B, N, H, D) tensor, BLOCK_ROWS at a time."""
    return tl.make_tensor_descriptor(
        ptr + b * stride_b + h * stride_h, [seqlen, HEAD_DIM], [stride_n, 1], [BLOCK_ROWS, BLOCK_D]
    )


@triton.jit
def dot_operand(x, DOT_FP32: tl.constexpr):
    """``x`` as the dots take it: upcast to fp32 where the interpreter cannot multiply its dtype."""
    if DOT_FP32:
        x = x.to(tl.float32)
    return x


@triton.jit
def sequence_rows(b, cu_seqlens_ptr, total, seqlen, IS_VARLEN: tl.constexpr):
    """(base, length) of sequence b: ``head_desc(ptr, base, ...)`` then addresses its rows. Dense: base is
    b itself (the launcher passes the batch stride). Varlen: base is the sequence's first row of the
    packed tensor (the launcher passes the row stride as the batch stride), and cu_seqlens is clamped so
    that bad values can never address a row outside [0, total)."""
    if IS_VARLEN:
        start = tl.minimum(tl.maximum(tl.load(cu_seqlens_ptr + b), 0), total)
        end = tl.minimum(tl.maximum(tl.load(cu_seqlens_ptr + b + 1), start), total)
        return start.to(tl.int64), end - start
    return b, seqlen
