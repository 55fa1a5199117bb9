"""Backward kernels: the delta preprocess, dK/dV (one program per K/V block), dQ (one per Q block).

Derivation: docs/design/backward.md. P is recomputed from Q, K and the stored log-sum-exp;
``dS = P ∘ (dP − Δ)`` with ``Δ_i = rowsum(dO_i ∘ O_i)``. dK/dV and dQ are computed by separate
programs, each owning its output tile, so there are no atomics and the result is deterministic.
GQA: a dK/dV program loops over every query head of its group and sums their contributions.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from flashtile.kernels import configs
from flashtile.kernels._block_sparse import (
    NO_MODS,
    block_list,
    call_mod,
    kernel_mods,
    listed_below,
    listed_tile,
    mask_tile,
    modded_scores,
)
from flashtile.kernels._dropout import dropout_keep, dropout_keep_t, load_rng_state
from flashtile.kernels._launch_cache import KernelLaunch
from flashtile.kernels._layout import as_descriptor_operand, cdiv, grid_seqlen, padded_head_dim
from flashtile.kernels._masking import visible, visible_span
from flashtile.kernels._scores import base2_scores
from flashtile.kernels._sink import store_sink_grad_rows
from flashtile.kernels._tiles import dot_operand, head_desc, query_block_of_program, sequence_rows
from flashtile.kernels.fwd import (
    FWD_UNSPECIALISED,
    LOG2_E,
    LOG2_E_C,
    RUNTIME_SIZES,
    WINDOW_ARGS,
    alibi_stride_b,
    dot_options,
    kernel_options,
    option_tensors,
    pick_kernel,
    strided_values,
)
from flashtile.mods import Mods


@triton.jit
def attn_bwd_preprocess_kernel(
    o_ptr,
    do_ptr,
    delta_ptr,
    stride_ob,
    stride_on,
    stride_oh,
    stride_dob,
    stride_don,
    stride_doh,
    seqlen_q,
    num_m_blocks,
    H,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Δ[b, h, i] = Σ_d O[b, i, h, d] · dO[b, i, h, d], in fp32."""
    # A 1-D grid: CUDA caps grid dims y and z at 65,535, and B·H reaches that in training.
    pid = tl.program_id(0).to(tl.int64)
    m_block = pid % num_m_blocks
    bh = pid // num_m_blocks
    b = bh // H
    h = bh % H
    # int64 rows (m_block is): offs_m · stride_on passes 2³¹ in a tensor of more than 2³¹ elements.
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(
        o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    do = tl.load(
        do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_ptr + bh * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _load_row_stats(lse_ptr, delta_ptr, offs_m, seqlen_q):
    """LSE in base 2 and Δ for rows offs_m; rows past the end or with no visible key get LSE = +inf,
    which makes their recomputed P exactly 0."""
    in_range = offs_m < seqlen_q
    lse = tl.load(lse_ptr + offs_m, mask=in_range, other=float("inf"))
    lse = tl.where(lse == -float("inf"), float("inf"), lse) * 1.4426950408889634
    delta = tl.load(delta_ptr + offs_m, mask=in_range, other=0.0)
    return lse, delta


@triton.jit
def _recompute_p(
    qk, rows, cols, lse, seqlen_k, lo_diag, hi_diag, qk_scale, softcap_qk, softcap_out, alibi_slope,
    diag_offset, MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr, HAS_ALIBI: tl.constexpr,
    seqlen_q, b, h, aux, MASK_MOD: tl.constexpr, MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr,
    SCORE_MOD_AUX: tl.constexpr, SCORE_MOD_BWD: tl.constexpr, SCORE_MOD_BWD_AUX: tl.constexpr,
):  # fmt: skip
    """P = exp2(s·log2(e) − lse) of a tile from the raw q·kᵀ (0 where masked), the softcap's tanh and
    score_mod's derivative (1.0 without); ``rows``, ``cols`` and ``lse`` broadcast to the tile (which is
    Pᵀ in the dK/dV kernel)."""
    s, t = base2_scores(
        qk, rows, cols, qk_scale, softcap_qk, softcap_out, alibi_slope, diag_offset, HAS_SOFTCAP, FAST_TANH,
        HAS_ALIBI,
    )  # fmt: skip
    mod_grad = 1.0
    if SCORE_MOD is not None:
        s, s_in = modded_scores(s, b, h, rows, cols, seqlen_q, seqlen_k, aux, SCORE_MOD, SCORE_MOD_AUX)
        mod_grad = call_mod(s_in, b, h, rows, cols, seqlen_q, seqlen_k, aux, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX)
    p = tl.math.exp2(s - lse)
    if MASKED:
        keep = visible(rows, cols, seqlen_k, lo_diag, hi_diag, IS_LOCAL)
        if MASK_MOD is not None:
            keep = keep & call_mod(None, b, h, rows, cols, seqlen_q, seqlen_k, aux, MASK_MOD, MASK_MOD_AUX)
        p = tl.where(keep, p, 0.0)
    return p, t, mod_grad


@triton.jit
def _score_grad(p, dp, delta, t, mod_grad, HAS_SOFTCAP: tl.constexpr):
    """dS with respect to the scaled score ``scale·q·kᵀ``: P ∘ (dP − Δ), times score_mod's derivative
    ``mod_grad``, times 1 − tanh² under softcap."""
    ds = p * (dp - delta) * mod_grad
    if HAS_SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds


@triton.jit
def _attn_bwd_dkdv_steps(
    dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, start_m, end_m, offs_n, qk_scale, seqlen_q,
    seqlen_k, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
    dropout_threshold, dropout_scale, bh,
    MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, DOT_FP32: tl.constexpr,
    b, h, aux, blocks, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr, MASK_MOD: tl.constexpr,
    MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_AUX: tl.constexpr,
    SCORE_MOD_BWD: tl.constexpr, SCORE_MOD_BWD_AUX: tl.constexpr,
):  # fmt: skip
    """Accumulate into dK, dV the contributions of queries [start_m, end_m), K-side (transposed) so
    that Pᵀ and dSᵀ feed the next dots directly. SPARSE: the range is over the listed ``blocks``."""
    if HAS_DROPOUT:
        # The program's key block, where its dropout draws start.
        key0 = tl.min(offs_n, 0)
    for it in tl.range(start_m, end_m, BLOCK_M):
        m0 = listed_tile(it, blocks, SPARSE, SPARSE_BLOCK)
        q = dot_operand(q_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
        do = dot_operand(do_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_DV]
        offs_m = m0 + tl.arange(0, BLOCK_M)
        lse, delta = _load_row_stats(lse_ptr, delta_ptr, offs_m, seqlen_q)
        s_t = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_M]
        if HAS_SOFTCAP or HAS_ALIBI or MASKED or SCORE_MOD is not None:
            p_t, t_t, g_t = _recompute_p(
                s_t, offs_m[None, :], offs_n[:, None], lse[None, :], seqlen_k, lo_diag, hi_diag, qk_scale,
                softcap_qk, softcap_out, alibi_slope, diag_offset, MASKED, IS_LOCAL, HAS_SOFTCAP, FAST_TANH,
                HAS_ALIBI, seqlen_q, b, h, aux, MASK_MOD, MASK_MOD_AUX, SCORE_MOD, SCORE_MOD_AUX,
                SCORE_MOD_BWD,
                SCORE_MOD_BWD_AUX,
            )  # fmt: skip
        else:
            p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
            t_t = s_t
            g_t = 1.0
        dp_t = tl.dot(v, tl.trans(do))  # [BLOCK_N, BLOCK_M]
        if HAS_DROPOUT:
            keep_t = dropout_keep_t(
                seed, rng_offset, dropout_threshold, bh, key0, m0, offs_n.shape[0], BLOCK_M
            )
            # dV takes the dropped P (its 1/(1 − p) is applied once at the end); dP the mask and scale.
            dv = tl.dot(tl.where(keep_t, p_t, 0.0).to(do.dtype), do, dv)
            dp_t = tl.where(keep_t, dp_t * dropout_scale, 0.0)
        else:
            dv = tl.dot(p_t.to(do.dtype), do, dv)
        ds_t = _score_grad(p_t, dp_t, delta[None, :], t_t, g_t, HAS_SOFTCAP)
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit(do_not_specialize=[*WINDOW_ARGS, "num_n_blocks"])
def attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    alibi_ptr, rng_state_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_dob, stride_don, stride_doh, stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    stride_lse_h, stride_alibi_b,
    seqlen_q, seqlen_k, num_n_blocks, qk_scale, softmax_scale, window_left, window_right,
    softcap_qk, softcap_out, dropout_threshold, dropout_scale, H, GROUP, heads_per_program,
    count_ptr, index_ptr, full_count_ptr, full_index_ptr, stride_mask_b, stride_mask_h, mask_row_len, aux,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_LOCAL: tl.constexpr, HAS_WINDOW_LEFT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_FP32: tl.constexpr,
    HAS_BLOCK_MASK: tl.constexpr, SPARSE_BLOCK_M: tl.constexpr, SPARSE_BLOCK_N: tl.constexpr,
    MASK_MOD: tl.constexpr, MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_AUX: tl.constexpr,
    SCORE_MOD_BWD: tl.constexpr, SCORE_MOD_BWD_AUX: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # A program sums the query heads [h_out·heads_per_program, (h_out + 1)·heads_per_program) into head
    # h_out of dK/dV: the whole GQA group (heads_per_program = GROUP, dK/dV have the K/V heads), or one head
    # into a per-query-head buffer the launcher sums (heads_per_program = 1: GROUP times the programs).
    pid = tl.program_id(0).to(tl.int64)
    n_block = pid % num_n_blocks
    bh_out = pid // num_n_blocks
    H_OUT = H // heads_per_program
    b = bh_out // H_OUT
    h_out = bh_out % H_OUT
    h_kv = h_out * heads_per_program // GROUP
    n0 = (n_block * BLOCK_N).to(tl.int32)
    q_base, seqlen_q_b = sequence_rows(b, cu_seqlens_q_ptr, seqlen_q, seqlen_q, IS_VARLEN)
    k_base, seqlen_k_b = sequence_rows(b, cu_seqlens_k_ptr, seqlen_k, seqlen_k, IS_VARLEN)
    q_rows = seqlen_q_b
    if IS_VARLEN:
        # The grid covers the longest sequence; blocks past this one's end have nothing to do.
        if n0 >= seqlen_k_b:
            return
        # A descriptor over zero rows is not a valid TMA map; a sequence with no queries visits no tile.
        q_rows = tl.maximum(seqlen_q_b, 1)

    k_desc = head_desc(
        k_ptr, k_base, h_kv, stride_kb, stride_kh, stride_kn, seqlen_k_b, HEAD_DIM, BLOCK_N, BLOCK_D
    )
    v_desc = head_desc(
        v_ptr, k_base, h_kv, stride_vb, stride_vh, stride_vn, seqlen_k_b, HEAD_DIM_V, BLOCK_N, BLOCK_DV
    )
    dk_desc = head_desc(
        dk_ptr, k_base, h_out, stride_dkb, stride_dkh, stride_dkn, seqlen_k_b, HEAD_DIM, BLOCK_N, BLOCK_D
    )
    dv_desc = head_desc(
        dv_ptr, k_base, h_out, stride_dvb, stride_dvh, stride_dvn, seqlen_k_b, HEAD_DIM_V, BLOCK_N, BLOCK_DV
    )
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k = dot_operand(k_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
    v = dot_operand(v_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_DV]
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    diag_offset = seqlen_k_b - seqlen_q_b
    lo_diag = diag_offset - window_left if HAS_WINDOW_LEFT else None
    hi_diag = diag_offset + window_right
    if IS_LOCAL:
        # The mirror of the forward's span: key j is seen by queries i with j − hi_diag ≤ i ≤ j − lo_diag.
        start_m, unmasked_start, unmasked_end, end_m = visible_span(
            n0, seqlen_k_b, seqlen_q_b, -hi_diag, -lo_diag if HAS_WINDOW_LEFT else None, BLOCK_N, BLOCK_M
        )
        if not HAS_WINDOW_LEFT:
            # Every later query sees the block; queries past the end have P = 0 (their LSE is +inf).
            unmasked_end = end_m
    else:
        start_m, unmasked_start, unmasked_end, end_m = 0, 0, seqlen_q_b, seqlen_q_b
    seed, rng_offset = 0, 0
    if HAS_DROPOUT:
        seed, rng_offset = load_rng_state(rng_state_ptr)

    for g in range(heads_per_program):
        h = h_out * heads_per_program + g
        q_desc = head_desc(
            q_ptr, q_base, h, stride_qb, stride_qh, stride_qn, q_rows, HEAD_DIM, BLOCK_M, BLOCK_D
        )
        do_desc = head_desc(
            do_ptr, q_base, h, stride_dob, stride_doh, stride_don, q_rows, HEAD_DIM_V, BLOCK_M, BLOCK_DV
        )
        bh = b * H + h
        row_stats = h * stride_lse_h + q_base if IS_VARLEN else bh * seqlen_q
        alibi_slope = 0.0
        if HAS_ALIBI:
            alibi_slope = tl.load(alibi_ptr + b * stride_alibi_b + h) * LOG2_E_C
        if HAS_BLOCK_MASK:
            # The query blocks that see this key block: full ones unmasked (queries past the end have
            # P = 0 from their LSE), but for the window; then the partial ones with MASK_MOD.
            mask_row = n0 // SPARSE_BLOCK_N
            full, n_full = block_list(
                full_count_ptr, full_index_ptr, b, h, mask_row, stride_mask_b, stride_mask_h, mask_row_len
            )
            partial, n_partial = block_list(
                count_ptr, index_ptr, b, h, mask_row, stride_mask_b, stride_mask_h, mask_row_len
            )
            if IS_VARLEN:
                n_full = listed_below(full, n_full, tl.cdiv(seqlen_q_b, SPARSE_BLOCK_M))
                n_partial = listed_below(partial, n_partial, tl.cdiv(seqlen_q_b, SPARSE_BLOCK_M))
            dk, dv = _attn_bwd_dkdv_steps(
                dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, 0,
                n_full * SPARSE_BLOCK_M, offs_n, qk_scale, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag,
                softcap_qk,
                softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold, dropout_scale, bh,
                IS_LOCAL, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_M, DOT_FP32, b, h,
                aux,
                full, True, SPARSE_BLOCK_M, None, False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD,
                SCORE_MOD_BWD_AUX,
            )  # fmt: skip
            dk, dv = _attn_bwd_dkdv_steps(
                dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, 0,
                n_partial * SPARSE_BLOCK_M, offs_n, qk_scale, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag,
                softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold,
                dropout_scale, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_M,
                DOT_FP32, b, h, aux, partial, True, SPARSE_BLOCK_M, MASK_MOD, MASK_MOD_AUX, SCORE_MOD,
                SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
            )  # fmt: skip
        else:
            if IS_LOCAL:
                dk, dv = _attn_bwd_dkdv_steps(
                    dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, start_m,
                    unmasked_start, offs_n, qk_scale, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag, softcap_qk,
                    softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold, dropout_scale,
                    bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_M, DOT_FP32,
                    b, h,
                    aux, None, False, 1, None, False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD,
                    SCORE_MOD_BWD_AUX,
                )  # fmt: skip
            dk, dv = _attn_bwd_dkdv_steps(
                dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, unmasked_start,
                unmasked_end, offs_n, qk_scale, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag, softcap_qk,
                softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold, dropout_scale, bh,
                False, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_M, DOT_FP32, b, h, aux,
                None, False, 1, None, False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
            )  # fmt: skip
            if HAS_WINDOW_LEFT:
                dk, dv = _attn_bwd_dkdv_steps(
                    dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, unmasked_end,
                    end_m, offs_n, qk_scale, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag, softcap_qk,
                    softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold, dropout_scale,
                    bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_M, DOT_FP32,
                    b, h,
                    aux, None, False, 1, None, False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD,
                    SCORE_MOD_BWD_AUX,
                )  # fmt: skip

    if HAS_DROPOUT:
        dv = dv * dropout_scale
    dk_desc.store([n0, 0], (dk * softmax_scale).to(dk_desc.dtype))
    dv_desc.store([n0, 0], dv.to(dv_desc.dtype))


@triton.jit
def _attn_bwd_dq_steps(
    dq, pdp, q, do, lse, delta, k_desc, v_desc, start_n, end_n, offs_m, qk_scale, seqlen_k, lo_diag, hi_diag,
    softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold, dropout_scale,
    bh, MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr, HAS_SINK: tl.constexpr,
    seqlen_q, b, h, aux, blocks, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr, MASK_MOD: tl.constexpr,
    MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_AUX: tl.constexpr,
    SCORE_MOD_BWD: tl.constexpr, SCORE_MOD_BWD_AUX: tl.constexpr,
):  # fmt: skip
    """Accumulate into dQ the contributions of keys [start_n, end_n), and with a sink into ``pdp`` the
    rows' Σ P∘dP (Δ in fp32, free of O's rounding; the sink's gradient needs it: docs/design/sinks.md).
    SPARSE: over the listed ``blocks``."""
    BLOCK_M: tl.constexpr = offs_m.shape[0]
    if HAS_DROPOUT:
        # The program's query block, where its dropout draws start.
        m_start = tl.min(offs_m, 0)
    for it in tl.range(start_n, end_n, BLOCK_N):
        n0 = listed_tile(it, blocks, SPARSE, SPARSE_BLOCK)
        k = dot_operand(k_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
        v = dot_operand(v_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_DV]
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if HAS_SOFTCAP or HAS_ALIBI or MASKED or SCORE_MOD is not None:
            p, t, g = _recompute_p(
                s, offs_m[:, None], offs_n[None, :], lse[:, None], seqlen_k, lo_diag, hi_diag, qk_scale,
                softcap_qk, softcap_out, alibi_slope, diag_offset, MASKED, IS_LOCAL, HAS_SOFTCAP, FAST_TANH,
                HAS_ALIBI, seqlen_q, b, h, aux, MASK_MOD, MASK_MOD_AUX, SCORE_MOD, SCORE_MOD_AUX,
                SCORE_MOD_BWD,
                SCORE_MOD_BWD_AUX,
            )  # fmt: skip
        else:
            p = tl.math.exp2(s * qk_scale - lse[:, None])
            t = s
            g = 1.0
        dp = tl.dot(do, tl.trans(v))  # [BLOCK_M, BLOCK_N]
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_offset, dropout_threshold, bh, m_start, n0, BLOCK_M, BLOCK_N)
            dp = tl.where(keep, dp * dropout_scale, 0.0)
        if HAS_SINK:
            pdp += tl.sum(p * dp, 1)
        ds = _score_grad(p, dp, delta[:, None], t, g, HAS_SOFTCAP)
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq, pdp


@triton.jit(do_not_specialize=FWD_UNSPECIALISED)
def attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    alibi_ptr, rng_state_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, sink_ptr, dsink_ptr,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_dob, stride_don, stride_doh, stride_dqb, stride_dqn, stride_dqh,
    stride_lse_h, stride_alibi_b,
    seqlen_q, seqlen_k, num_m_blocks, qk_scale, softmax_scale, window_left, window_right,
    softcap_qk, softcap_out, dropout_threshold, dropout_scale, H, GROUP,
    count_ptr, index_ptr, full_count_ptr, full_index_ptr, stride_mask_b, stride_mask_h, mask_row_len, aux,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_LOCAL: tl.constexpr, HAS_WINDOW_LEFT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_FP32: tl.constexpr,
    HAS_BLOCK_MASK: tl.constexpr, SPARSE_BLOCK_M: tl.constexpr, SPARSE_BLOCK_N: tl.constexpr,
    MASK_MOD: tl.constexpr, MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_AUX: tl.constexpr,
    SCORE_MOD_BWD: tl.constexpr, SCORE_MOD_BWD_AUX: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINK: tl.constexpr,
):  # fmt: skip
    m_block, bh, b, h, h_kv = query_block_of_program(num_m_blocks, H, GROUP)
    m0 = (m_block * BLOCK_M).to(tl.int32)
    q_base, seqlen_q_b = sequence_rows(b, cu_seqlens_q_ptr, seqlen_q, seqlen_q, IS_VARLEN)
    k_base, seqlen_k_b = sequence_rows(b, cu_seqlens_k_ptr, seqlen_k, seqlen_k, IS_VARLEN)
    if IS_VARLEN:
        if m0 >= seqlen_q_b:
            return
        row_stats = h * stride_lse_h + q_base
    else:
        row_stats = bh * seqlen_q
    kv_rows = tl.maximum(seqlen_k_b, 1) if IS_VARLEN else seqlen_k_b
    q_desc = head_desc(
        q_ptr, q_base, h, stride_qb, stride_qh, stride_qn, seqlen_q_b, HEAD_DIM, BLOCK_M, BLOCK_D
    )
    do_desc = head_desc(
        do_ptr, q_base, h, stride_dob, stride_doh, stride_don, seqlen_q_b, HEAD_DIM_V, BLOCK_M, BLOCK_DV
    )
    dq_desc = head_desc(
        dq_ptr, q_base, h, stride_dqb, stride_dqh, stride_dqn, seqlen_q_b, HEAD_DIM, BLOCK_M, BLOCK_D
    )
    k_desc = head_desc(
        k_ptr, k_base, h_kv, stride_kb, stride_kh, stride_kn, kv_rows, HEAD_DIM, BLOCK_N, BLOCK_D
    )
    v_desc = head_desc(
        v_ptr, k_base, h_kv, stride_vb, stride_vh, stride_vn, kv_rows, HEAD_DIM_V, BLOCK_N, BLOCK_DV
    )

    offs_m = m0 + tl.arange(0, BLOCK_M)
    diag_offset = seqlen_k_b - seqlen_q_b
    lo_diag = diag_offset - window_left if HAS_WINDOW_LEFT else None
    hi_diag = diag_offset + window_right
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = tl.load(alibi_ptr + b * stride_alibi_b + h) * LOG2_E_C
    seed, rng_offset = 0, 0
    if HAS_DROPOUT:
        seed, rng_offset = load_rng_state(rng_state_ptr)

    q = dot_operand(q_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
    do = dot_operand(do_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_DV]
    lse, delta = _load_row_stats(lse_ptr + row_stats, delta_ptr + row_stats, offs_m, seqlen_q_b)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pdp = tl.zeros([BLOCK_M], tl.float32) if HAS_SINK else 0.0
    if HAS_BLOCK_MASK:
        # As the forward: full blocks unmasked (but for the window and a block crossing the end), then
        # the partial ones with MASK_MOD.
        mask_row = m0 // SPARSE_BLOCK_M
        full, n_full = block_list(
            full_count_ptr, full_index_ptr, b, h, mask_row, stride_mask_b, stride_mask_h, mask_row_len
        )
        n_clean = listed_below(full, n_full, seqlen_k_b // SPARSE_BLOCK_N)
        partial, n_partial = block_list(
            count_ptr, index_ptr, b, h, mask_row, stride_mask_b, stride_mask_h, mask_row_len
        )
        if IS_VARLEN:
            n_full = listed_below(full, n_full, tl.cdiv(seqlen_k_b, SPARSE_BLOCK_N))
            n_partial = listed_below(partial, n_partial, tl.cdiv(seqlen_k_b, SPARSE_BLOCK_N))
        dq, pdp = _attn_bwd_dq_steps(
            dq, pdp, q, do, lse, delta, k_desc, v_desc, 0, n_clean * SPARSE_BLOCK_N, offs_m, qk_scale,
            seqlen_k_b, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
            dropout_threshold, dropout_scale, bh, IS_LOCAL, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
            HAS_DROPOUT, BLOCK_N, DOT_FP32, HAS_SINK, seqlen_q_b, b, h, aux, full, True, SPARSE_BLOCK_N, None,
            False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
        )  # fmt: skip
        dq, pdp = _attn_bwd_dq_steps(
            dq, pdp, q, do, lse, delta, k_desc, v_desc, n_clean * SPARSE_BLOCK_N, n_full * SPARSE_BLOCK_N,
            offs_m, qk_scale, seqlen_k_b, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset,
            seed, rng_offset, dropout_threshold, dropout_scale, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH,
            HAS_ALIBI, HAS_DROPOUT, BLOCK_N, DOT_FP32, HAS_SINK, seqlen_q_b, b, h, aux, full, True,
            SPARSE_BLOCK_N, None, False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
        )  # fmt: skip
        dq, pdp = _attn_bwd_dq_steps(
            dq, pdp, q, do, lse, delta, k_desc, v_desc, 0, n_partial * SPARSE_BLOCK_N, offs_m, qk_scale,
            seqlen_k_b, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
            dropout_threshold, dropout_scale, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
            HAS_DROPOUT, BLOCK_N, DOT_FP32, HAS_SINK, seqlen_q_b, b, h, aux, partial, True, SPARSE_BLOCK_N,
            MASK_MOD, MASK_MOD_AUX, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
        )  # fmt: skip
        # The dense loops below then have nothing to visit.
        unmasked_start, unmasked_end, end = 0, 0, 0
    elif IS_LOCAL:
        start, unmasked_start, unmasked_end, end = visible_span(
            m0, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag, BLOCK_M, BLOCK_N
        )
        if HAS_WINDOW_LEFT:
            dq, pdp = _attn_bwd_dq_steps(
                dq, pdp, q, do, lse, delta, k_desc, v_desc, start, unmasked_start, offs_m, qk_scale,
                seqlen_k_b, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed,
                rng_offset, dropout_threshold, dropout_scale, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH,
                HAS_ALIBI, HAS_DROPOUT, BLOCK_N, DOT_FP32, HAS_SINK, seqlen_q_b, b, h, aux, None, False, 1,
                None, False, SCORE_MOD, SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
            )  # fmt: skip
    else:
        unmasked_start = 0
        unmasked_end = seqlen_k_b // BLOCK_N * BLOCK_N
        end = seqlen_k_b
    dq, pdp = _attn_bwd_dq_steps(
        dq, pdp, q, do, lse, delta, k_desc, v_desc, unmasked_start, unmasked_end, offs_m, qk_scale,
        seqlen_k_b, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
        dropout_threshold, dropout_scale, bh, False, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT,
        BLOCK_N, DOT_FP32, HAS_SINK, seqlen_q_b, b, h, aux, None, False, 1, None, False, SCORE_MOD,
        SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
    )  # fmt: skip
    dq, pdp = _attn_bwd_dq_steps(
        dq, pdp, q, do, lse, delta, k_desc, v_desc, unmasked_end, end, offs_m, qk_scale, seqlen_k_b,
        lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
        dropout_threshold, dropout_scale, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT,
        BLOCK_N, DOT_FP32, HAS_SINK, seqlen_q_b, b, h, aux, None, False, 1, None, False, SCORE_MOD,
        SCORE_MOD_AUX, SCORE_MOD_BWD, SCORE_MOD_BWD_AUX,
    )  # fmt: skip
    dq_desc.store([m0, 0], (dq * softmax_scale).to(dq_desc.dtype))
    if HAS_SINK:
        store_sink_grad_rows(dsink_ptr + row_stats, sink_ptr, h, lse, pdp, offs_m, seqlen_q_b)


attn_bwd_dkdv_kernel_runtime_sizes = triton.jit(do_not_specialize=RUNTIME_SIZES)(attn_bwd_dkdv_kernel.fn)
attn_bwd_dq_kernel_runtime_sizes = triton.jit(do_not_specialize=RUNTIME_SIZES)(attn_bwd_dq_kernel.fn)


# The tensors of each backward launch, in the kernels' parameter order.
PRE_POINTERS = ("o_ptr", "do_ptr", "delta_ptr")
_OPTION_POINTERS = ("alibi_ptr", "rng_state_ptr", "cu_seqlens_q_ptr", "cu_seqlens_k_ptr")
_LIST_POINTERS = ("count_ptr", "index_ptr", "full_count_ptr", "full_index_ptr", "aux")
DKDV_POINTERS = (
    "q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dk_ptr", "dv_ptr", *_OPTION_POINTERS,
    *_LIST_POINTERS,
)  # fmt: skip
DQ_POINTERS = (
    "q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dq_ptr", *_OPTION_POINTERS, "sink_ptr",
    "dsink_ptr", *_LIST_POINTERS,
)  # fmt: skip


# Everything but the tensors is a function of these arguments: one set of launches per call signature.
@functools.lru_cache(maxsize=512)
def _bwd_launches(
    q_shape: tuple[int, ...],
    strides: tuple[tuple[int, ...], ...],
    dims: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    interpreter: bool,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_stride: int | None,
    dropout_p: float,
    varlen: bool,
    has_sink: bool,
    sizes: tuple[int, int, int, int, int],
    mods_key: tuple,
    config: configs.BwdConfig | None,
) -> tuple[KernelLaunch, KernelLaunch | None, KernelLaunch | None]:
    """The preprocess, dK/dV and dQ launches (None where a grid would be empty). ``strides`` are those of
    q, k, v, dout, out, lse, dq, dk, dv as launched; ``dims`` (heads_kv, head_dim, head_dim_v) unpadded
    (q_shape's last is padded); ``sizes`` (batch, seqlen_q, seqlen_k, total_q, total_k); ``mods_key``
    :attr:`KernelMods.launch_key`; ``interpreter`` keys the dot and tanh switches."""
    batch, seqlen_q, seqlen_k, total_q, total_k = sizes
    heads, d_pad = q_shape[-2], q_shape[-1]
    heads_kv, head_dim, head_dim_v = dims
    dv_pad = padded_head_dim(head_dim_v)
    mod_switches, (kv_stride_b, kv_stride_h, kv_row_len), (q_stride_b, q_stride_h, q_row_len) = mods_key
    mod_switches = dict(mod_switches)
    opts = kernel_options(
        softmax_scale, causal, window_size, softcap, alibi_stride is not None, dropout_p, varlen, total_q
    )
    cfg = config or configs.bwd_config(head_dim, causal, device, head_dim_v)
    block_m1, block_n1 = mask_tile(cfg.BLOCK_M1, mod_switches, 0), mask_tile(cfg.BLOCK_N1, mod_switches, 1)
    block_m2, block_n2 = mask_tile(cfg.BLOCK_M2, mod_switches, 0), mask_tile(cfg.BLOCK_N2, mod_switches, 1)
    bd, bdv = configs.block_d(d_pad), configs.block_d(dv_pad)
    dots = dot_options(dtype)
    dot_fp32 = dots.pop("DOT_FP32")
    q_st, k_st, v_st, do_st, o_st, lse_st, dq_st, dk_st, dv_st = strides
    common = dict(
        **strided_values(("q", "k", "v", "do"), (q_st, k_st, v_st, do_st), varlen),
        stride_lse_h=lse_st[0], stride_alibi_b=alibi_stride or 0, seqlen_q=total_q, seqlen_k=total_k,
        qk_scale=softmax_scale * LOG2_E, softmax_scale=float(softmax_scale), window_left=opts.window_left,
        window_right=opts.window_right, softcap_qk=opts.softcap_qk, softcap_out=opts.softcap_out,
        dropout_threshold=opts.dropout_threshold, dropout_scale=opts.dropout_scale, H=heads,
        GROUP=heads // heads_kv, HEAD_DIM=d_pad, BLOCK_D=bd, HEAD_DIM_V=dv_pad, BLOCK_DV=bdv,
        **opts.switches, **mod_switches, DOT_FP32=dot_fp32,
    )  # fmt: skip

    # Δ is laid out like the LSE; a packed batch is one long sequence to the preprocess (out and dout
    # gain a batch dim of 1, as unsqueeze(0) would give them).
    pre_st = (o_st, do_st) if not varlen else ((total_q * o_st[0], *o_st), (total_q * do_st[0], *do_st))
    pre_batch = 1 if varlen else batch
    pre_block = 64
    num_pre_blocks = cdiv(total_q, pre_block)
    preprocess = KernelLaunch(
        attn_bwd_preprocess_kernel, (num_pre_blocks * pre_batch * heads,), device, PRE_POINTERS,
        dict(
            stride_ob=pre_st[0][0], stride_on=pre_st[0][1], stride_oh=pre_st[0][2], stride_dob=pre_st[1][0],
            stride_don=pre_st[1][1], stride_doh=pre_st[1][2], seqlen_q=total_q, num_m_blocks=num_pre_blocks,
            H=heads, HEAD_DIM=dv_pad, BLOCK_M=pre_block, BLOCK_D=bdv,
        ),
        {},
    )  # fmt: skip

    num_n_blocks = cdiv(seqlen_k, block_n1)
    num_m_blocks = cdiv(seqlen_q, block_m2)
    # A packed batch counts the programs that find rows: the grid's count follows the longest sequence
    # and the number of sequences, which change every training step, and the choice changes the dK/dV
    # kernel's signature (a compilation mid-training each time it flipped).
    busy_programs = cdiv(total_k, block_n1) * heads_kv if varlen else num_n_blocks * batch * heads_kv
    per_head = splits_gqa_groups(busy_programs, heads // heads_kv, device)
    if per_head:
        # dK/dV per query head, in fp32, contiguous: the launcher sums each group's heads.
        rows = total_k if varlen else seqlen_k
        dk_st, dv_st = (per_head_grad_strides(heads, rows, width, varlen) for width in (d_pad, dv_pad))
    dkdv = dq = None
    if num_n_blocks > 0:
        dkdv = KernelLaunch(
            pick_kernel(attn_bwd_dkdv_kernel, attn_bwd_dkdv_kernel_runtime_sizes, total_q, total_k),
            (num_n_blocks * batch * (heads if per_head else heads_kv),), device, DKDV_POINTERS,
            dict(
                **common, **strided_values(("dk", "dv"), (dk_st, dv_st), varlen), num_n_blocks=num_n_blocks,
                heads_per_program=1 if per_head else heads // heads_kv,
                stride_mask_b=q_stride_b, stride_mask_h=q_stride_h, mask_row_len=q_row_len, BLOCK_M=block_m1,
                BLOCK_N=block_n1,
            ),
            dict(num_warps=cfg.num_warps1, num_stages=cfg.num_stages1, **dots),
        )  # fmt: skip
    if num_m_blocks > 0:
        dq = KernelLaunch(
            pick_kernel(attn_bwd_dq_kernel, attn_bwd_dq_kernel_runtime_sizes, total_q, total_k),
            (num_m_blocks * batch * heads,), device, DQ_POINTERS,
            dict(
                **common, **strided_values(("dq",), (dq_st,), varlen), num_m_blocks=num_m_blocks,
                stride_mask_b=kv_stride_b, stride_mask_h=kv_stride_h, mask_row_len=kv_row_len,
                BLOCK_M=block_m2, BLOCK_N=block_n2, HAS_SINK=has_sink,
            ),
            dict(num_warps=cfg.num_warps2, num_stages=cfg.num_stages2, **dots),
        )  # fmt: skip
    return preprocess, dkdv, dq, per_head


# Fewer dK/dV programs than this many per SM leave SMs idle while each program walks its whole GQA group in
# turn (one long packed sequence with 2 K/V heads: 128 programs on 132 SMs, the dK/dV kernel 8× the dQ's).
MIN_DKDV_PROGRAMS_PER_SM = 2


def splits_gqa_groups(programs: int, group: int, device: torch.device) -> bool:
    """Whether the dK/dV kernel runs one program per query head (into per-head buffers summed afterwards)
    rather than one per K/V head walking its group: under GQA, when the grid would be too small."""
    return group > 1 and programs < MIN_DKDV_PROGRAMS_PER_SM * configs.multiprocessor_count(device)


def per_head_grad_strides(heads: int, rows: int, width: int, varlen: bool) -> tuple[int, ...]:
    """Strides of a contiguous per-query-head gradient buffer: (B, N_k, H, width), or (total_k, H, width)."""
    if varlen:
        return (heads * width, width, 1)
    return (rows * heads * width, heads * width, width, 1)


def attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    config: configs.BwdConfig | None = None,
) -> tuple[torch.Tensor, ...]:
    """Launch the backward. Shapes and keywords as in ``fwd.attn_fwd``; ``lse`` float32 from it
    ((B, H, N_q), or (H, total_q) for varlen) and the same ``rng_state``, whose mask is regenerated.

    Returns ``dq``, ``dk``, ``dv``, contiguous, in the dtypes and shapes of q, k, v; with a
    ``learnable_sink`` also its gradient, float32 (H,) (docs/design/sinks.md). The sink enters P only
    through the LSE; the dQ kernel reads it once per row block to write the rows' share of its gradient.
    """
    varlen = cu_seqlens_q is not None
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    heads_kv = k.shape[-2]
    if varlen:
        batch = cu_seqlens_q.shape[0] - 1
        total_q, total_k = q.shape[0], k.shape[0]
        # The grid only: each program finds its sequence's own lengths in cu_seqlens.
        seqlen_q, seqlen_k = grid_seqlen(max_seqlen_q), grid_seqlen(max_seqlen_k)
    else:
        batch, seqlen_q = q.shape[:2]
        seqlen_k = total_k = k.shape[1]
        total_q = seqlen_q
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if dq.numel() == 0 or dk.numel() == 0 or batch == 0:
        grads = (dq.zero_(), dk.zero_(), dv.zero_())
        # Every row's output is 0, so Δ = 0 and the sink gets no gradient.
        if learnable_sink is None:
            return grads
        return (*grads, torch.zeros_like(learnable_sink, dtype=torch.float32))

    d_pad, dv_pad = padded_head_dim(head_dim), padded_head_dim(head_dim_v)
    q, k = (as_descriptor_operand(t, d_pad) for t in (q, k))
    v, dout, out = (as_descriptor_operand(t, dv_pad) for t in (v, dout, out))
    lse = lse.contiguous()
    grads = [g if pad == g.shape[-1] else torch.empty(*g.shape[:-1], pad, dtype=g.dtype, device=g.device)
             for g, pad in ((dq, d_pad), (dk, d_pad), (dv, dv_pad))]  # fmt: skip
    slopes, state, sink = option_tensors(alibi_slopes, dropout_p, rng_state, learnable_sink)
    km = NO_MODS if mods is None else kernel_mods(mods)
    strides = tuple(t.stride() for t in (q, k, v, dout, out, lse, *grads))
    preprocess, dkdv, dq_launch, per_head = _bwd_launches(
        q.shape, strides, (heads_kv, head_dim, head_dim_v), q.dtype,
        q.device, configs.is_interpreter(), softmax_scale, causal, tuple(window_size), softcap,
        alibi_stride_b(slopes), dropout_p, varlen, sink is not None,
        (batch, seqlen_q, seqlen_k, total_q, total_k), km.launch_key, config,
    )  # fmt: skip
    options = (slopes, state, cu_seqlens_q, cu_seqlens_k)
    # Each row's term of the sink's gradient, laid out like the LSE and summed per head at the end.
    dsink_rows = None if sink is None else torch.zeros_like(lse)
    delta = torch.empty_like(lse)
    preprocess(out, dout, delta)
    if dkdv is not None:
        dk_out, dv_out = grads[1], grads[2]
        if per_head:
            heads = q.shape[-2]
            dk_out, dv_out = (
                torch.empty(*g.shape[:-2], heads, g.shape[-1], dtype=torch.float32, device=g.device)
                for g in (grads[1], grads[2])
            )
        dkdv(
            q, k, v, dout, lse, delta, dk_out, dv_out, *options, *km.list_args("q", False),
            *km.list_args("q", True), km.aux,
        )  # fmt: skip
        if per_head:
            # Each K/V head's gradient is the sum over the query heads of its group (in fp32, rounded as
            # it is written: one reduction kernel, no fp32 temporary and copy).
            for target, per_query_head in ((grads[1], dk_out), (grads[2], dv_out)):
                torch.sum(per_query_head.unflatten(-2, (heads_kv, -1)), dim=-2, out=target)
    if dq_launch is not None:
        dq_launch(
            q, k, v, dout, lse, delta, grads[0], *options, sink, dsink_rows, *km.list_args("kv", False),
            *km.list_args("kv", True), km.aux,
        )  # fmt: skip
    for grad, padded in zip((dq, dk, dv), grads, strict=True):
        if padded is not grad:
            grad.copy_(padded[..., : grad.shape[-1]])
    if dsink_rows is None:
        return dq, dk, dv
    # (B, H, N_q) or (H, total_q): sum all but the head dimension.
    return dq, dk, dv, dsink_rows.sum(dim=[d for d in range(lse.dim()) if d != lse.dim() - 2])
