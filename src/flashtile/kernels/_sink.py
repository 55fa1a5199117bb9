"""The learnable attention sink: a per-head logit that joins the softmax denominator and takes no value.

Row ``i`` of head ``h`` has ``lse_i = log(Σ_j e^{s_ij} + e^{sink_h})`` and ``P_ij = e^{s_ij − lse_i}``;
the sink's own probability ``e^{sink_h − lse_i}`` multiplies no value row. Derivation and gradient:
docs/design/sinks.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


def sink_grad(learnable_sink: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``d sink_h = −Σ_rows e^{sink_h − lse} · Δ`` (float32 (H,)), from the LSE and ``Δ = rowsum(dO∘O)``
    laid out alike: (B, H, N_q) dense or (H, total_q) varlen."""
    heads_dim = lse.dim() - 2
    # (H, 1) broadcasts over the rows of (B, H, N_q) and of (H, total_q) alike.
    sink = learnable_sink.to(lse.dtype).view(-1, 1)
    # Rows with lse = −inf (sink −inf, no key) have Δ = 0; keep their term 0 rather than NaN.
    p_sink = torch.where(torch.isneginf(lse), 0.0, torch.exp(sink - lse))
    dims = [d for d in range(lse.dim()) if d != heads_dim]
    return -(p_sink * delta).sum(dim=dims)
