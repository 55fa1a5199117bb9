"""Backward kernels: the delta preprocess, dK/dV (one program per K/V block), dQ (one per Q block).

Derivation: docs/design/backward.md. P is recomputed from Q, K and the stored log-sum-exp;
``dS = P ∘ (dP − Δ)`` with ``Δ_i = rowsum(dO_i ∘ O_i)``. dK/dV and dQ are computed by separate
programs, each owning its output tile, so there are no atomics and the result is deterministic.
GQA: a dK/dV program loops over every query head of its group and sums their contributions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtile.kernels import configs
from flashtile.kernels._layout import as_descriptor_operand, launch, padded_head_dim
from flashtile.kernels._masking import key_bounds, query_bounds, visible
from flashtile.kernels._tiles import dot_operand, head_desc, query_block_of_program
from flashtile.kernels.fwd import LOG2_E, RUNTIME_SIZES, dot_options, pick_kernel


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
def _attn_bwd_dkdv_steps(
    dk,
    dv,
    k,
    v,
    q_desc,
    do_desc,
    lse_ptr,
    delta_ptr,
    start_m,
    end_m,
    offs_n,
    qk_scale,
    seqlen_q,
    causal_offset,
    MASKED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Accumulate into dK, dV the contributions of queries [start_m, end_m), K-side (transposed) so
    that Pᵀ and dSᵀ feed the next dots directly."""
    for m0 in tl.range(start_m, end_m, BLOCK_M):
        q = dot_operand(q_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
        do = dot_operand(do_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
        offs_m = m0 + tl.arange(0, BLOCK_M)
        lse, delta = _load_row_stats(lse_ptr, delta_ptr, offs_m, seqlen_q)
        s_t = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_M]
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_offset, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))  # [BLOCK_N, BLOCK_M]
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_dob,
    stride_don,
    stride_doh,
    stride_dkb,
    stride_dkn,
    stride_dkh,
    stride_dvb,
    stride_dvn,
    stride_dvh,
    seqlen_q,
    seqlen_k,
    num_n_blocks,
    qk_scale,
    softmax_scale,
    H,
    GROUP,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    n_block = pid % num_n_blocks
    bh_kv = pid // num_n_blocks
    H_KV = H // GROUP
    b = bh_kv // H_KV
    h_kv = bh_kv % H_KV

    k_desc = head_desc(k_ptr, b, h_kv, stride_kb, stride_kh, stride_kn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    v_desc = head_desc(v_ptr, b, h_kv, stride_vb, stride_vh, stride_vn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    dk_desc = head_desc(
        dk_ptr, b, h_kv, stride_dkb, stride_dkh, stride_dkn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D
    )
    dv_desc = head_desc(
        dv_ptr, b, h_kv, stride_dvb, stride_dvh, stride_dvn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D
    )
    n0 = (n_block * BLOCK_N).to(tl.int32)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k = dot_operand(k_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
    v = dot_operand(v_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    causal_offset = seqlen_k - seqlen_q
    start_m, masked_end = query_bounds(n0, seqlen_q, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)

    for g in range(GROUP):
        h = h_kv * GROUP + g
        q_desc = head_desc(q_ptr, b, h, stride_qb, stride_qh, stride_qn, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D)
        do_desc = head_desc(
            do_ptr, b, h, stride_dob, stride_doh, stride_don, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D
        )
        row_stats = (b * H + h) * seqlen_q
        dk, dv = _attn_bwd_dkdv_steps(
            dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, start_m, masked_end,
            offs_n, qk_scale, seqlen_q, causal_offset, True, BLOCK_M, DOT_FP32,
        )  # fmt: skip
        dk, dv = _attn_bwd_dkdv_steps(
            dk, dv, k, v, q_desc, do_desc, lse_ptr + row_stats, delta_ptr + row_stats, masked_end, seqlen_q,
            offs_n, qk_scale, seqlen_q, causal_offset, False, BLOCK_M, DOT_FP32,
        )  # fmt: skip

    dk_desc.store([n0, 0], (dk * softmax_scale).to(dk_desc.dtype))
    dv_desc.store([n0, 0], dv.to(dv_desc.dtype))


@triton.jit
def _attn_bwd_dq_steps(
    dq,
    q,
    do,
    lse,
    delta,
    k_desc,
    v_desc,
    start_n,
    end_n,
    offs_m,
    qk_scale,
    seqlen_k,
    causal_offset,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Accumulate into dQ the contributions of keys [start_n, end_n)."""
    for n0 in tl.range(start_n, end_n, BLOCK_N):
        k = dot_operand(k_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
        v = dot_operand(v_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            keep = visible(offs_m, n0 + tl.arange(0, BLOCK_N), seqlen_k, causal_offset, IS_CAUSAL)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v))  # [BLOCK_M, BLOCK_N]
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def attn_bwd_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_dob,
    stride_don,
    stride_doh,
    stride_dqb,
    stride_dqn,
    stride_dqh,
    seqlen_q,
    seqlen_k,
    num_m_blocks,
    qk_scale,
    softmax_scale,
    H,
    GROUP,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    m_block, bh, b, h, h_kv = query_block_of_program(num_m_blocks, H, GROUP)
    q_desc = head_desc(q_ptr, b, h, stride_qb, stride_qh, stride_qn, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D)
    do_desc = head_desc(
        do_ptr, b, h, stride_dob, stride_doh, stride_don, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D
    )
    dq_desc = head_desc(
        dq_ptr, b, h, stride_dqb, stride_dqh, stride_dqn, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D
    )
    k_desc = head_desc(k_ptr, b, h_kv, stride_kb, stride_kh, stride_kn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    v_desc = head_desc(v_ptr, b, h_kv, stride_vb, stride_vh, stride_vn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D)

    m0 = (m_block * BLOCK_M).to(tl.int32)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    causal_offset = seqlen_k - seqlen_q
    unmasked_end, hi = key_bounds(m0, seqlen_k, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)

    q = dot_operand(q_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
    do = dot_operand(do_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
    lse, delta = _load_row_stats(lse_ptr + bh * seqlen_q, delta_ptr + bh * seqlen_q, offs_m, seqlen_q)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dq = _attn_bwd_dq_steps(
        dq, q, do, lse, delta, k_desc, v_desc, 0, unmasked_end, offs_m, qk_scale, seqlen_k, causal_offset,
        False, IS_CAUSAL, BLOCK_N, DOT_FP32,
    )  # fmt: skip
    dq = _attn_bwd_dq_steps(
        dq, q, do, lse, delta, k_desc, v_desc, unmasked_end, hi, offs_m, qk_scale, seqlen_k, causal_offset,
        True, IS_CAUSAL, BLOCK_N, DOT_FP32,
    )  # fmt: skip
    dq_desc.store([m0, 0], (dq * softmax_scale).to(dq_desc.dtype))


attn_bwd_dkdv_kernel_runtime_sizes = triton.jit(do_not_specialize=RUNTIME_SIZES)(attn_bwd_dkdv_kernel.fn)
attn_bwd_dq_kernel_runtime_sizes = triton.jit(do_not_specialize=RUNTIME_SIZES)(attn_bwd_dq_kernel.fn)


def attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    config: configs.BwdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward. Shapes as in the forward; ``lse`` (B, H, N_q) float32 from it.

    Returns ``dq``, ``dk``, ``dv``, contiguous, in the dtypes and shapes of q, k, v.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()

    d_pad = padded_head_dim(head_dim)
    q, k, v, dout, out = (as_descriptor_operand(t, d_pad) for t in (q, k, v, dout, out))
    lse = lse.contiguous()
    grads = [g if d_pad == head_dim else torch.empty(*g.shape[:3], d_pad, dtype=g.dtype, device=g.device)
             for g in (dq, dk, dv)]  # fmt: skip
    cfg = config or configs.bwd_config(head_dim, causal, q.device)
    bd = configs.block_d(d_pad)
    common = dict(
        H=heads,
        GROUP=heads // heads_kv,
        HEAD_DIM=d_pad,
        BLOCK_D=bd,
        IS_CAUSAL=causal,
        **dot_options(q.dtype),
    )

    delta = torch.empty_like(lse)
    pre_block = 64
    num_pre_blocks = triton.cdiv(seqlen_q, pre_block)
    qk_scale = softmax_scale * LOG2_E
    num_n_blocks = triton.cdiv(seqlen_k, cfg.BLOCK_N1)
    num_m_blocks = triton.cdiv(seqlen_q, cfg.BLOCK_M2)
    dkdv_kernel = pick_kernel(attn_bwd_dkdv_kernel, attn_bwd_dkdv_kernel_runtime_sizes, seqlen_q, seqlen_k)
    dq_kernel = pick_kernel(attn_bwd_dq_kernel, attn_bwd_dq_kernel_runtime_sizes, seqlen_q, seqlen_k)
    launch(
        attn_bwd_preprocess_kernel, (num_pre_blocks * batch * heads,), q.device,
        out, dout, delta, *out.stride()[:3], *dout.stride()[:3], seqlen_q, num_pre_blocks,
        H=heads, HEAD_DIM=d_pad, BLOCK_M=pre_block, BLOCK_D=bd,
    )  # fmt: skip
    launch(
        dkdv_kernel, (num_n_blocks * batch * heads_kv,), q.device,
        q, k, v, dout, lse, delta, grads[1], grads[2],
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3],
        *grads[1].stride()[:3], *grads[2].stride()[:3],
        seqlen_q, seqlen_k, num_n_blocks, qk_scale, softmax_scale,
        BLOCK_M=cfg.BLOCK_M1, BLOCK_N=cfg.BLOCK_N1, num_warps=cfg.num_warps1, num_stages=cfg.num_stages1,
        **common,
    )  # fmt: skip
    launch(
        dq_kernel, (num_m_blocks * batch * heads,), q.device,
        q, k, v, dout, lse, delta, grads[0],
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *grads[0].stride()[:3],
        seqlen_q, seqlen_k, num_m_blocks, qk_scale, softmax_scale,
        BLOCK_M=cfg.BLOCK_M2, BLOCK_N=cfg.BLOCK_N2, num_warps=cfg.num_warps2, num_stages=cfg.num_stages2,
        **common,
    )  # fmt: skip
    for grad, padded in zip((dq, dk, dv), grads, strict=True):
        if padded is not grad:
            grad.copy_(padded[..., :head_dim])
    return dq, dk, dv
