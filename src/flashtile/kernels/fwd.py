"""Forward kernel: one program per (BLOCK_M query rows, batch, head); online softmax over K/V blocks.

Derivation: docs/design/online_softmax.md. Scores are kept in base 2 (exp2 is the native unit):
``s2 = q·kᵀ · softmax_scale · log2(e)``, so ``m`` and ``ℓ`` are base-2 quantities and the stored
log-sum-exp is converted back to natural log once at the end.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashtile.kernels import configs
from flashtile.kernels._layout import as_descriptor_operand, launch, padded_head_dim
from flashtile.kernels._masking import key_bounds, visible
from flashtile.kernels._tiles import dot_operand, head_desc, query_block_of_program

LOG2_E = math.log2(math.e)
# Kernels may read only constexpr globals.
LN_2 = tl.constexpr(math.log(2.0))
# Triton turns an integer argument equal to 1 into a constant, and a constant sequence length of 1 makes
# the sm_90 loop pipeliner fail (regression: tests/test_kernels.py gpu-1x1 GQA cases). Sequences of length 1
# therefore launch a twin of each kernel compiled with the sizes kept runtime; every other launch keeps
# Triton's size specialisation, worth ~11 % in the backward (benchmarks/results/kernel_sweep_bwd_h100_*.csv).
RUNTIME_SIZES = ["seqlen_q", "seqlen_k", "num_m_blocks", "num_n_blocks"]


def pick_kernel(specialised, runtime_sizes, seqlen_q: int, seqlen_k: int):
    """The twin to launch for these sequence lengths."""
    return runtime_sizes if 1 in (seqlen_q, seqlen_k) else specialised


@triton.jit
def _attn_fwd_steps(
    acc,
    l_i,
    m_i,
    q,
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
    """Fold keys [start_n, end_n) into the running (acc, ℓ, m); MASKED blocks need column masks."""
    for n0 in tl.range(start_n, end_n, BLOCK_N):
        k = dot_operand(k_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
        v = dot_operand(v_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
        if MASKED:
            keep = visible(offs_m, n0 + tl.arange(0, BLOCK_N), seqlen_k, causal_offset, IS_CAUSAL)
            s = tl.where(keep, s, -float("inf"))
        # qk_scale > 0 (the launcher makes it so): the row max commutes with the scaling, and the scaling
        # folds into one FMA per score below.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        # A row with every key masked so far keeps m = −inf; subtracting 0 avoids −inf − (−inf).
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new) if MASKED else m_new
        p = tl.math.exp2(s * qk_scale - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_ob,
    stride_on,
    stride_oh,
    seqlen_q,
    seqlen_k,
    num_m_blocks,
    qk_scale,
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
    k_desc = head_desc(k_ptr, b, h_kv, stride_kb, stride_kh, stride_kn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    v_desc = head_desc(v_ptr, b, h_kv, stride_vb, stride_vh, stride_vn, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    o_desc = head_desc(o_ptr, b, h, stride_ob, stride_oh, stride_on, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D)

    m0 = (m_block * BLOCK_M).to(tl.int32)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    causal_offset = seqlen_k - seqlen_q
    unmasked_end, hi = key_bounds(m0, seqlen_k, causal_offset, IS_CAUSAL, BLOCK_M, BLOCK_N)

    q = dot_operand(q_desc.load([m0, 0]), DOT_FP32)  # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    acc, l_i, m_i = _attn_fwd_steps(
        acc, l_i, m_i, q, k_desc, v_desc, 0, unmasked_end, offs_m, qk_scale, seqlen_k, causal_offset,
        False, IS_CAUSAL, BLOCK_N, DOT_FP32,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_steps(
        acc, l_i, m_i, q, k_desc, v_desc, unmasked_end, hi, offs_m, qk_scale, seqlen_k, causal_offset,
        True, IS_CAUSAL, BLOCK_N, DOT_FP32,
    )  # fmt: skip

    # Rows that saw no key have ℓ = 0: their output is 0 and their log-sum-exp −inf.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_desc.store([m0, 0], out.to(o_desc.dtype))
    lse = (m_i + tl.math.log2(l_i)) * LN_2
    tl.store(lse_ptr + bh * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)


attn_fwd_kernel_runtime_sizes = triton.jit(do_not_specialize=RUNTIME_SIZES)(attn_fwd_kernel.fn)


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """How the dots treat this input dtype. fp16 operands stay fp16 everywhere (P and dS are rounded to
    fp16 as on the GPU); fp32 gets true fp32 dots (Triton's default rounds them to tf32); bf16 is upcast
    to fp32 in the interpreter, which multiplies raw bf16 bit patterns (triton-lang/triton#11584)."""
    options: dict[str, object] = {"DOT_FP32": dtype == torch.bfloat16 and configs.is_interpreter()}
    if dtype == torch.float32 and not configs.is_interpreter():
        options["default_dot_input_precision"] = "ieee"
    return options


def attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    config: configs.FwdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward. q (B, N_q, H, D), k/v (B, N_k, H_KV, D), validated.

    Returns ``out`` (B, N_q, H, D) in q's dtype and ``lse`` (B, H, N_q) float32, both contiguous.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:
        return out.zero_(), lse.fill_(-math.inf)

    # softmax(scale·q·kᵀ) is unchanged by (q, scale) → (−q, −scale), and with scale 0 every score is 0:
    # the kernel then only ever sees a positive scale.
    if softmax_scale < 0:
        q, softmax_scale = -q, -softmax_scale
    elif softmax_scale == 0:
        q, softmax_scale = torch.zeros_like(q), 1.0
    d_pad = padded_head_dim(head_dim)
    q, k, v = (as_descriptor_operand(t, d_pad) for t in (q, k, v))
    o = out if d_pad == head_dim else torch.empty_like(q)
    cfg = config or configs.fwd_config(head_dim, q.device)
    num_m_blocks = triton.cdiv(seqlen_q, cfg.BLOCK_M)
    kernel = pick_kernel(attn_fwd_kernel, attn_fwd_kernel_runtime_sizes, seqlen_q, seqlen_k)
    launch(
        kernel, (num_m_blocks * batch * heads,), q.device,
        q, k, v, o, lse,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        seqlen_q, seqlen_k, num_m_blocks, softmax_scale * LOG2_E,
        H=heads, GROUP=heads // heads_kv, HEAD_DIM=d_pad, BLOCK_D=configs.block_d(d_pad),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, IS_CAUSAL=causal,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dot_options(q.dtype),
    )  # fmt: skip
    if o is not out:
        out.copy_(o[..., :head_dim])
    return out, lse
