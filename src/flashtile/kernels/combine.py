"""Merging partial attention results: the split-KV decode's combine, written for context parallelism too.

Each of S partial results covers a disjoint part of every row's keys and gives that part's normalised
output ``o_s`` and log-sum-exp ``lse_s``. With ``m = max_s lse_s`` and ``w_s = exp(lse_s − m)``:
``out = Σ_s w_s·o_s / Σ_s w_s`` and ``lse = m + log Σ_s w_s``, in fp32 (docs/design/decode.md, "Combine").
A part with ``lse_s = −∞`` saw no key: its weight is 0 and its ``o_s`` is never multiplied (it may hold
anything, NaN included); a row where every part has ``−∞`` gets ``out = 0`` and ``lse = −∞``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from flashtile.kernels import configs
from flashtile.kernels._layout import cdiv, launch

LOG2_E = tl.constexpr(math.log2(math.e))
LN_2 = tl.constexpr(math.log(2.0))


@triton.jit
def merge_parts(
    o_rows, lse_rows, stride_ps, stride_ls, num_splits, row_ok, d_ok, offs_d,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """``(out, lse)`` fp32 of BLOCK_R rows whose part s lies at ``o_rows + s·stride_ps`` (the row's D values,
    ``offs_d``) and ``lse_rows + s·stride_ls``."""
    offs_s = tl.arange(0, BLOCK_S)
    m = tl.full([BLOCK_R], -float("inf"), tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    den = tl.zeros([BLOCK_R], tl.float32)
    # BLOCK_S parts at once: their loads are independent, so one memory latency serves them all; the o
    # loads do not wait on the lse loads (a part's o is read whatever its lse and dropped below).
    for s0 in range(0, num_splits, BLOCK_S):
        parts = s0 + offs_s
        ok = (parts < num_splits)[:, None] & row_ok[None, :]
        lse_s = tl.load(lse_rows[None, :] + parts[:, None] * stride_ls, mask=ok, other=-float("inf"))
        o_s = tl.load(
            o_rows[None, :, None] + parts[:, None, None] * stride_ps + offs_d[None, None, :],
            mask=ok[:, :, None] & d_ok[None, None, :],
            other=0.0,
        ).to(tl.float32)  # [S, R, D]
        m_new = tl.maximum(m, tl.max(lse_s, 0))
        # A row no part saw so far keeps m = −inf: subtracting 0 instead avoids −inf − (−inf).
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        w = tl.math.exp2((lse_s - m_ref[None, :]) * LOG2_E)  # [S, R]
        seen = lse_s > -float("inf")
        alpha = tl.math.exp2((m - m_ref) * LOG2_E)
        # 0·NaN is NaN: a part that saw no key must not be multiplied at all.
        acc = acc * alpha[:, None] + tl.sum(tl.where(seen[:, :, None], w[:, :, None] * o_s, 0.0), 0)
        den = den * alpha + tl.sum(w, 0)
        m = m_new
    empty = den == 0.0
    out = acc / tl.where(empty, 1.0, den)[:, None]
    m_ref = tl.where(m == -float("inf"), 0.0, m)
    lse = tl.where(empty, -float("inf"), m_ref + tl.math.log2(tl.where(empty, 1.0, den)) * LN_2)
    return out, lse


@triton.jit
def attn_combine_kernel(
    o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, num_splits, num_rows, N, H,
    stride_ps, stride_pb, stride_pn, stride_ph, stride_ls, stride_lb, stride_lh, stride_ln,
    stride_ob, stride_on, stride_oh, stride_lse_b, stride_lse_h, stride_lse_n,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
    AFTER_PRIOR_GRID: tl.constexpr,
):  # fmt: skip
    if AFTER_PRIOR_GRID:
        # Launched early (programmatic dependent launch): wait until the kernel before it has finished and
        # its partial results are visible.
        gdc_wait()
    # Rows are (b, n, h) with h fastest: a block of rows is consecutive heads of one token, one contiguous
    # stretch of a (B, N, H, D) output.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    h = rows % H
    n = (rows // H) % N
    b = rows // (H * N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    out, lse = merge_parts(
        o_part_ptr + b * stride_pb + n * stride_pn + h * stride_ph,
        lse_part_ptr + b * stride_lb + h * stride_lh + n * stride_ln,
        stride_ps, stride_ls, num_splits, row_ok, d_ok, offs_d, BLOCK_R, BLOCK_D, BLOCK_S,
    )  # fmt: skip
    o_out = o_ptr + (b * stride_ob + n * stride_on + h * stride_oh)[:, None] + offs_d[None, :]
    tl.store(o_out, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lse_b + h * stride_lse_h + n * stride_lse_n, lse, mask=row_ok)


def attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    after_prior_grid: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge S partial ``(out, lse)`` results of the same rows into one, in fp32.

    ``out_partial`` is ``(S, B, N, H, D)`` and ``lse_partial`` ``(S, B, H, N)`` (flash_attn's layouts with a
    leading part axis), any float dtype and strides with a unit last stride; or ``(S, R, D)`` and ``(S, R)``,
    rows of no particular structure (taken as B = H = 1). Returns ``out`` ``(B, N, H, D)`` (``(R, D)``) in
    ``out_dtype`` and ``lse`` ``(B, H, N)`` (``(R,)``) fp32, or writes into the given ``out``/``lse`` of those
    shapes. Parts with ``lse = −∞`` contribute nothing; rows no part saw give ``out = 0``, ``lse = −∞``.
    ``after_prior_grid`` (Hopper and later): launched with programmatic dependent launch, so that it starts
    while the kernel that writes the parts, which must call ``gdc_launch_dependents``, is still running.

    >>> o = torch.ones(2, 3, 4)
    >>> l = torch.tensor([[0.0, float("-inf"), 1.0], [0.0, float("-inf"), float("-inf")]])
    >>> attn_combine(o, l)[1].tolist()
    [0.6931471824645996, -inf, 1.0]
    """
    flat = out_partial.dim() == 3
    if flat:
        o5, l4 = out_partial[:, None, :, None], lse_partial[:, None, None, :]
    else:
        o5, l4 = out_partial, lse_partial
    parts, batch, seqlen, heads, head_dim = o5.shape
    if out is None:
        out = torch.empty(out_partial.shape[1:], dtype=out_dtype, device=o5.device)
    if lse is None:
        lse = torch.empty(lse_partial.shape[1:], dtype=torch.float32, device=o5.device)
    o4 = out[None, :, None] if flat else out
    l3 = lse[None, None, :] if flat else lse
    num_rows = batch * seqlen * heads
    if num_rows == 0 or head_dim == 0:
        return out, lse
    sms = configs.multiprocessor_count(o5.device)
    block_s, block_r = configs.combine_blocks(parts, configs.block_d(head_dim), num_rows, sms)
    launch(
        attn_combine_kernel, (cdiv(num_rows, block_r),), o5.device,
        o5, l4, o4, l3, parts, num_rows, seqlen, heads,
        *o5.stride()[:4], *l4.stride(), *o4.stride()[:3], *l3.stride(),
        HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_R=block_r, BLOCK_S=block_s,
        AFTER_PRIOR_GRID=after_prior_grid, launch_pdl=after_prior_grid,
    )  # fmt: skip
    return out, lse
