"""What a split-KV decode program works on, shared by the portable decode kernel (kernels/decode.py) and
the Hopper TMA one (kernels/hopper/decode.py, which calls these Triton functions from Gluon).

A decode grid has one program per (batch b, KV head, split, block of packed query rows); row blocks of
one (b, KV head, split) are neighbours, so they read the same keys while those are in L2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_coordinates(pid, num_m_blocks, num_splits, H_KV):
    """``(m_block, split, h_kv, b)`` of program ``pid`` (in the integer type ``pid`` comes in)."""
    m_block = pid % num_m_blocks
    split = (pid // num_m_blocks) % num_splits
    h_kv = (pid // (num_m_blocks * num_splits)) % H_KV
    b = pid // (num_m_blocks * num_splits * H_KV)
    return m_block, split, h_kv, b


@triton.jit
def sequence_keys(seqlens_ptr, leftpad_ptr, b, capacity, HAS_LEFTPAD: tl.constexpr):
    """``(leftpad, n_k)`` of sequence b: its left pad and its number of keys. Lengths are clamped to the
    cache and pads to the length, so bad values can never address a slot outside the cache."""
    seqlen = tl.minimum(tl.maximum(tl.load(seqlens_ptr + b), 0), capacity)
    leftpad = 0
    if HAS_LEFTPAD:
        leftpad = tl.minimum(tl.maximum(tl.load(leftpad_ptr + b), 0), seqlen)
    return leftpad, seqlen - leftpad
