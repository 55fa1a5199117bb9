"""Autograd for ``torch.ops.flashtile.attn_fwd``: ctx bookkeeping and the call to ``attn_bwd``, nothing else.

The log-sum-exp output is not differentiable. Double backward (``create_graph=True`` followed by a second
differentiation through attention) raises a RuntimeError when the second differentiation reaches attention.
"""

from __future__ import annotations

from typing import Any

import torch

DOUBLE_BACKWARD_MESSAGE = (
    "flashtile attention does not support double backward: its backward is not differentiable. "
    "Differentiate through attention once (create_graph=False), or use the reference "
    "flashtile.reference.naive.attention for higher-order gradients."
)


class _NoDoubleBackward(torch.autograd.Function):
    """Passes the gradients through; differentiating them again raises a clear error."""

    @staticmethod
    def forward(
        ctx: Any, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, *graph_inputs: torch.Tensor
    ) -> Any:
        return dq.view_as(dq), dk.view_as(dk), dv.view_as(dv)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


def attn_fwd_setup_context(
    ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]
) -> None:
    q, k, v, softmax_scale, causal, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.backend = backend


def attn_fwd_backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    with torch.no_grad():
        dq, dk, dv = torch.ops.flashtile.attn_bwd(
            dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.backend
        )
    graph_inputs = [t for t in (dout, q, k, v) if t.requires_grad]
    if torch.is_grad_enabled() and graph_inputs:
        dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, *graph_inputs)
    needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
    grads = (dq if needs_q else None, dk if needs_k else None, dv if needs_v else None)
    # softmax_scale, causal and backend are not tensors: they get no gradient.
    return grads + (None,) * (len(ctx.needs_input_grad) - len(grads))
