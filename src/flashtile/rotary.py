"""Rotary position embedding with flash_attn's ``flash_attn.layers.rotary.apply_rotary_emb`` API.

The Triton kernel (:mod:`flashtile.kernels.rotary`) runs on CUDA and under Triton's CPU interpreter, the
PyTorch reference (:mod:`flashtile.reference.rotary`) on the CPU; ``FLASHTILE_BACKEND`` chooses as for
attention (:mod:`flashtile.backend`). Differentiable: the gradient of a rotation is the inverse rotation.
"""

from __future__ import annotations

from typing import Any

import torch

from flashtile import backend as _backend
from flashtile import ops_kvcache as _ops
from flashtile import validation
from flashtile.errors import FlashtileTypeError, FlashtileValueError

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class ApplyRotaryEmb(torch.autograd.Function):
    """``ApplyRotaryEmb.apply(x, cos, sin, interleaved, inplace, offset, offsets, cu_seqlens,
    max_seqlen, backend)`` on validated inputs; ctx bookkeeping only."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        interleaved: bool,
        inplace: bool,
        offset: int,
        offsets: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        max_seqlen: int,
        backend: str,
    ) -> torch.Tensor:
        run = _ops.rotary if torch.compiler.is_compiling() else _ops.run_rotary
        # The kernels read rows of unit stride.
        src = x if x.stride(-1) == 1 else x.contiguous()
        out = run(src, cos, sin, interleaved, offset, offsets, cu_seqlens, max_seqlen, False, backend)
        ctx.save_for_backward(cos, sin, offsets, cu_seqlens)
        ctx.options = (interleaved, offset, max_seqlen, backend)
        if inplace:
            ctx.mark_dirty(x)
            return x.copy_(out)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        cos, sin, offsets, cu_seqlens = ctx.saved_tensors
        interleaved, offset, max_seqlen, backend = ctx.options
        run = _ops.rotary if torch.compiler.is_compiling() else _ops.run_rotary
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        dx = run(dout, cos, sin, interleaved, offset, offsets, cu_seqlens, max_seqlen, True, backend)
        return (dx,) + (None,) * 9


def _check_seqlen_offsets(seqlen_offsets: object, batch: int, device: torch.device) -> tuple[int, Any]:
    if isinstance(seqlen_offsets, torch.Tensor):
        accepted = f"an int or an int32/int64 tensor of shape ({batch},) on {device}"
        if seqlen_offsets.dtype not in (torch.int32, torch.int64) or tuple(seqlen_offsets.shape) != (batch,):
            raise FlashtileValueError(
                f"seqlen_offsets must be {accepted}; got {validation.describe(seqlen_offsets)}"
            )
        if seqlen_offsets.device != device:
            raise FlashtileValueError(
                f"seqlen_offsets must be {accepted}; got a tensor on {seqlen_offsets.device}"
            )
        return 0, seqlen_offsets.contiguous()
    if not validation._is_int(seqlen_offsets):
        raise FlashtileTypeError(
            f"seqlen_offsets must be an int or a (batch,) tensor; got {seqlen_offsets!r}"
        )
    return int(seqlen_offsets), None


def _check_table_length(seqlen_ro: int, seqlen: int, offset: int, int_offset: bool, varlen: bool) -> None:
    """flash_attn's apply_rotary asserts these (free to check on the host): a row of cos/sin for every
    position of the longest sequence, and for an int offset for every shifted position too."""
    length = "max_seqlen" if varlen else "seqlen (x dim 1)"
    if seqlen_ro < seqlen:
        raise FlashtileValueError(
            f"cos and sin must have at least {length} = {seqlen} rows; got seqlen_ro = {seqlen_ro}"
        )
    if int_offset and not 0 <= offset <= seqlen_ro - seqlen:
        raise FlashtileValueError(
            f"an int seqlen_offsets must be in [0, seqlen_ro − {length}] = [0, {seqlen_ro - seqlen}] "
            f"(cos and sin have {seqlen_ro} rows); got {offset}"
        )


def check_cos_sin(
    cos: object, sin: object, head_dim: int, device: torch.device, names=("cos", "sin")
) -> None:
    """``cos`` and ``sin``: floating tensors of one shape ``(seqlen_ro, rotary_dim / 2)`` on ``device``
    with ``rotary_dim ≤ head_dim``."""
    validation.check_tensors(**dict(zip(names, (cos, sin), strict=True)))
    accepted = f"(seqlen_ro, rotary_dim / 2) with rotary_dim ≤ headdim = {head_dim}"
    for name, t in zip(names, (cos, sin), strict=True):
        if t.dtype not in _FLOAT_DTYPES:
            raise FlashtileTypeError(f"{name} must be a floating tensor; got dtype {t.dtype}")
        if t.device != device:
            raise FlashtileValueError(f"{name} must be on {device}; got a tensor on {t.device}")
        if t.dim() != 2 or 2 * t.shape[1] > head_dim:
            raise FlashtileValueError(f"{name} must have shape {accepted}; got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise FlashtileValueError(
            f"{names[0]} and {names[1]} must have the same shape {accepted}; got {tuple(cos.shape)} and "
            f"{tuple(sin.shape)}"
        )


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim = 2 · cos.shape[-1]`` features of every head of ``x``
    (flash_attn 2.8's ``flash_attn.layers.rotary.apply_rotary_emb``).

    Token ``t`` of sequence ``b`` is at position ``p = seqlen_offsets[b] + t`` and the feature pairs
    ``(m, m + rotary_dim/2)`` (GPT-NeoX, the default) or ``(2m, 2m + 1)`` (GPT-J, ``interleaved=True``)
    are rotated by the angle whose cosine and sine are ``cos[p, m]``, ``sin[p, m]``; features from
    rotary_dim on pass through. As in flash_attn, ``seqlen_ro`` must be at least the (longest) sequence's
    length, and an int offset must keep every position inside the table; a position that a tensor offset
    puts outside ``[0, seqlen_ro)`` is left unrotated, as in flash_attn's kernel. Computed in float32
    (float64 for float64 x) and rounded to x's dtype.

    Arguments:
        x: (batch_size, seqlen, nheads, headdim), or (total_seqlen, nheads, headdim) with cu_seqlens.
            float16, bfloat16, float32 or float64 (the Triton interpreter: float16, float32).
        cos, sin: (seqlen_ro, rotary_dim / 2), floating, on x's device; rotary_dim ≤ headdim.
        interleaved: bool, default False. GPT-J pairs instead of GPT-NeoX halves.
        inplace: bool, default False. Write the result into x (and return x).
        seqlen_offsets: int, or (batch_size,) int32/int64 tensor on x's device, default 0. Shifts the
            positions of each sequence (the cache length during decoding).
        cu_seqlens: (batch_size + 1,) int32 on x's device, or None: x is a packed batch; positions count
            from each sequence's start.
        max_seqlen: int, the longest sequence; required with cu_seqlens.

    Returns:
        x's shape and dtype; differentiable with respect to x (cos and sin get no gradient).

    Example::

        >>> x = torch.randn(2, 5, 4, 64)
        >>> angle = torch.outer(torch.arange(16.0), 1e-2 ** torch.linspace(0, 1, 16))
        >>> apply_rotary_emb(x, angle.cos(), angle.sin(), seqlen_offsets=3).shape  # rotary_dim 32
        torch.Size([2, 5, 4, 64])
    """
    validation.check_tensors(x=x)
    varlen = cu_seqlens is not None
    layout = "(total_seqlen, nheads, headdim)" if varlen else "(batch_size, seqlen, nheads, headdim)"
    validation.check_rank("x", x, layout)
    backend = _backend.resolve(x.device)
    validation.check_dtypes(backend, x=x)
    check_cos_sin(cos, sin, x.shape[-1], x.device)
    interleaved = validation.check_flag("interleaved", interleaved)
    inplace = validation.check_flag("inplace", inplace)
    if varlen:
        max_q, _ = validation.check_cu_seqlens(
            cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, x.shape[0], x.shape[0], x.device,
            ("cu_seqlens", "cu_seqlens", "max_seqlen", "max_seqlen"),
        )  # fmt: skip
        batch = cu_seqlens.shape[0] - 1
    else:
        max_q, batch = x.shape[1], x.shape[0]
    offset, offsets = _check_seqlen_offsets(seqlen_offsets, batch, x.device)
    _check_table_length(cos.shape[0], max_q, offset, offsets is None, varlen)
    cos, sin = cos.contiguous(), sin.contiguous()
    return ApplyRotaryEmb.apply(
        x, cos, sin, interleaved, inplace, offset, offsets, cu_seqlens, max_q, backend
    )
