"""Autograd for attention: ctx bookkeeping and the calls to the forward and backward, nothing else.

Eagerly, ``FlashAttnFunction`` calls :func:`flashtile.ops.run_attn_fwd` / ``run_attn_bwd`` directly: going
through the custom ops and their registered autograd costs ≈ 0.2 ms more per forward on a Hopper host
(``benchmarks/launch_overhead.py``), as much as the kernel itself at short sequences. Under torch.compile it
calls the custom ops, which the compiler traces as opaque nodes with fake implementations.

The log-sum-exp output is not differentiable. Double backward (``create_graph=True`` followed by a second
differentiation through attention) raises a RuntimeError when the second differentiation reaches attention.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from flashtile import ops as _ops
from flashtile.mods import Mods
from flashtile.validation import VMAP_OVER_CU_SEQLENS

DOUBLE_BACKWARD_MESSAGE = (
    "flashtile attention does not support double backward: its backward is not differentiable. "
    "Differentiate through attention once (create_graph=False), or use the reference "
    "flashtile.reference.naive.attention for higher-order gradients."
)


class _NoDoubleBackward(torch.autograd.Function):
    """Passes the gradients through; differentiating them again raises a clear error."""

    @staticmethod
    def forward(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, *graph_inputs: torch.Tensor) -> Any:
        return dq.view_as(dq), dk.view_as(dk), dv.view_as(dv)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        # Nothing to keep; a separate setup_context is what torch.func.grad requires.
        pass

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alibi_slopes: torch.Tensor | None,
    rng_state: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    learnable_sink: torch.Tensor | None,
    options: tuple[Any, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FlashAttnFunction``'s forward without the ctx: ``(out, lse)``."""
    scale, causal, backend, left, right, softcap, dropout_p, max_q, max_k, _, mods, plan = options
    result = None if plan is None else plan.forward(q, k, v, alibi_slopes, rng_state, learnable_sink)
    if result is None:
        run = _ops.attn_fwd if torch.compiler.is_compiling() else _ops.run_attn_fwd
        # The custom ops have no mods (under torch.compile the interface runs such a call eagerly).
        with_mods = {} if mods is None else {"mods": mods}
        result = run(
            q, k, v, scale, causal, backend, left, right, softcap, alibi_slopes, dropout_p, rng_state,
            cu_seqlens_q, cu_seqlens_k, max_q, max_k, learnable_sink, **with_mods,
        )  # fmt: skip
    out, lse = result
    return out, lse


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    """What the backward of ``FlashAttnFunction`` needs, kept on ``ctx``."""
    q, k, v, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, learnable_sink, options = inputs
    out, lse = output
    ctx.save_for_backward(
        q, k, v, out, lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, learnable_sink
    )
    ctx.mark_non_differentiable(lse)
    # The LSE takes no gradient: without this autograd would allocate and zero one per backward.
    ctx.set_materialize_grads(False)
    ctx.options = options


class FlashAttnFunction(torch.autograd.Function):
    """``(out, lse) = FlashAttnFunction.apply(q, k, v, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k,
    learnable_sink, options)`` on validated inputs: the tensors one by one (autograd sees each), and
    ``options`` = ``(softmax_scale, causal, backend, window_left, window_right, softcap, dropout_p,
    max_seqlen_q, max_seqlen_k, deterministic, mods, plan)`` as one tuple (each argument of ``apply`` costs it
    about 0.2 µs: docs/design/host_path.md).

    The options (``rng_state`` included, so the backward regenerates the forward's dropout mask) are kept
    for the backward; nothing of size N_q × N_k is. ``learnable_sink`` is the one differentiable option: its
    gradient comes back when it requires grad.
    """

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # The arguments are _forward's (the class docstring names them).
        output = _forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple[Any, ...]:
        q, k, v, out, lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, sink = ctx.saved_tensors
        scale, causal, backend, left, right, softcap, dropout_p, max_q, max_k, deterministic, mods, plan = (
            ctx.options
        )
        if dout is None:
            # Unmaterialised: when the loss reaches this node without out (gradcheck, a sink-only loss), None.
            dout = torch.zeros_like(out)
        # Grad mode is off in a backward unless create_graph=True: no_grad costs ~1 µs only to do nothing.
        if torch._C._are_functorch_transforms_active() and not torch.compiler.is_compiling():
            # Under torch.func the backward may run on batched tensors (vmap over grad, jacrev): the kernels
            # are reached through a Function with a vmap rule, which also refuses a second differentiation.
            grads = _AttnBwdFunction.apply(
                dout, q, k, v, out, lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, sink,
                ctx.options,
            )  # fmt: skip
            return _needed_grads(ctx, grads, sink)
        create_graph = torch.is_grad_enabled()
        with torch.no_grad() if create_graph else contextlib.nullcontext():
            grads = None
            if plan is not None:
                grads = plan.backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, sink)
            if grads is None:
                run = _ops.attn_bwd if torch.compiler.is_compiling() else _ops.run_attn_bwd
                with_mods = {} if mods is None else {"mods": mods}
                grads = run(
                    dout, q, k, v, out, lse, scale, causal, backend, left, right, softcap, alibi_slopes,
                    dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, max_q, max_k, sink,
                    deterministic=deterministic, **with_mods,
                )  # fmt: skip
        dq, dk, dv = grads[:3]
        if create_graph:
            graph_inputs = [t for t in (dout, q, k, v) if t.requires_grad]
            if graph_inputs:
                dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, *graph_inputs)
        return _needed_grads(ctx, (dq, dk, dv, *grads[3:]), sink)


def _needed_grads(ctx: Any, grads: tuple[torch.Tensor, ...], sink: torch.Tensor | None) -> tuple[Any, ...]:
    """``FlashAttnFunction.backward``'s return from ``(dq, dk, dv[, dsink])``: each where asked for, and
    None for the slopes, RNG state and cu_seqlens (the slopes take none, as in flash_attn)."""
    needs = ctx.needs_input_grad
    dq, dk, dv = grads[:3]
    # A prepared call without a sink returns (dq, dk, dv) alone.
    dsink = grads[3].to(sink.dtype) if needs[7] else None
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
            None, None, None, None, dsink, None)  # fmt: skip


def _fold_into_heads(x: torch.Tensor | None, bdim: int | None, size: int, heads_axis: int) -> Any:
    """``x`` with vmap's batch dimension (``size`` copies when ``x`` is not batched) merged into its heads
    axis (negative, of one sample), sample-major: ``(..., H, ...)`` → ``(..., size·H, ...)``. Samples become
    heads, which attention keeps apart; grouped-query heads stay with their KV head."""
    if x is None:
        return None
    if bdim is None:
        at = x.dim() + heads_axis
        x = x.unsqueeze(at).expand(*x.shape[:at], size, *x.shape[at:])
    else:
        x = x.movedim(bdim, 0).movedim(0, heads_axis - 1)
    return x.flatten(heads_axis - 1, heads_axis)


def _unfold_heads(x: torch.Tensor, size: int, heads_axis: int) -> tuple[torch.Tensor, int]:
    """``_fold_into_heads`` undone on an output: ``(x, its batch dimension)`` for vmap."""
    x = x.unflatten(heads_axis, (size, x.shape[heads_axis] // size))
    return x, x.dim() + heads_axis - 1


def _check_vmap_call(info: Any, in_dims: tuple[Any, ...], options: tuple[Any, ...], dims_of: str) -> None:
    """What torch.vmap over attention cannot do, refused with the reason."""
    cu_seqlens_dims = in_dims[5:7] if dims_of == "forward" else in_dims[8:10]
    if any(dim is not None for dim in cu_seqlens_dims):
        raise NotImplementedError(f"torch.vmap over cu_seqlens is not supported: {VMAP_OVER_CU_SEQLENS}")
    mods, dropout_p = options[10], options[6]
    if mods is not None:
        raise NotImplementedError(
            "torch.vmap over attention with a block_mask, mask_mod or score_mod is not supported; "
            "vmap over plain attention and its built-in options"
        )
    if dropout_p > 0 and info.randomness != "different":
        raise RuntimeError(
            f"torch.vmap over attention with dropout_p={dropout_p} needs randomness='different' (each sample "
            f"its own dropout mask); got randomness={info.randomness!r}"
        )


def _one_rng_state(rng_state: torch.Tensor | None, bdim: int | None) -> torch.Tensor | None:
    """One (seed, offset) for the folded call: under randomness='different' vmap draws one a sample, and
    the samples, now heads, already take their own masks from one."""
    return rng_state if rng_state is None or bdim is None else rng_state.select(bdim, 0)


class _FlashAttnFunctionForTransforms(FlashAttnFunction):
    """``FlashAttnFunction`` in the form torch.func transforms (``torch.func.grad``) require: forward
    without ctx and a separate ``setup_context``. Only used under a transform: in this form ``apply`` binds
    the arguments through ``inspect.signature`` at every call, ~35 µs.

    Under ``torch.vmap`` the mapped dimension is folded into the heads (q, k, v, the slopes, the sink) and
    one call runs every sample."""

    @staticmethod
    def forward(*inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return _forward(*inputs)

    setup_context = staticmethod(_setup_context)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *inputs: Any) -> tuple[Any, tuple[int, int]]:
        q, k, v, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, sink, options = inputs
        _check_vmap_call(info, in_dims, options, "forward")
        size = info.batch_size
        q, k, v = (_fold_into_heads(t, dim, size, -2) for t, dim in zip((q, k, v), in_dims[:3], strict=True))
        alibi_slopes = _fold_into_heads(alibi_slopes, in_dims[3], size, -1)
        sink = _fold_into_heads(sink, in_dims[7], size, -1)
        rng_state = _one_rng_state(rng_state, in_dims[4])
        # The prepared plain call was made for one sample's shapes.
        options = (*options[:-1], None)
        out, lse = _FlashAttnFunctionForTransforms.apply(
            q, k, v, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, sink, options
        )
        (out, out_dim), (lse, lse_dim) = _unfold_heads(out, size, -2), _unfold_heads(lse, size, -2)
        return (out, lse), (out_dim, lse_dim)


class _AttnBwdFunction(torch.autograd.Function):
    """The backward's kernels as a Function, for torch.func: ``(dq, dk, dv, dsink) = apply(dout, q, k, v,
    out, lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, learnable_sink, options)``. Its vmap rule
    folds the samples into the heads as the forward's does; differentiating it raises."""

    @staticmethod
    def forward(*inputs: Any) -> tuple[torch.Tensor, ...]:
        dout, q, k, v, out, lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, sink, options = inputs
        scale, causal, backend, left, right, softcap, dropout_p, max_q, max_k, deterministic, mods, _ = (
            options
        )
        run = _ops.attn_bwd if torch.compiler.is_compiling() else _ops.run_attn_bwd
        with_mods = {} if mods is None else {"mods": mods}
        return run(
            dout, q, k, v, out, lse, scale, causal, backend, left, right, softcap, alibi_slopes, dropout_p,
            rng_state, cu_seqlens_q, cu_seqlens_k, max_q, max_k, sink, deterministic=deterministic,
            **with_mods,
        )  # fmt: skip

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *inputs: Any) -> tuple[Any, tuple[int, ...]]:
        options = inputs[-1]
        _check_vmap_call(info, in_dims, options, "backward")
        size = info.batch_size
        dout, q, k, v, out, lse = (
            _fold_into_heads(t, dim, size, -2) for t, dim in zip(inputs[:6], in_dims[:6], strict=True)
        )
        alibi_slopes = _fold_into_heads(inputs[6], in_dims[6], size, -1)
        sink = _fold_into_heads(inputs[10], in_dims[10], size, -1)
        rng_state = _one_rng_state(inputs[7], in_dims[7])
        grads = _AttnBwdFunction.apply(
            dout, q, k, v, out, lse, alibi_slopes, rng_state, *inputs[8:10], sink, (*options[:-1], None)
        )
        unfolded = [_unfold_heads(g, size, -2) for g in grads[:3]]
        dsink, dsink_dim = grads[3], None
        if sink is not None:
            dsink, dsink_dim = _unfold_heads(dsink, size, -1)
        return (*(g for g, _ in unfolded), dsink), (*(d for _, d in unfolded), dsink_dim)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    deterministic: bool = False,
    mods: Mods | None = None,
    learnable_sink: torch.Tensor | None = None,
    plan: object | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``(out, lse)`` of validated inputs and normalised options (``lse`` carries no
    gradient); ``rng_state`` is required when ``dropout_p > 0`` (:func:`flashtile.ops.draw_rng_state`);
    ``mods`` (block mask, mask_mod, score_mod, aux_tensors) is kept for the backward as it is;
    ``learnable_sink`` (H,) in the LSE's dtype is differentiable; ``plan``: the backend's prepared plain
    call (:func:`flashtile.backend.prepare`), which runs the kernels where it takes the call.

    With nothing to differentiate (grad mode off, or no input requiring grad) eager calls skip the
    autograd.Function, whose bookkeeping costs ~10 µs a call and would be thrown away."""
    inputs_need_grad = q.requires_grad or k.requires_grad or v.requires_grad
    for option in (alibi_slopes, learnable_sink):
        inputs_need_grad = inputs_need_grad or (option is not None and option.requires_grad)
    transforms = not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()
    # Under torch.func (vmap even without a gradient) the call goes through the Function, which has the rules.
    if (
        not (inputs_need_grad and torch.is_grad_enabled())
        and not torch.compiler.is_compiling()
        and not transforms
    ):
        result = None if plan is None else plan.forward(q, k, v, alibi_slopes, rng_state, learnable_sink)
        if result is not None:
            return result
        # run_attn_fwd takes the sink before mods (the custom op's schema ends with its tensors).
        return _ops.run_attn_fwd(
            q, k, v, softmax_scale, causal, backend, *window_size, softcap, alibi_slopes, dropout_p,
            rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, learnable_sink, mods,
        )  # fmt: skip
    options = (
        softmax_scale, causal, backend, *window_size, softcap, dropout_p, max_seqlen_q, max_seqlen_k,
        deterministic, mods, plan,
    )  # fmt: skip
    function = _FlashAttnFunctionForTransforms if transforms else FlashAttnFunction
    return function.apply(
        q, k, v, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, learnable_sink, options
    )
