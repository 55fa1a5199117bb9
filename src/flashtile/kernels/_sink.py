"""The learnable attention sink: a per-head logit that joins the softmax denominator and takes no value.

Row ``i`` of head ``h`` has ``lse_i = log(Σ_j e^{s_ij} + e^{sink_h})`` and ``P_ij = e^{s_ij − lse_i}``;
the sink's own probability ``e^{sink_h − lse_i}`` multiplies no value row. Derivation and gradient:
docs/design/sinks.md.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

# Kernels may read only constexpr globals.
LOG2_E = tl.constexpr(math.log2(math.e))


@triton.jit
def fold_sink(acc, l_i, m_i, sink2):
    """Add the sink (base-2 logit ``sink2``) to the finished online softmax ``(acc, ℓ, m)`` of a row block.

    The running max moves to ``max(m, sink2)`` so that a sink far above the scores cannot overflow ℓ;
    a row that saw no key ends with ``ℓ = 1`` at ``m = sink2``: out 0, lse = sink."""
    m_new = tl.maximum(m_i, sink2)
    # A sink of −inf on a row with no key: keep ℓ = 0 (out 0, lse −inf) without −inf − (−inf).
    m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.math.exp2(sink2 - m_ref)
    return acc * alpha[:, None], l_i, m_new


@triton.jit
def store_sink_grad_rows(dsink_row_ptr, sink_ptr, h, lse2, pdp, offs_m, seqlen_q):
    """Store each row's term ``−P_sink · Δ`` of ``d sink_h = −Σ_rows P_sink · Δ``, with ``P_sink =
    2^(sink·log2 e − lse2)`` (``lse2`` base 2, +inf on rows past the end, so their term is 0) and
    ``Δ = pdp = Σ_j P∘dP`` of the row."""
    p_sink = tl.math.exp2(tl.load(sink_ptr + h) * LOG2_E - lse2)
    tl.store(dsink_row_ptr + offs_m, -p_sink * pdp, mask=offs_m < seqlen_q)
