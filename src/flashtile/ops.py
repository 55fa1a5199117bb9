"""The custom ops ``torch.ops.flashtile.attn_fwd``, ``attn_bwd`` and ``dropout_keep_mask``, their fake
implementations, and the plain functions ``run_attn_fwd``, ``run_attn_bwd``, ``run_dropout_keep_mask`` that
implement them.

Each dispatches by its ``backend`` argument (``"hopper"``, ``"triton"`` or ``"reference"``) through the
backend table, :func:`flashtile.backend.launcher`. Inputs are assumed validated and the
options normalised (docs/design/options.md): every option travels as a flat argument, ``window_left`` and
``window_right`` with −1 = unlimited, ``softcap`` 0 = off, ``rng_state`` an int64 ``(seed, offset)``
tensor when ``dropout_p > 0``, ``cu_seqlens_q`` given for a packed (varlen) batch, whose q is
``(total_q, H, D)`` and lse ``(H, total_q)``, and ``learnable_sink`` a float32 ``(H,)`` tensor or None.
V's head dim may differ from Q's and K's: ``out`` and ``dv`` have V's. The ops are what torch.compile
traces; eager autograd (:mod:`flashtile.autograd`) calls the plain functions, which skips the op
dispatcher's per-call cost.

Empty problems never reach a backend: with no batch, no queries or no heads the outputs are empty (and
``dk``, ``dv`` are zeros), and with no keys every row is fully masked, so ``out = 0``, ``lse = −inf``
(the sink's logit with a learnable sink) and ``dq = 0``. ``attn_bwd`` also returns the sink's gradient,
float32 ``(H,)``, or an empty tensor without a sink (a custom op returns a fixed number of tensors).
"""

from __future__ import annotations

import functools
import inspect

import torch

from flashtile.backend import BACKENDS, launcher
from flashtile.mods import Mods

# Seeds and offsets are drawn below 2⁶²: any int64 below that is a valid (seed, offset).
RNG_BOUND = 2**62


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def _is_empty(q: torch.Tensor, k: torch.Tensor, varlen: bool) -> bool:
    """No query row or no key to attend to: the outputs follow without a backend."""
    dims = (q.shape[0], q.shape[1]) if varlen else (q.shape[0], q.shape[1], q.shape[2])
    return 0 in dims or k.shape[0 if varlen else 1] == 0


def _out_shape(q: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    return (*q.shape[:-1], v.shape[-1])


def _empty_lse(q: torch.Tensor, varlen: bool, learnable_sink: torch.Tensor | None) -> torch.Tensor:
    """The LSE of rows that see no key: −inf, or the sink's logit (the sink is all their softmax)."""
    lse = torch.full(_lse_shape(q, varlen), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    if learnable_sink is not None:
        # (H, 1) broadcasts over (B, H, N_q) and (H, total_q).
        lse.copy_(learnable_sink.view(-1, 1).expand_as(lse))
    return lse


def _lse_shape(q: torch.Tensor, varlen: bool) -> tuple[int, ...]:
    if varlen:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs (the reference path keeps full precision for gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, contiguous; ``t`` itself, without the ~1 µs of two dispatcher calls, when it is."""
    return t if t.dtype == dtype and t.is_contiguous() else t.to(dtype).contiguous()


def draw_rng_state(device: torch.device) -> torch.Tensor:
    """dropout's ``(seed, offset)``: int64 ``(2,)`` on ``device``, from PyTorch's generator for that device.

    Drawn on the device without a host synchronisation, so ``torch.manual_seed`` reproduces a run and a
    CUDA graph captures the draw.
    """
    return torch.randint(0, RNG_BOUND, (2,), dtype=torch.int64, device=device)


def _options(
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    dropout_p: float,
    rng_state: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    learnable_sink: torch.Tensor | None,
    mods: Mods | None,
) -> dict[str, object]:
    """The launchers' keywords (the same for the Triton kernels and the tiled reference)."""
    return dict(
        mods=mods,
        window_size=(window_left, window_right),
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
        rng_state=rng_state,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q if cu_seqlens_q is not None else None,
        max_seqlen_k=max_seqlen_k if cu_seqlens_q is not None else None,
        learnable_sink=learnable_sink,
    )


def run_attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: ``out`` like ``q`` with V's head dim; ``lse`` (B, H, N_q), or (H, total_q) for
    varlen, in :func:`lse_dtype`, natural log. ``mods`` (block mask, mask_mod, score_mod, aux_tensors) is
    not part of the custom op: its functions are compile-time arguments of the kernels."""
    _check_backend(backend)
    varlen = cu_seqlens_q is not None
    if _is_empty(q, k, varlen):
        out = torch.zeros(_out_shape(q, v), dtype=q.dtype, device=q.device)
        return out, _empty_lse(q, varlen, learnable_sink)
    options = _options(
        window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state,
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, learnable_sink, mods,
    )  # fmt: skip
    out, lse = launcher(backend, "attn_fwd", q, k, v, options)(q, k, v, softmax_scale, causal, **options)
    return _as(out, q.dtype), _as(lse, lse_dtype(q.dtype))


def _without_mods(fn):
    """``fn`` as its custom op sees it: the same signature less ``mods``, which is not a schema type."""

    @functools.wraps(fn)
    def op(*args, **kwargs):
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    op.__signature__ = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name != "mods"]
    )
    op.__annotations__ = {name: hint for name, hint in fn.__annotations__.items() if name != "mods"}
    del op.__wrapped__
    return op


attn_fwd = torch.library.custom_op("flashtile::attn_fwd", _without_mods(run_attn_fwd), mutates_args=())


@attn_fwd.register_fake
def _attn_fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty(_out_shape(q, v))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=lse_dtype(q.dtype))
    return out, lse


def run_attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: torch.Tensor | None = None,
    deterministic: bool = False,
    mods: Mods | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dsink)``: the first three contiguous with the shape and dtype of ``q``, ``k``, ``v``;
    ``dsink`` the learnable sink's gradient in :func:`lse_dtype` ``(H,)``, or an empty tensor without a
    sink. The options and ``rng_state`` must be the forward's (the dropout mask is regenerated from it)."""
    _check_backend(backend)
    if learnable_sink is None:
        dsink = q.new_empty((0,), dtype=lse_dtype(q.dtype))
    else:
        # No row with a key means out = 0, Δ = 0: the sink gets no gradient (kept for the empty paths).
        dsink = torch.zeros(learnable_sink.shape, dtype=lse_dtype(q.dtype), device=q.device)
    if _is_empty(q, k, cu_seqlens_q is not None):
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        return dq, dk, dv, dsink
    options = _options(
        window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state,
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, learnable_sink, mods,
    )  # fmt: skip
    launch = launcher(backend, "attn_bwd", q, k, v, options)
    grads = launch(dout, q, k, v, out, lse, softmax_scale, causal, **options, deterministic=deterministic)
    if learnable_sink is not None:
        dsink = grads[3].to(dsink.dtype)
    dq, dk, dv = grads[:3]
    return _as(dq, q.dtype), _as(dk, k.dtype), _as(dv, v.dtype), dsink


attn_bwd = torch.library.custom_op("flashtile::attn_bwd", _without_mods(run_attn_bwd), mutates_args=())


@attn_bwd.register_fake
def _attn_bwd_fake(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    learnable_sink: torch.Tensor | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    sink_shape = (0,) if learnable_sink is None else learnable_sink.shape
    dsink = q.new_empty(sink_shape, dtype=lse_dtype(q.dtype))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


def _attn_fwd_setup_context(ctx, inputs: tuple, output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, scale, causal, backend, left, right, softcap, slopes, dropout_p, rng_state = inputs[:12]
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, learnable_sink = inputs[12:]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, slopes, rng_state, cu_seqlens_q, cu_seqlens_k, learnable_sink)
    ctx.options = (scale, causal, backend, left, right, softcap, dropout_p, max_seqlen_q, max_seqlen_k)


def _attn_fwd_backward(ctx, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple:
    """``attn_fwd``'s own gradient, for graphs that hold the op outside :mod:`flashtile.autograd` (a
    torch.export'ed model being trained): ``attn_bwd``; the LSE takes no gradient, as eagerly."""
    q, k, v, out, lse, slopes, rng_state, cu_seqlens_q, cu_seqlens_k, sink = ctx.saved_tensors
    scale, causal, backend, left, right, softcap, dropout_p, max_seqlen_q, max_seqlen_k = ctx.options
    dq, dk, dv, dsink = attn_bwd(
        dout, q, k, v, out, lse, scale, causal, backend, left, right, softcap, slopes, dropout_p, rng_state,
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sink,
    )  # fmt: skip
    needs = ctx.needs_input_grad
    dsink = dsink.to(sink.dtype) if sink is not None and needs[16] else None
    # One gradient per input: q, k, v, then 13 options that take none (slopes, as in flash_attn), the sink.
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None, *[None] * 13, dsink)


attn_fwd.register_autograd(_attn_fwd_backward, setup_context=_attn_fwd_setup_context)


def run_dropout_keep_mask(
    rng_state: torch.Tensor,
    dropout_p: float,
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    backend: str,
) -> torch.Tensor:
    """The keep mask the forward drew for ``rng_state``: bool ``(batch, nheads, seqlen_q, seqlen_k)`` on
    rng_state's device, True = kept; the same bits from either backend."""
    _check_backend(backend)
    # The Hopper backend runs dropout in the portable kernels: the same bits.
    if backend != "reference":
        from flashtile.kernels._dropout import dropout_mask

        return dropout_mask(rng_state, dropout_p, batch, nheads, seqlen_q, seqlen_k)
    from flashtile.reference.naive import dropout_mask

    return dropout_mask(rng_state, dropout_p, batch, nheads, seqlen_q, seqlen_k).contiguous()


dropout_keep_mask = torch.library.custom_op(
    "flashtile::dropout_keep_mask", run_dropout_keep_mask, mutates_args=()
)


@dropout_keep_mask.register_fake
def _dropout_keep_mask_fake(
    rng_state: torch.Tensor,
    dropout_p: float,
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    backend: str,
) -> torch.Tensor:
    return rng_state.new_empty((batch, nheads, seqlen_q, seqlen_k), dtype=torch.bool)
