"""Autograd for attention: ctx bookkeeping and the calls to the forward and backward, nothing else.

Eagerly, ``FlashAttnFunction`` calls :func:`flashtile.ops.run_attn_fwd` / ``run_attn_bwd`` directly: going
through the custom ops and their registered autograd costs ≈ 0.2 ms more per forward on a Hopper host
(``benchmarks/launch_overhead.py``), as much as the kernel itself at short sequences. Under torch.compile it
calls the custom ops, which the compiler traces as opaque nodes with fake implementations.

The log-sum-exp output is not differentiable. Double backward (``create_graph=True`` followed by a second
differentiation through attention) raises a RuntimeError when the second differentiation reaches attention.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtile import ops as _ops

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


class FlashAttnFunction(torch.autograd.Function):
    """``(out, lse) = FlashAttnFunction.apply(q, k, v, softmax_scale, causal, backend)``; inputs validated."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float,
        causal: bool,
        backend: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        run = _ops.attn_fwd if torch.compiler.is_compiling() else _ops.run_attn_fwd
        out, lse = run(q, k, v, softmax_scale, causal, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.backend = backend
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        run = _ops.attn_bwd if torch.compiler.is_compiling() else _ops.run_attn_bwd
        with torch.no_grad():
            dq, dk, dv = run(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.backend)
        graph_inputs = [t for t in (dout, q, k, v) if t.requires_grad]
        if torch.is_grad_enabled() and graph_inputs:
            dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, *graph_inputs)
        needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
        # softmax_scale, causal and backend are not tensors: they get no gradient.
        return dq if needs_q else None, dk if needs_k else None, dv if needs_v else None, None, None, None


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``(out, lse)`` of validated inputs (``lse`` carries no gradient)."""
    return FlashAttnFunction.apply(q, k, v, softmax_scale, causal, backend)
