"""Rotary embedding kernel: one program per (BLOCK_M tokens, sequence, head), whole rows of D.

Semantics: flashtile.reference.rotary (flash_attn's ``apply_rotary``); the features past the rotary
dimension are copied, so the output row is complete, and in place is safe (a program loads its rows
entirely before storing them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtile.kernels import configs
from flashtile.kernels._layout import cdiv, launch
from flashtile.kernels._rotary import rotate_rows


@triton.jit
def rotary_kernel(
    X, OUT, COS, SIN, OFFSETS, CU_SEQLENS,
    stride_xb, stride_xm, stride_xh, stride_ob, stride_om, stride_oh,
    seqlen, seqlen_ro, offset,
    HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, HAS_OFFSETS: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    start = b * stride_xb
    out_start = b * stride_ob
    if IS_VARLEN:
        first = tl.load(CU_SEQLENS + b).to(tl.int64)
        seqlen = (tl.load(CU_SEQLENS + b + 1) - first).to(tl.int32)
        start = first * stride_xm
        out_start = first * stride_om
    if HAS_OFFSETS:
        offset = tl.load(OFFSETS + b).to(tl.int32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    row_mask = (offs_m < seqlen)[:, None]
    rows = X + start + h * stride_xh + offs_m.to(tl.int64)[:, None] * stride_xm
    pos = (offs_m + offset)[:, None]
    x = rotate_rows(
        rows, offs_d, pos, row_mask, COS, SIN, seqlen_ro, HEAD_DIM, ROTARY_DIM, INTERLEAVED, CONJUGATE
    )  # [BLOCK_M, BLOCK_D]
    out_rows = OUT + out_start + h * stride_oh + offs_m.to(tl.int64)[:, None] * stride_om
    tl.store(out_rows + offs_d, x.to(OUT.dtype.element_ty), mask=row_mask & (offs_d < HEAD_DIM))


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    conjugate: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate validated ``x`` (B, N, H, D), or (total, H, D) with ``cu_seqlens`` int32 (B + 1,) and
    ``max_seqlen``, into ``out`` (a new tensor when None; ``x`` itself for in place).

    ``cos``/``sin`` (seqlen_ro, rotary_dim / 2) contiguous on x's device; ``seqlen_offsets`` an int or an
    integer (B,) tensor on x's device. Returns ``out``.
    """
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    varlen = cu_seqlens is not None
    if x.numel() == 0:
        return out
    if varlen:
        batch, seqlen = cu_seqlens.shape[0] - 1, max_seqlen
        x_strides = (0, x.stride(0), x.stride(1))
        o_strides = (0, out.stride(0), out.stride(1))
    else:
        batch, seqlen = x.shape[0], x.shape[1]
        x_strides = (x.stride(0), x.stride(1), x.stride(2))
        o_strides = (out.stride(0), out.stride(1), out.stride(2))
    if batch == 0 or seqlen == 0:
        return out
    has_offsets = isinstance(seqlen_offsets, torch.Tensor)
    head_dim = x.shape[-1]
    cfg = configs.rows_config(head_dim, x.device)
    grid = (cdiv(seqlen, cfg.BLOCK_M), batch, x.shape[-2])
    launch(
        rotary_kernel, grid, x.device,
        x, out, cos, sin, seqlen_offsets if has_offsets else None, cu_seqlens, *x_strides, *o_strides,
        seqlen, cos.shape[0], 0 if has_offsets else int(seqlen_offsets),
        HEAD_DIM=head_dim, ROTARY_DIM=2 * cos.shape[-1], BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=cfg.BLOCK_M, INTERLEAVED=interleaved, CONJUGATE=conjugate, HAS_OFFSETS=has_offsets,
        IS_VARLEN=varlen, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out
