"""Rotary position embedding (RoPE) by definition: flash_attn's ``layers.rotary`` semantics in PyTorch.

The first ``rotary_dim = 2 · cos.shape[-1]`` features of every head are rotated in pairs, the rest pass
through. Token ``t`` of sequence ``b`` sits at position ``p = seqlen_offsets[b] + t`` (``t`` counted
inside the sequence under varlen) and its pair ``(x₀, x₁)`` becomes

    (x₀ · cos[p, m] − x₁ · sin[p, m],   x₀ · sin[p, m] + x₁ · cos[p, m])

where the pairs are ``(m, m + rotary_dim / 2)`` (GPT-NeoX, ``interleaved=False``) or ``(2m, 2m + 1)``
(GPT-J, ``interleaved=True``). A position outside ``[0, seqlen_ro)`` is left unrotated (cos = 1,
sin = 0), as flash_attn's Triton kernel does. ``conjugate`` negates sin: the inverse rotation, which is
also the rotation's gradient. Computed in float32 (float64 for float64 inputs) and rounded to x's dtype.
"""

from __future__ import annotations

import torch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def positions(
    shape: torch.Size | tuple[int, ...],
    seqlen_offsets: int | torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """The position of every token: int64 ``(B, N)`` for x ``(B, N, H, D)``, ``(total,)`` under varlen."""
    if cu_seqlens is None:
        batch, seqlen = shape[0], shape[1]
        pos = torch.arange(seqlen, device=device)[None, :].expand(batch, seqlen)
        if isinstance(seqlen_offsets, torch.Tensor):
            return pos + seqlen_offsets.to(device=device, dtype=torch.int64)[:, None]
        return pos + seqlen_offsets
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    tokens = torch.arange(shape[0], device=device)
    seq = (torch.searchsorted(cu[1:], tokens, right=True)).clamp(max=max(cu.shape[0] - 2, 0))
    pos = tokens - cu[seq]
    if isinstance(seqlen_offsets, torch.Tensor):
        return pos + seqlen_offsets.to(device=device, dtype=torch.int64)[seq]
    return pos + seqlen_offsets


def cos_sin_at(
    cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin rows at ``pos`` (any shape), ``(*pos.shape, rotary_dim / 2)`` in ``dtype``;
    identity (1, 0) where ``pos`` is outside the table."""
    inside = ((pos >= 0) & (pos < cos.shape[0]))[..., None]
    index = pos.clamp(0, max(cos.shape[0] - 1, 0))
    c = torch.where(inside, cos[index].to(dtype), torch.ones((), dtype=dtype, device=pos.device))
    s = torch.where(inside, sin[index].to(dtype), torch.zeros((), dtype=dtype, device=pos.device))
    return c, s


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, conjugate: bool = False
) -> torch.Tensor:
    """Rotate ``x`` ``(..., H, D)`` by per-token ``cos``, ``sin`` ``(..., rotary_dim / 2)``; x's dtype."""
    half = cos.shape[-1]
    dtype = _compute_dtype(x.dtype)
    c, s = cos[..., None, :].to(dtype), sin[..., None, :].to(dtype)
    if conjugate:
        s = -s
    xf = x.to(dtype)
    if interleaved:
        x0, x1 = xf[..., 0 : 2 * half : 2], xf[..., 1 : 2 * half : 2]
    else:
        x0, x1 = xf[..., :half], xf[..., half : 2 * half]
    o0, o1 = x0 * c - x1 * s, x0 * s + x1 * c
    rotated = torch.stack((o0, o1), dim=-1).flatten(-2) if interleaved else torch.cat((o0, o1), dim=-1)
    return torch.cat((rotated, xf[..., 2 * half :]), dim=-1).to(x.dtype)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    conjugate: bool = False,
) -> torch.Tensor:
    """``x`` ``(B, N, H, D)`` (or ``(total, H, D)`` with ``cu_seqlens``) rotated; a new tensor.

    >>> x = torch.tensor([[[[1.0, 0.0]]]])  # one token, one head, rotary_dim 2
    >>> angle = torch.tensor([[0.0], [torch.pi / 2]])
    >>> apply_rotary(x, angle.cos(), angle.sin(), seqlen_offsets=1).round().tolist()
    [[[[0.0, 1.0]]]]
    """
    pos = positions(x.shape, seqlen_offsets, cu_seqlens, x.device)
    c, s = cos_sin_at(cos, sin, pos, _compute_dtype(x.dtype))
    return rotate(x, c, s, interleaved, conjugate)
