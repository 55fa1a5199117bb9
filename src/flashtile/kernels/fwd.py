"""Forward kernel: one program per (BLOCK_M query rows, batch, head); online softmax over K/V blocks.

Derivation: docs/design/online_softmax.md. Scores are kept in base 2 (exp2 is the native unit):
``s2 = q·kᵀ · softmax_scale · log2(e)``, so ``m`` and ``ℓ`` are base-2 quantities and the stored
log-sum-exp is converted back to natural log once at the end.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flashtile.kernels import configs
from flashtile.kernels._block_sparse import (
    NO_MODS,
    block_list,
    call_mod,
    fwd_switches,
    kernel_mods,
    listed_below,
    listed_tile,
    mask_tile,
    modded_scores,
)
from flashtile.kernels._dropout import dropout_keep, dropout_threshold, load_rng_state
from flashtile.kernels._launch_cache import KernelLaunch
from flashtile.kernels._layout import as_descriptor_operand, cdiv, grid_seqlen, padded_head_dim
from flashtile.kernels._masking import visible, visible_span
from flashtile.kernels._scores import base2_scores
from flashtile.kernels._sink import fold_sink
from flashtile.kernels._tiles import dot_operand, head_desc, query_block_of_program, sequence_rows
from flashtile.mods import Mods

LOG2_E = math.log2(math.e)
# Kernels may read only constexpr globals.
LN_2 = tl.constexpr(math.log(2.0))
LOG2_E_C = tl.constexpr(LOG2_E)
# Triton turns an integer argument equal to 1 into a constant, and a constant sequence length of 1 makes
# the sm_90 loop pipeliner fail (regression: tests/test_kernels.py gpu-1x1 GQA cases). Sequences of length 1
# therefore launch a twin of each kernel compiled with the sizes kept runtime; every other launch keeps
# Triton's size specialisation, worth ~11 % in the backward (benchmarks/results/kernel_sweep_bwd_h100_*.csv).
# Window bounds stay runtime in every kernel: a bound of 1 would otherwise compile a kernel of its own.
WINDOW_ARGS = ["window_left", "window_right"]
# The grid's block count follows max_seqlen, which changes at every step of varlen training: specialised on
# (divisible by 16 or not), it compiled a new kernel mid-training; it only indexes programs.
FWD_UNSPECIALISED = [*WINDOW_ARGS, "num_m_blocks"]
RUNTIME_SIZES = ["seqlen_q", "seqlen_k", "num_m_blocks", "num_n_blocks", *WINDOW_ARGS]


def pick_kernel(specialised, runtime_sizes, seqlen_q: int, seqlen_k: int):
    """The twin to launch for these sequence lengths."""
    return runtime_sizes if 1 in (seqlen_q, seqlen_k) else specialised


@triton.jit
def _attn_fwd_steps(
    acc, l_i, m_i, q, k_desc, v_desc, start_n, end_n, offs_m, qk_scale, seqlen_k, lo_diag, hi_diag,
    softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset, dropout_threshold, bh,
    MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr, IS_FP8: tl.constexpr,
    seqlen_q, b, h, aux, blocks, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr, MASK_MOD: tl.constexpr,
    MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_AUX: tl.constexpr,
):  # fmt: skip
    """Fold keys [start_n, end_n) into the running (acc, ℓ, m); MASKED blocks need column masks, and
    MASK_MOD too when given. SPARSE: the range is over the listed ``blocks`` (_block_sparse)."""
    BLOCK_M: tl.constexpr = offs_m.shape[0]
    if HAS_DROPOUT:
        # The program's query block, where its dropout draws start.
        m_start = tl.min(offs_m, 0)
    for it in tl.range(start_n, end_n, BLOCK_N):
        n0 = listed_tile(it, blocks, SPARSE, SPARSE_BLOCK)
        k = dot_operand(k_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_D]
        if IS_FP8:
            # Vᵀ's tile, K-major as float8 wgmma takes its B operand (attn_fwd_kernel).
            v = dot_operand(tl.trans(v_desc.load([0, n0])), DOT_FP32)  # [BLOCK_N, BLOCK_DV]
        else:
            v = dot_operand(v_desc.load([n0, 0]), DOT_FP32)  # [BLOCK_N, BLOCK_DV]
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if HAS_SOFTCAP or HAS_ALIBI:
            s, _ = base2_scores(
                s, offs_m[:, None], offs_n[None, :], qk_scale, softcap_qk, softcap_out, alibi_slope,
                diag_offset, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
            )  # fmt: skip
            s_scale = 1.0
        elif IS_FP8:
            # The scale times the descales may have either sign (the descales are the caller's): scaled
            # before the row max.
            s = s * qk_scale
            s_scale = 1.0
        else:
            # qk_scale > 0 (the launcher makes it so): the row max commutes with the scaling, and the
            # scaling folds into one FMA per score below.
            s_scale = qk_scale
        if SCORE_MOD is not None:
            s, _ = modded_scores(
                s * s_scale, b, h, offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, aux, SCORE_MOD,
                SCORE_MOD_AUX,
            )  # fmt: skip
            s_scale = 1.0
        if MASKED:
            keep = visible(offs_m[:, None], offs_n[None, :], seqlen_k, lo_diag, hi_diag, IS_LOCAL)
            if MASK_MOD is not None:
                keep = keep & call_mod(
                    None, b, h, offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, aux, MASK_MOD,
                    MASK_MOD_AUX
                )  # fmt: skip
            s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * s_scale)
        # A row with every key masked so far keeps m = −inf; subtracting 0 avoids −inf − (−inf).
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new) if MASKED else m_new
        p = tl.math.exp2(s * s_scale - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            # ℓ sums the undropped P (the softmax before dropout); only the weighted sum is thinned.
            keep = dropout_keep(seed, rng_offset, dropout_threshold, bh, m_start, n0, BLOCK_M, BLOCK_N)
            p = tl.where(keep, p, 0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=FWD_UNSPECIALISED)
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, alibi_ptr, rng_state_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
    sink_ptr, descale_ptr, stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_on, stride_oh,
    stride_lse_h, stride_alibi_b,
    seqlen_q, seqlen_k, num_m_blocks, qk_scale, window_left, window_right,
    softcap_qk, softcap_out, dropout_threshold, dropout_scale, H, GROUP,
    kv_count_ptr, kv_index_ptr, full_kv_count_ptr, full_kv_index_ptr, stride_mask_b, stride_mask_h,
    mask_row_len, aux,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_LOCAL: tl.constexpr, HAS_WINDOW_LEFT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_FP32: tl.constexpr,
    HAS_BLOCK_MASK: tl.constexpr, SPARSE_BLOCK_M: tl.constexpr, SPARSE_BLOCK_N: tl.constexpr,
    MASK_MOD: tl.constexpr, MASK_MOD_AUX: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_MOD_AUX: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINK: tl.constexpr, IS_FP8: tl.constexpr,
):  # fmt: skip
    """IS_FP8: q, k, v in float8 e4m3, dequantised by the fp32 descales at descale_ptr, (B, H_KV, 3)
    contiguous (q's, k's, v's of batch b and key/value head h_kv): the scores' scale takes q's and k's, the
    output v's; P enters the second dot in V's float8 dtype, as FlashAttention-3 does (docs/design/fp8.md)."""
    m_block, bh, b, h, h_kv = query_block_of_program(num_m_blocks, H, GROUP)
    m0 = (m_block * BLOCK_M).to(tl.int32)
    # Varlen: seqlen_q/k are the packed totals here and become this sequence's lengths.
    q_base, seqlen_q_b = sequence_rows(b, cu_seqlens_q_ptr, seqlen_q, seqlen_q, IS_VARLEN)
    k_base, seqlen_k_b = sequence_rows(b, cu_seqlens_k_ptr, seqlen_k, seqlen_k, IS_VARLEN)
    if IS_VARLEN:
        # The grid covers the longest sequence; blocks past this one's end have nothing to do.
        if m0 >= seqlen_q_b:
            return
        lse_row = lse_ptr + h * stride_lse_h + q_base
    else:
        lse_row = lse_ptr + bh * seqlen_q
    # A descriptor over zero rows is not a valid TMA map; a sequence with no keys visits no key tile.
    kv_rows = tl.maximum(seqlen_k_b, 1) if IS_VARLEN else seqlen_k_b
    q_desc = head_desc(
        q_ptr, q_base, h, stride_qb, stride_qh, stride_qn, seqlen_q_b, HEAD_DIM, BLOCK_M, BLOCK_D
    )
    k_desc = head_desc(
        k_ptr, k_base, h_kv, stride_kb, stride_kh, stride_kn, kv_rows, HEAD_DIM, BLOCK_N, BLOCK_D
    )
    if IS_FP8:
        # Vᵀ, (B, H_KV, D_v, N) (attn_fwd transposes it, stride_vn its rows' stride): float8 wgmma takes its
        # B operand K-major only, and V's own tiles would go through shared memory to be transposed at each
        # key tile (0.37-0.40 of the bf16 kernel's speed on an H200).
        v_desc = tl.make_tensor_descriptor(
            v_ptr + b * stride_vb + h_kv * stride_vh,
            [HEAD_DIM_V, kv_rows],
            [stride_vn, 1],
            [BLOCK_DV, BLOCK_N],
        )
    else:
        v_desc = head_desc(
            v_ptr, k_base, h_kv, stride_vb, stride_vh, stride_vn, kv_rows, HEAD_DIM_V, BLOCK_N, BLOCK_DV
        )
    o_desc = head_desc(
        o_ptr, q_base, h, stride_ob, stride_oh, stride_on, seqlen_q_b, HEAD_DIM_V, BLOCK_M, BLOCK_DV
    )

    offs_m = m0 + tl.arange(0, BLOCK_M)
    v_descale = 1.0
    if IS_FP8:
        descales = descale_ptr + (b * (H // GROUP) + h_kv) * 3
        qk_descale = tl.load(descales) * tl.load(descales + 1)
        qk_scale = qk_scale * qk_descale
        softcap_qk = softcap_qk * qk_descale
        v_descale = tl.load(descales + 2)
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
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    if HAS_BLOCK_MASK:
        # Full blocks first (unmasked, but for the window and a block crossing the end), then partial ones.
        mask_row = m0 // SPARSE_BLOCK_M
        full, n_full = block_list(
            full_kv_count_ptr, full_kv_index_ptr, b, h, mask_row, stride_mask_b, stride_mask_h, mask_row_len
        )
        n_clean = listed_below(full, n_full, seqlen_k_b // SPARSE_BLOCK_N)
        partial, n_partial = block_list(
            kv_count_ptr, kv_index_ptr, b, h, mask_row, stride_mask_b, stride_mask_h, mask_row_len
        )
        if IS_VARLEN:
            n_full = listed_below(full, n_full, tl.cdiv(seqlen_k_b, SPARSE_BLOCK_N))
            n_partial = listed_below(partial, n_partial, tl.cdiv(seqlen_k_b, SPARSE_BLOCK_N))
        acc, l_i, m_i = _attn_fwd_steps(
            acc, l_i, m_i, q, k_desc, v_desc, 0, n_clean * SPARSE_BLOCK_N, offs_m, qk_scale, seqlen_k_b,
            lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
            dropout_threshold, bh, IS_LOCAL, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT,
            BLOCK_N,
            DOT_FP32, IS_FP8, seqlen_q_b, b, h, aux, full, True, SPARSE_BLOCK_N, None, False, SCORE_MOD,
            SCORE_MOD_AUX,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_steps(
            acc, l_i, m_i, q, k_desc, v_desc, n_clean * SPARSE_BLOCK_N, n_full * SPARSE_BLOCK_N, offs_m,
            qk_scale, seqlen_k_b, lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed,
            rng_offset, dropout_threshold, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT,
            BLOCK_N, DOT_FP32, IS_FP8, seqlen_q_b, b, h, aux, full, True, SPARSE_BLOCK_N, None, False,
            SCORE_MOD, SCORE_MOD_AUX,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_steps(
            acc, l_i, m_i, q, k_desc, v_desc, 0, n_partial * SPARSE_BLOCK_N, offs_m, qk_scale, seqlen_k_b,
            lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
            dropout_threshold, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_N,
            DOT_FP32, IS_FP8, seqlen_q_b, b, h, aux, partial, True, SPARSE_BLOCK_N, MASK_MOD, MASK_MOD_AUX,
            SCORE_MOD, SCORE_MOD_AUX,
        )  # fmt: skip
        # The dense loops below then have nothing to visit.
        unmasked_start, unmasked_end, end = 0, 0, 0
    elif IS_LOCAL:
        start, unmasked_start, unmasked_end, end = visible_span(
            m0, seqlen_q_b, seqlen_k_b, lo_diag, hi_diag, BLOCK_M, BLOCK_N
        )
        # Without a left bound the masked tiles before the unmasked ones do not exist.
        if HAS_WINDOW_LEFT:
            acc, l_i, m_i = _attn_fwd_steps(
                acc, l_i, m_i, q, k_desc, v_desc, start, unmasked_start, offs_m, qk_scale, seqlen_k_b,
                lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
                dropout_threshold, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT,
                BLOCK_N, DOT_FP32, IS_FP8, seqlen_q_b, b, h, aux, None, False, 1, None, False, SCORE_MOD,
                SCORE_MOD_AUX,
            )  # fmt: skip
    else:
        unmasked_start = 0
        unmasked_end = seqlen_k_b // BLOCK_N * BLOCK_N
        end = seqlen_k_b
    acc, l_i, m_i = _attn_fwd_steps(
        acc, l_i, m_i, q, k_desc, v_desc, unmasked_start, unmasked_end, offs_m, qk_scale, seqlen_k_b,
        lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
        dropout_threshold, bh, False, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_N,
        DOT_FP32, IS_FP8, seqlen_q_b, b, h, aux, None, False, 1, None, False, SCORE_MOD, SCORE_MOD_AUX,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_steps(
        acc, l_i, m_i, q, k_desc, v_desc, unmasked_end, end, offs_m, qk_scale, seqlen_k_b,
        lo_diag, hi_diag, softcap_qk, softcap_out, alibi_slope, diag_offset, seed, rng_offset,
        dropout_threshold, bh, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI, HAS_DROPOUT, BLOCK_N,
        DOT_FP32, IS_FP8, seqlen_q_b, b, h, aux, None, False, 1, None, False, SCORE_MOD, SCORE_MOD_AUX,
    )  # fmt: skip

    if HAS_SINK:
        acc, l_i, m_i = fold_sink(acc, l_i, m_i, tl.load(sink_ptr + h) * LOG2_E_C)
    # Rows that saw no key (and no sink) have ℓ = 0: their output is 0 and their log-sum-exp −inf.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if HAS_DROPOUT:
        out = out * dropout_scale
    if IS_FP8:
        out = out * v_descale
    o_desc.store([m0, 0], out.to(o_desc.dtype))
    lse = (m_i + tl.math.log2(l_i)) * LN_2
    tl.store(lse_row + offs_m, lse, mask=offs_m < seqlen_q_b)


attn_fwd_kernel_runtime_sizes = triton.jit(do_not_specialize=RUNTIME_SIZES)(attn_fwd_kernel.fn)


def positive_scale(q: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, float]:
    """``(q, scale)`` with a positive scale and the same softmax: softmax(scale·q·kᵀ) is unchanged by
    (q, scale) → (−q, −scale), and with scale 0 every score is 0. The kernels rely on scale > 0."""
    if softmax_scale < 0:
        return -q, -softmax_scale
    if softmax_scale == 0:
        return torch.zeros_like(q), 1.0
    return q, softmax_scale


# Input dtypes of the float8 forward (flashtile.fp8; e4m3, as FlashAttention-3): its output is bfloat16.
FP8_DTYPES = (torch.float8_e4m3fn,)


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """How the dots treat this input dtype. fp16 operands stay fp16 everywhere (P and dS are rounded to
    fp16 as on the GPU); fp32 gets true fp32 dots (Triton's default rounds them to tf32); bf16 is upcast
    to fp32 in the interpreter, which multiplies raw bf16 bit patterns (triton-lang/triton#11584), and so
    is float8, whose rounding the interpreter gets wrong (P then stays fp32 there)."""
    upcast = dtype == torch.bfloat16 or dtype in FP8_DTYPES
    options: dict[str, object] = {"DOT_FP32": upcast and configs.is_interpreter()}
    if dtype == torch.float32 and not configs.is_interpreter():
        options["default_dot_input_precision"] = "ieee"
    return options


@dataclass(frozen=True)
class Options:
    """The options of one call as the kernels take them: constexpr switches and their runtime values."""

    window_left: int
    window_right: int
    softcap_qk: float
    softcap_out: float
    dropout_threshold: int
    dropout_scale: float
    switches: dict[str, bool]


def kernel_options(
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    has_alibi: bool,
    dropout_p: float,
    varlen: bool,
    total_q: int,
) -> Options:
    """Translate the launcher keywords (validated, window normalised) into what the kernels take.

    Causal is the window (left, 0). An unlimited left side is a compile-time switch (causal keeps its own
    code); an unlimited right side becomes a bound as wide as the packed tensors, which no sequence
    exceeds."""
    left, right = window_size
    if causal:
        right = 0
    is_local = left >= 0 or right >= 0
    return Options(
        # Read only under HAS_WINDOW_LEFT.
        window_left=max(left, 0),
        window_right=right if right >= 0 else total_q,
        softcap_qk=softmax_scale / softcap if softcap > 0 else 0.0,
        softcap_out=softcap * LOG2_E,
        dropout_threshold=dropout_threshold(dropout_p),
        dropout_scale=1.0 / (1.0 - dropout_p),
        switches=dict(
            IS_LOCAL=is_local,
            HAS_WINDOW_LEFT=left >= 0,
            HAS_SOFTCAP=softcap > 0,
            # Inline asm does not run in the interpreter.
            FAST_TANH=not configs.is_interpreter(),
            HAS_ALIBI=has_alibi,
            HAS_DROPOUT=dropout_p > 0,
            IS_VARLEN=varlen,
        ),
    )


def option_tensors(
    alibi_slopes: torch.Tensor | None,
    dropout_p: float,
    rng_state: torch.Tensor | None,
    learnable_sink: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(slopes, rng state, sink) as the kernels read them: slopes at h (+ b·stride), the state at 0 and 1
    and the sink at h, so unit strides (no copy if so), the sink in float32. Only the forward and dQ
    kernels read the sink: the backward's P uses the LSE, sink included."""
    slopes = None if alibi_slopes is None else alibi_slopes.contiguous()
    state = rng_state.contiguous() if dropout_p > 0 else None
    sink = None if learnable_sink is None else learnable_sink.to(torch.float32).contiguous()
    return slopes, state, sink


def alibi_stride_b(slopes: torch.Tensor | None) -> int | None:
    """The slopes' batch stride: (H,) are shared by every batch element, (B, H) have a row each; None
    without slopes."""
    if slopes is None:
        return None
    return 0 if slopes.dim() == 1 else slopes.stride(0)


def dense_strides(strides: tuple[int, ...], varlen: bool) -> tuple[int, ...]:
    """(batch, row, head) strides of a (B, N, H, D) tensor, or of a packed (total, H, D) one, whose batch
    stride is its row stride: the kernels address sequence b from its first row (_tiles.sequence_rows)."""
    if varlen:
        return strides[0], strides[0], strides[1]
    return strides[:3]


def strided_values(names: Sequence[str], strides: Sequence[tuple[int, ...]], varlen: bool) -> dict[str, int]:
    """The kernels' ``stride_<t>b``, ``stride_<t>n``, ``stride_<t>h`` for each tensor ``t`` of ``names``
    (:func:`dense_strides` of its ``strides``)."""
    values = {}
    for t, st in zip(names, strides, strict=True):
        b, n, h = dense_strides(st, varlen)
        values.update({f"stride_{t}b": b, f"stride_{t}n": n, f"stride_{t}h": h})
    return values


# Everything but the tensors is a function of these arguments: one KernelLaunch per call signature.
@functools.lru_cache(maxsize=512)
def _fwd_launch(
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
    sizes: tuple[int, int, int, int],
    mods_key: tuple,
    config: configs.FwdConfig | None,
) -> KernelLaunch:
    """The forward's launch. ``strides`` are those of q, k, v, o and lse as launched; ``dims`` (heads_kv,
    head_dim, head_dim_v) unpadded (q_shape's last is padded); ``sizes`` (batch, seqlen_q, total_q,
    total_k); ``mods_key`` :attr:`KernelMods.launch_key`; ``interpreter`` keys the dot and tanh switches."""
    batch, seqlen_q, total_q, total_k = sizes
    heads, d_pad = q_shape[-2], q_shape[-1]
    heads_kv, head_dim, head_dim_v = dims
    dv_pad = padded_head_dim(head_dim_v)
    mod_switches, (stride_mask_b, stride_mask_h, mask_row_len), _ = mods_key
    mod_switches = dict(mod_switches)
    opts = kernel_options(
        softmax_scale, causal, window_size, softcap, alibi_stride is not None, dropout_p, varlen, total_q
    )
    cfg = config or configs.fwd_config(
        head_dim, device, head_dim_v, dropout=dropout_p > 0, fp8=dtype in FP8_DTYPES
    )
    block_m, block_n = mask_tile(cfg.BLOCK_M, mod_switches, 0), mask_tile(cfg.BLOCK_N, mod_switches, 1)
    num_m_blocks = cdiv(seqlen_q, block_m)
    kernel = pick_kernel(attn_fwd_kernel, attn_fwd_kernel_runtime_sizes, total_q, total_k)
    dots = dot_options(dtype)
    dot_fp32 = dots.pop("DOT_FP32")
    values = dict(
        **strided_values(("q", "k", "v", "o"), strides[:4], varlen),
        stride_lse_h=strides[4][0], stride_alibi_b=alibi_stride or 0, seqlen_q=total_q, seqlen_k=total_k,
        num_m_blocks=num_m_blocks, qk_scale=softmax_scale * LOG2_E, window_left=opts.window_left,
        window_right=opts.window_right, softcap_qk=opts.softcap_qk, softcap_out=opts.softcap_out,
        dropout_threshold=opts.dropout_threshold, dropout_scale=opts.dropout_scale, H=heads,
        GROUP=heads // heads_kv, stride_mask_b=stride_mask_b, stride_mask_h=stride_mask_h,
        mask_row_len=mask_row_len, HEAD_DIM=d_pad, BLOCK_D=configs.block_d(d_pad), BLOCK_M=block_m,
        BLOCK_N=block_n, **opts.switches, **fwd_switches(mod_switches), DOT_FP32=dot_fp32,
        HEAD_DIM_V=dv_pad, BLOCK_DV=configs.block_d(dv_pad), HAS_SINK=has_sink, IS_FP8=dtype in FP8_DTYPES,
    )  # fmt: skip
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dots)
    return KernelLaunch(kernel, (num_m_blocks * batch * heads,), device, FWD_POINTERS, values, options)


# The tensors of a forward launch, in the kernel's parameter order.
FWD_POINTERS = (
    "q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "alibi_ptr", "rng_state_ptr", "cu_seqlens_q_ptr",
    "cu_seqlens_k_ptr", "sink_ptr", "descale_ptr", "kv_count_ptr", "kv_index_ptr", "full_kv_count_ptr",
    "full_kv_index_ptr", "aux",
)  # fmt: skip


def transposed_fp8(v: torch.Tensor) -> torch.Tensor:
    """Dense float8 ``v`` (B, N, H_KV, D) as Vᵀ (B, H_KV, D, N), each row padded to 16 bytes (a TMA
    descriptor's stride unit; the padding is never read: the descriptor's shape stops at N)."""
    batch, seqlen, heads_kv, head_dim = v.shape
    vt = torch.empty((batch, heads_kv, head_dim, cdiv(seqlen, 16) * 16), dtype=v.dtype, device=v.device)
    vt[..., :seqlen].copy_(v.permute(0, 2, 3, 1))
    return vt


def attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    config: configs.FwdConfig | None = None,
    descale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on validated inputs (docs/design/options.md: the window arrives normalised,
    rng_state is int64 (2,) on q's device when dropout_p > 0).

    Dense: q (B, N_q, H, D), k (B, N_k, H_KV, D), v (B, N_k, H_KV, D_v); returns ``out`` (B, N_q, H, D_v)
    in q's dtype and ``lse`` (B, H, N_q) float32. Varlen (cu_seqlens_q/k int32 (B + 1,), max_seqlen_q/k):
    q (total_q, H, D), k/v (total_k, H_KV, D / D_v); returns ``out`` (total_q, H, D_v) and ``lse``
    (H, total_q). Both contiguous. ``learnable_sink`` (H,) float32 joins each row's softmax denominator
    (docs/design/sinks.md): the LSE includes it, and a row that sees no key gives out 0 and lse = sink.
    ``mods``: block mask, mask_mod, score_mod and aux_tensors, validated (docs/design/block_sparse.md).
    Float8 q, k, v (:data:`FP8_DTYPES`, dense, no ALiBi, dropout, sink or mods: flashtile.fp8 checks) take
    ``descale`` (B, H_KV, 3) float32 contiguous, the descales of q, k and v; ``out`` is then bfloat16 and
    the scale may have either sign.
    """
    varlen = cu_seqlens_q is not None
    heads, head_dim, head_dim_v = q.shape[-2], q.shape[-1], v.shape[-1]
    heads_kv = k.shape[-2]
    if varlen:
        batch = cu_seqlens_q.shape[0] - 1
        total_q, total_k = q.shape[0], k.shape[0]
        seqlen_q = max_seqlen_q
        lse = torch.empty((heads, total_q), dtype=torch.float32, device=q.device)
    else:
        batch, seqlen_q = q.shape[:2]
        total_k = k.shape[1]
        total_q = seqlen_q
        lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    out_dtype = torch.bfloat16 if q.dtype in FP8_DTYPES else q.dtype
    out = torch.empty((*q.shape[:-1], head_dim_v), dtype=out_dtype, device=q.device)
    if out.numel() == 0 or batch == 0 or seqlen_q == 0:
        return out, lse
    if total_k == 0:
        if learnable_sink is None:
            return out.zero_(), lse.fill_(-math.inf)
        # (H, 1) broadcasts over (B, H, N_q) and (H, total_q): only the sink is in each row's softmax.
        return out.zero_(), lse.copy_(learnable_sink.to(lse.dtype).view(-1, 1).expand_as(lse))

    if descale is None:
        # (The float8 kernel takes a scale of either sign: float8 tensors have no negation.)
        q, softmax_scale = positive_scale(q, softmax_scale)
    d_pad, dv_pad = padded_head_dim(head_dim), padded_head_dim(head_dim_v)
    q, k = (as_descriptor_operand(t, d_pad) for t in (q, k))
    v = as_descriptor_operand(v, dv_pad)
    o = out
    if dv_pad != head_dim_v:
        o = torch.empty((*out.shape[:-1], dv_pad), dtype=out_dtype, device=q.device)
    slopes, state, sink = option_tensors(alibi_slopes, dropout_p, rng_state, learnable_sink)
    km = NO_MODS if mods is None else kernel_mods(mods)
    v_strides = v.stride()
    if descale is not None:
        v = transposed_fp8(v)
        # The kernel's (batch, row, head) strides of Vᵀ: its rows are V's columns.
        v_strides = (v.stride(0), v.stride(2), v.stride(1), v.stride(3))
    strides = (q.stride(), k.stride(), v_strides, o.stride(), lse.stride())
    kernel_launch = _fwd_launch(
        q.shape, strides, (heads_kv, head_dim, head_dim_v), q.dtype,
        q.device, configs.is_interpreter(), softmax_scale, causal, tuple(window_size), softcap,
        alibi_stride_b(slopes), dropout_p, varlen, sink is not None,
        (batch, grid_seqlen(seqlen_q) if varlen else seqlen_q, total_q, total_k), km.launch_key, config,
    )  # fmt: skip
    kernel_launch(
        q, k, v, o, lse, slopes, state, cu_seqlens_q, cu_seqlens_k, sink, descale, *km.list_args("kv", False),
        *km.list_args("kv", True), km.aux,
    )  # fmt: skip
    if o is not out:
        out.copy_(o[..., :head_dim_v])
    return out, lse
