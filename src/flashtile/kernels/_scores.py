"""Score modifiers of a tile: softcap and ALiBi, in the base-2 domain the kernels work in.

From the raw ``qk = q·kᵀ``: ``s = scale·qk``, then ``s ← c·tanh(s / c)`` (softcap c > 0), then
``s ← s − slope·|i + off − j|`` (ALiBi); the kernels keep ``s·log2(e)``. Derivation:
docs/design/online_softmax.md and docs/design/backward.md, "Where each option enters".
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

TWO_LOG2_E = tl.constexpr(2.0 * math.log2(math.e))


@triton.jit
def tanh(x, FAST_TANH: tl.constexpr):
    """tanh of fp32 ``x``. On the GPU (FAST_TANH) one MUFU instruction, ``tanh.approx.f32`` (relative
    error ≤ 2⁻¹⁰·⁹⁹, the instruction flash-attention's CUDA kernels use). The interpreter runs no inline
    asm: there through exp2, with exact limits ±1 for large |x| (exp2 overflows to inf or underflows to 0)."""
    if FAST_TANH:
        return tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 - 2.0 / (tl.math.exp2(x * TWO_LOG2_E) + 1.0)


@triton.jit
def base2_scores(
    qk, rows, cols, qk_scale, softcap_qk, softcap_out, alibi_slope, diag_offset,
    HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr, HAS_ALIBI: tl.constexpr,
):  # fmt: skip
    """``(s·log2(e), tanh)`` of a tile; ``softcap_qk = scale / c``, ``softcap_out = c·log2(e)``,
    ``alibi_slope`` already times log2(e); ``rows`` and ``cols`` broadcast to the tile. ``tanh`` (the
    capped fraction the backward needs) is ``qk`` itself without softcap. ``FAST_TANH``: see ``tanh``."""
    if HAS_SOFTCAP:
        t = tanh(qk * softcap_qk, FAST_TANH)
        s = t * softcap_out
    else:
        t = qk
        s = qk * qk_scale
    if HAS_ALIBI:
        # Positions convert before they broadcast (a conversion per row and per column, not per score); the
        # fp32 difference is exact below 2^24 and its absolute value is free in the FMA that uses it.
        s = s - alibi_slope * tl.abs((rows + diag_offset).to(tl.float32) - cols.to(tl.float32))
    return s, t
