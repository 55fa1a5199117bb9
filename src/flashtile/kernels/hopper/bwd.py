"""Hopper (sm_90) backward in Gluon: a warp-specialised fused dK/dV/dQ kernel, and a dQ kernel for
``deterministic=True``.

Design, barrier protocol and measurements: docs/design/hopper_bwd.md. A program owns BN K/V rows of
one KV head; a 1-warp producer streams BM-row Q/dO blocks (with the base-2 LSE and Δ on the same
barriers) through a TMA ring; two 4-warp consumer partitions share the program. At D ≤ 128 each owns
BN/2 of the K/V rows and computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (K-side), so that Pᵀ and dSᵀ are the
register A operands of dV += Pᵀ·dO and dK += dSᵀ·Q. At D = 256 (64 K/V rows) each owns half of dK's
and dV's columns, computes Sᵀ and dPᵀ for half of the query rows and passes Pᵀ and dSᵀ to the other
through shared memory. dS goes through shared memory into dQ = dS·K, which is added into an fp32
buffer by a TMA bulk reduce; a postprocess scales and converts it. GQA: a program visits every query
head of its group. Tensors are read through rank-3 TMA descriptors over [B, N, H·D], so rows past a
sequence's end read as zeros and stores past it are dropped: nothing of another batch or head enters a
result. Head dims 96 and 192 run zero-padded to 128 and 256. Plain non-causal calls at D = 64 run on a
persistent grid: one program an SM takes key blocks in turn, loading the next one's K and V while it stores
this one's dK and dV (``PERSISTENT_ENV``).

Tuning knob: ``FLASHTILE_HOPPER_BWD_VARIANT=<name>`` (read at each launch) picks a row of ``VARIANTS``
for the head dims that have a variant of that name; the others keep ``DEFAULT_VARIANT``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashtile._environ import Knob
from flashtile.errors import FlashtileValueError
from flashtile.kernels._block_sparse import NO_MODS, call_mod, kernel_mods
from flashtile.kernels._launch_cache import KernelLaunch
from flashtile.kernels._layout import cdiv, grid_seqlen
from flashtile.kernels._mask_bits import reads_bits
from flashtile.kernels.configs import multiprocessor_count
from flashtile.kernels.fwd import alibi_stride_b
from flashtile.kernels.hopper import dropout
from flashtile.kernels.hopper.descriptors import CheckedDescriptor, descriptor
from flashtile.kernels.hopper.fwd import (
    WG_THREADS,
    Sparse,
    _block_list,
    _release,
    _sequence_rows,
    _tanh,
    _tile_start,
    option_arguments,
    sparse_arguments,
    sparse_aux,
    sparse_key,
)
from flashtile.kernels.hopper.support import block_mask_unsupported_reason
from flashtile.mods import Mods

LOG2_E = 1.4426950408889634
# Kernels may read only constexpr globals.
LOG2_E_C = gl.constexpr(LOG2_E)
# Windows, softcap and ALiBi in the fused kernel: their GPU cases passed (H100, 43 cases, sixth session of
# 2026-11-23); FLASHTILE_HOPPER_BWD_OPTIONS=1 takes them there where this is off.
GPU_CHECKED_OPTIONS = True
OPTIONS_ENV = "FLASHTILE_HOPPER_BWD_OPTIONS"
# Packed (varlen) batches in the fused kernel: their GPU cases passed (H100, seventh session of 2026-11-23:
# 13 varlen cases at 7c404bb, the whole backward file, 178 cases, at the version before). Where this is off,
# FLASHTILE_HOPPER_BWD_VARLEN=1 takes them there.
GPU_CHECKED_VARLEN = True
VARLEN_ENV = "FLASHTILE_HOPPER_BWD_VARLEN"
# The packed backward's epilogue: dK and dV of a block wholly inside its sequence leave by TMA boxes, the
# sequence's last block by row-masked pointer stores; "0" stores every block by pointer (2 to 5 % slower on
# an H200 since the statistics load by TMA: docs/design/hopper_bwd.md, "Variable length").
VARLEN_TMA_STORE_ENV = "FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE"
VARIANT_ENV = "FLASHTILE_HOPPER_BWD_VARIANT"
# A persistent grid (one program an SM over the key blocks) for plain non-causal calls of the "keys" split
# (docs/design/hopper_bwd.md, "A persistent grid"), read at each launch: by default at the head dims of
# PERSISTENT_HEAD_DIMS, not deterministic; "0" never; "1" at D = 64 and 128, deterministic or not.
PERSISTENT_ENV = "FLASHTILE_HOPPER_BWD_PERSISTENT"
# D = 64 ("m128"): +3-4 % at N = 1k, +1-1.5 % at 2k, within ±1 % from 4k on an H200 (forty-sixth session,
# s46a/s46b). D = 128 ("m64") ran 1-3 % slower: its query-block loop moves wgmma descriptors from ordinary
# to uniform registers (+10 % instructions; docs/design/hopper_bwd.md).
PERSISTENT_HEAD_DIMS = (64,)
# Kernel head dims whose backward takes a learnable sink (its share of the gradient from dS in the fused
# kernel, the rest in the preprocess's SINK_TERM): 64 and 128 (D = 96 padded to it), GPU-checked on an
# H200 in the thirty-ninth session (0.88 of the plain backward at both, against the portable one's 0.6).
GPU_CHECKED_SINK_DIMS = (64, 128)
_VARIANT, _VARLEN_TMA_STORE, _PERSISTENT = Knob(VARIANT_ENV), Knob(VARLEN_TMA_STORE_ENV), Knob(PERSISTENT_ENV)
# The dQ reduces issued by the producer warp (:func:`dq_by_producer`): calls without dropout or a block
# mask by default; FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER = 0 never, 1 every call that adds dQ where it can.
DQ_BY_PRODUCER_ENV = "FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER"
_DQ_BY_PRODUCER = Knob(DQ_BY_PRODUCER_ENV)
# The "keys" split's dK wgmma issued after dQ's (:func:`dk_after_dq`): plain non-causal calls at kernel head
# dim 128 by default; FLASHTILE_HOPPER_BWD_DK_LAST = 0 never, 1 every "keys" split call that adds dQ.
DK_LAST_ENV = "FLASHTILE_HOPPER_BWD_DK_LAST"
_DK_LAST = Knob(DK_LAST_ENV)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# Head dims without a kernel of their own run zero-padded: zero columns change neither S nor dP nor Δ.
PADDED_HEAD_DIM = {96: 128, 192: 256}
# The fused kernel's default partition is 4 consumer warps; a 4-warp consumer (240 registers) and a
# 1-warp producer (24) are workers, the producer padded to a warpgroup: 12 warps, and 168 registers a
# thread over 384 threads is the register file, which setmaxnreg moves to the consumers.
FUSED_WARPS = 4
FUSED_MAXNREG = 168
DQ_WARPS = 4
# The deterministic dQ kernel: 64 query rows a program, 64-row K/V blocks.
DQ_BLOCK_M = 64
DQ_BLOCK_N = 64


@dataclass(frozen=True)
class BwdVariant:
    """One configuration of the fused kernel.

    ``block_m`` query rows a block, ``block_n`` K/V rows a program, ``stages`` the depth of the Q/dO
    ring. ``split``: how the two consumer warpgroups share a program, ``"keys"`` (block_n/2 K/V rows
    each) or ``"dim"`` (D/2 columns each of dK, dV and dQ). ``dq_split``: what each adds to dQ per
    block, ``"keys"`` (its own keys' share, all columns, no exchange), ``"cols"`` (half of the columns
    over all keys) or ``"rows"`` (half of the query rows over all keys); the last two wait for the
    other warpgroup's half of dSᵀ."""

    block_m: int
    block_n: int
    stages: int
    split: str
    dq_split: str

    def dq_box(self, head_dim: int) -> tuple[int, int]:
        """(rows, columns) of the dQ tile one warpgroup adds per block."""
        rows = self.block_m // 2 if self.dq_split == "rows" else self.block_m
        cols = head_dim // 2 if self.dq_split == "cols" else head_dim
        return rows, cols

    def out_box(self, head_dim: int) -> tuple[int, int]:
        """(rows, columns) of the dK/dV tile one warpgroup stores."""
        if self.split == "dim":
            return self.block_n, head_dim // 2
        return self.block_n // 2, head_dim


def fused_warps(cfg: BwdVariant) -> int:
    """The fused kernel's default partition: the first consumer warpgroup (4 warps), or for the "dim"
    split both consumer warpgroups as one partition (8; :func:`_consumer_dim_joined`)."""
    return 8 if cfg.split == "dim" else FUSED_WARPS


# Per kernel head dim. D = 64: "m64" is the measured one; "m64-cols" halves the dQ reduce traffic for
# a barrier; "m128" doubles the query block (Sᵀ 64×128 per warpgroup, half the barriers and reduces per
# FLOP). D = 256 fits 227 KB only with 64 K/V rows and one Q/dO stage (docs/design/hopper_bwd.md).
VARIANTS: dict[int, dict[str, BwdVariant]] = {
    64: {
        "m64": BwdVariant(64, 128, 2, "keys", "keys"),
        "m64-cols": BwdVariant(64, 128, 2, "keys", "cols"),
        "m128": BwdVariant(128, 128, 2, "keys", "rows"),
    },
    128: {"m64": BwdVariant(64, 128, 2, "keys", "cols")},
    256: {"n64": BwdVariant(64, 64, 1, "dim", "cols")},
}
DEFAULT_VARIANT = {64: "m64", 128: "m64", 256: "n64"}
# Plain calls (dense or causal, no other window, no option; deterministic or not) take these instead. H200
# (docs/design/hopper_bwd.md, "Variants"): at D = 64 "m128" is 7-8 % faster than "m64" without a mask at
# N = 1k-16k; causal it was 4-8 % slower until its accumulators took −Δ and −LSE / scale, and is now 2-5 %
# faster (thirty-eighth session); with deterministic=True 4-15 % faster (thirty-ninth session). Packed
# batches stay on "m64": "m128" was 1-2 % slower there.
PLAIN_VARIANT = {64: "m128"}
SUPPORTED_HEAD_DIMS = tuple(sorted((*VARIANTS, *PADDED_HEAD_DIM)))
# Kernel head dims whose default variant has passed the GPU checks (an H100, 2026-11-23; D = 256's n64, and
# D = 192 padded to it, in the fifth session: 1.4-1.5x the portable backward). The backend routes any other
# kernel head dim to the portable backward unless the knob names one of its variants.
GPU_CHECKED_HEAD_DIMS = (64, 128, 256)
# The largest query block of any variant: the row statistics are padded to it.
_MAX_BLOCK_M = max(v.block_m for table in VARIANTS.values() for v in table.values())


def variant_names() -> list[str]:
    return sorted({name for table in VARIANTS.values() for name in table})


def routed_by_default(head_dim: int) -> bool:
    """Whether the hopper backend sends a supported call of this head dim here: its kernel's default
    variant passed the GPU checks, or ``FLASHTILE_HOPPER_BWD_VARIANT`` names one of its variants."""
    kernel_dim = PADDED_HEAD_DIM.get(head_dim, head_dim)
    knob = _VARIANT.get("").strip()
    return kernel_dim in GPU_CHECKED_HEAD_DIMS or knob in VARIANTS[kernel_dim]


def is_plain_call(
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: object,
    dropout_p: float,
    packed: object = None,
    mods: object = None,
) -> bool:
    """Whether a backward call takes ``PLAIN_VARIANT``: dense or causal (no other window), no softcap, ALiBi
    or dropout, not packed, no block mask; deterministic or not, with a learnable sink or not (its share
    from dS spills little in the D = 64 plain variant: 34 / 33 key-loop local accesses without a mask /
    causal on sm_90, 13-17 % faster than "m64" on an H200 in the thirty-ninth session)."""
    return (
        tuple(window_size) in ((-1, -1), (-1, 0))
        and not (softcap or dropout_p)
        and alibi_slopes is None
        and packed is None
        and mods is None
    )


def select_variant(head_dim: int, plain: bool = False) -> tuple[str, BwdVariant]:
    """The variant for a kernel head dim (64, 128 or 256): ``FLASHTILE_HOPPER_BWD_VARIANT`` where this
    head dim has a variant of that name, else for a ``plain`` call (dense or causal, no other window, no
    option) ``PLAIN_VARIANT``'s if it has one, else ``DEFAULT_VARIANT``."""
    name = _VARIANT.get("").strip()
    if name and name not in variant_names():
        raise FlashtileValueError(
            f"{VARIANT_ENV}={name!r} names no variant of the Hopper backward; accepted: {variant_names()}"
        )
    table = VARIANTS[head_dim]
    if name not in table:
        name = PLAIN_VARIANT.get(head_dim, DEFAULT_VARIANT[head_dim]) if plain else DEFAULT_VARIANT[head_dim]
    return name, table[name]


def persistent_grid(
    head_dim: int, cfg: BwdVariant, is_causal: bool, plain: bool, deterministic: bool, sink: bool
) -> bool:
    """Whether the fused kernel runs on a persistent grid: a plain (:func:`is_plain_call`) non-causal call
    of the "keys" split without a learnable sink, at a kernel head dim of ``PERSISTENT_HEAD_DIMS`` and not
    deterministic, or at any under ``FLASHTILE_HOPPER_BWD_PERSISTENT=1``; none under ``=0``."""
    if not plain or is_causal or sink or cfg.split != "keys":
        return False
    knob = _PERSISTENT.get("").strip()
    if knob in ("0", "1"):
        return knob == "1"
    return head_dim in PERSISTENT_HEAD_DIMS and not deterministic


def dq_by_producer(deterministic: bool, dropout: bool, block_mask: bool) -> bool:
    """Whether the producer warp issues the fused kernel's dQ reduces (DQ_BY_PRODUCER): the consumers
    stage dQ and arrive on a barrier instead of waiting for their last reduce and issuing the next one.
    Only calls that add dQ (not deterministic). By default those without dropout or a block mask: on an
    H200, plain calls 1.5-6 % faster at D = 64 and 0-2 % at D = 128 (s47f), 4-7 % at D = 256 causal
    (s48b) and 2-3 % without a mask (s49b); windows, softcap, ALiBi, packed batches and sinks 0-5 % (s48c,
    s48d); dropout 1-2 % slower (s48d), block masks +1 % (75 % empty tiles) and -6 % (documents) with a
    spread of 4 % (s49). DQ_BY_PRODUCER_ENV=1 takes those two too, =0 none."""
    if deterministic:
        return False
    knob = _DQ_BY_PRODUCER.get("").strip()
    if knob in ("0", "1"):
        return knob == "1"
    return not (dropout or block_mask)


def dk_after_dq(
    head_dim: int, cfg: BwdVariant, is_causal: bool, plain: bool, sink: bool, deterministic: bool
) -> bool:
    """Whether the "keys" split's consumers issue dK's wgmma after dQ's (DK_LAST), so that dQ's staging
    and reduce run while dK's wgmma does (FlashAttention-4's sm_90 order), instead of before it. Only
    calls that add dQ (not deterministic). By default plain non-causal calls without a sink at kernel head
    dim 128: on an H200 those ran 2-4 % faster at N = 1k-16k, but causal D = 128 ran 3-5 % slower,
    D = 64 2-4 % slower with or without the mask (s49a), and D = 128 with windows, softcap or ALiBi 2-9 %
    slower (s50a). DK_LAST_ENV=1 takes every call of the "keys" split that adds dQ, =0 none. (D = 256's
    joined partition, with the order under the knob, ran 8-16 % slower: s50a; the code was removed.)"""
    if deterministic or cfg.split != "keys":
        return False
    knob = _DK_LAST.get("").strip()
    if knob in ("0", "1"):
        return knob == "1"
    return head_dim == 128 and plain and not is_causal and not sink


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``global[coord] += src`` by a TMA bulk reduce (cp.reduce.async.bulk.tensor .add); Triton 3.6's
    ``hopper.tma`` does not export the reduce, its builder does."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


# A 1-D TMA box of row statistics must start 16-byte aligned: four fp32 values.
STATS_ALIGN = tl.constexpr(4)


@triton.jit
def varlen_stats_offset(start, seq):
    """Where packed sequence ``seq``'s row statistics start in its head's row: its first packed row ``start``
    rounded up to a multiple of STATS_ALIGN, plus STATS_ALIGN · seq, so that each starts 16-byte aligned
    and after the previous sequence's last value (docs/design/hopper_bwd.md, "Variable length")."""
    return (start + STATS_ALIGN - 1) // STATS_ALIGN * STATS_ALIGN + STATS_ALIGN * seq


def varlen_stats_rows(total_q: int, sequences: int, block_m: int) -> int:
    """The length of a head's row of statistics for a packed batch: past the last sequence's offset
    (:func:`varlen_stats_offset` ≤ total_q + STATS_ALIGN · sequences + 3) and its rows, in whole blocks."""
    return cdiv(total_q + STATS_ALIGN.value * (sequences + 1), block_m) * block_m


# Packed batches change the totals at every step: no specialisation on them.
@triton.jit(do_not_specialize=["seqlen_q", "seqlen_pad", "num_m_blocks"])
def attn_bwd_preprocess_kernel(
    o_ptr, do_ptr, lse_ptr, lse2_ptr, delta_ptr, dq_accum_ptr, cu_seqlens_ptr, sink_ptr, dsink_ptr,
    stride_ob, stride_on, stride_oh, stride_dob, stride_don, stride_doh,
    seqlen_q, seqlen_pad, num_m_blocks, H,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, ZERO_DQ: tl.constexpr, IS_VARLEN: tl.constexpr,
    SINK_TERM: tl.constexpr,
):  # fmt: skip
    """Δ = rowsum(O ∘ dO) and the LSE in base 2 into [B·H, seqlen_pad] rows the fused kernel reads by
    1-D TMA; padding rows and rows with no visible key get LSE = +inf (their P is exactly 0) and Δ = 0.
    ZERO_DQ: also zero these rows of the fp32 dQ accumulator (B, N, H, D) the fused kernel adds into (one
    launch and one allocation fewer than a separate memset). SINK_TERM: add −Σ_i P_sink,i·Δ_i·(1 − P_sink,i)
    over these rows into dsink_ptr + h, the part of a learnable sink's gradient the fused kernel leaves out
    (its share from dS; docs/design/sinks.md, "The share from dS").

    IS_VARLEN: program (block, b, h) takes the rows of packed sequence b, [cu_seqlens[b], cu_seqlens[b + 1])
    clamped into [0, seqlen_q = total], LSE (H, total); its statistics go to row h from
    :func:`varlen_stats_offset` on, 16-byte aligned for the TMA box (docs/design/hopper_bwd.md, "Variable
    length"); nothing is written past the sequence's rows (the next sequence's statistics may start there)."""
    pid = tl.program_id(0).to(tl.int64)
    m_block = pid % num_m_blocks
    bh = pid // num_m_blocks
    b = bh // H
    h = bh % H
    offs_m = m_block * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    if IS_VARLEN:
        start = tl.minimum(tl.maximum(tl.load(cu_seqlens_ptr + b), 0), seqlen_q)
        end = tl.minimum(tl.maximum(tl.load(cu_seqlens_ptr + b + 1), start), seqlen_q)
        in_range = offs_m < end - start
        stored = in_range
        rows = start + offs_m
        io_base = h * seqlen_q + rows
        stats = h * seqlen_pad + varlen_stats_offset(start, b) + offs_m
        o_rows = o_ptr + h * stride_oh + rows[:, None] * stride_on
        do_rows = do_ptr + h * stride_doh + rows[:, None] * stride_don
        dq_rows = rows * H + h
    else:
        in_range = offs_m < seqlen_q
        stored = offs_m < seqlen_pad
        io_base = bh * seqlen_q + offs_m
        stats = bh * seqlen_pad + offs_m
        o_rows = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on
        do_rows = do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
        dq_rows = (b * seqlen_q + offs_m) * H + h
    o = tl.load(o_rows + offs_d[None, :], mask=in_range[:, None], other=0.0)
    do = tl.load(do_rows + offs_d[None, :], mask=in_range[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    lse = tl.load(lse_ptr + io_base, mask=in_range, other=float("inf"))
    lse = tl.where(lse == -float("inf"), float("inf"), lse) * 1.4426950408889634
    tl.store(delta_ptr + stats, delta, mask=stored)
    tl.store(lse2_ptr + stats, lse, mask=stored)
    if SINK_TERM:
        # Rows out of range or with no visible key have LSE = +inf here: P_sink = 0.
        p_sink = tl.exp2(tl.load(sink_ptr + h) * 1.4426950408889634 - lse)
        tl.atomic_add(dsink_ptr + h, -tl.sum(p_sink * delta * (1.0 - p_sink), axis=0))
    if ZERO_DQ:
        zeros = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
        tl.store(dq_accum_ptr + dq_rows[:, None] * HEAD_DIM + offs_d[None, :], zeros, mask=in_range[:, None])


# The sequence count of packed batches changes at every step: no specialisation on it.
@triton.jit(do_not_specialize=["sequences"])
def attn_bwd_dq_postprocess_kernel(
    src_ptr, dst_ptr, cu_seqlens_ptr, numel, scale, row_elems, sequences, BLOCK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """dQ = scale · (the fp32 sum), in the input dtype. IS_VARLEN: rows of ``row_elems`` elements outside
    [cu_seqlens[0], cu_seqlens[sequences]), which no sequence holds and the preprocess did not zero, get 0."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    if IS_VARLEN:
        rows = offs // row_elems
        x = tl.where((rows >= tl.load(cu_seqlens_ptr)) & (rows < tl.load(cu_seqlens_ptr + sequences)), x, 0.0)
    tl.store(dst_ptr + offs, (x * scale).to(dst_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _rows3(smem, ROWS: gl.constexpr, COLS: gl.constexpr, layout3: gl.constexpr):
    """A [ROWS, COLS] shared tile seen as the [1, ROWS, COLS] box of a rank-3 descriptor."""
    return smem._reinterpret(smem.dtype, [1, ROWS, COLS], layout3)


@gluon.jit
def _last_first_start(j, m_first, per_head, BM: gl.constexpr):
    """The first query row of step j of a "dim" split program, whose blocks go from the last to m_first:
    the programs running at once then read the same Q/dO block, and under causal the masked diagonal block
    comes last (H100, D = 256: +2-7 % causal, none without a mask; docs/design/hopper_bwd.md). The
    blocks are a range (no block mask in the "dim" split): :func:`_tile_start` of step per_head − 1 − j."""
    return _tile_start(per_head - 1 - j, m_first, 0, BM, 0)


@gluon.jit
def _dim_blocks(
    n0, seqlen_q, seqlen_k, IS_CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
    row_layout: gl.constexpr,
):  # fmt: skip
    """A "dim" split program's key rows (in ``row_layout``), the diagonal's offset N_k − N_q, and its query
    blocks a head: the first, and how many (none past the keys' end)."""
    m_first, m_end = _q_block_range(n0, seqlen_q, seqlen_k, IS_CAUSAL, BM)
    rows = n0 + gl.arange(0, BN, layout=row_layout)
    return rows, seqlen_k - seqlen_q, m_first, gl.maximum(m_end - m_first, 0)


@gluon.jit
def _dim_step(it, m_first, per_head, h_kv, GROUP, NSTAGE: gl.constexpr, BM: gl.constexpr):
    """Step ``it`` of a "dim" split consumer: its Q/dO ring slot and phase, its query head (the group's
    heads one after another), its query block's first row (:func:`_last_first_start`) and its P/dS
    buffer (two, alternating)."""
    s = it % NSTAGE
    phase = (it // NSTAGE) & 1
    h = h_kv * GROUP + it // per_head
    m0 = _last_first_start(it % per_head, m_first, per_head, BM)
    return s, phase, h, m0, it % 2


@gluon.jit
def _q_block_range(n0, seqlen_q, seqlen_k, IS_CAUSAL: gl.constexpr, BM: gl.constexpr):
    """The query blocks [m_first, m_end) that see any key of the block starting at n0 (bottom-right)."""
    m_end = gl.cdiv(seqlen_q, BM)
    m_first = 0
    if IS_CAUSAL:
        # Key j is seen by queries i ≥ j − (N_k − N_q).
        m_first = gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // BM
    return m_first, m_end


@gluon.jit
def _q_blocks(
    n0, seqlen_q, seqlen_k, window_left, window_right, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
):  # fmt: skip
    """:func:`_q_block_range` under a sliding window: query i sees key j iff
    i + N_k − N_q − left ≤ j ≤ i + N_k − N_q + right, so the keys [n0, n0 + BN) are seen by the queries
    [n0 − diag − right, n0 + BN − 1 − diag + left] (docs/design/hopper_bwd.md, "Options")."""
    if IS_LOCAL:
        diag = seqlen_k - seqlen_q
        m_first = gl.maximum(n0 - diag - window_right, 0) // BM
        m_end = gl.cdiv(seqlen_q, BM)
        if HAS_WINDOW_LEFT:
            m_end = gl.minimum(m_end, gl.cdiv(gl.maximum(n0 + BN - diag + window_left, 0), BM))
        return m_first, m_end
    return _q_block_range(n0, seqlen_q, seqlen_k, IS_CAUSAL, BM)


@gluon.jit
def _listed_q_blocks(
    n0, b, h_kv, seqlen_q, seqlen_k, GROUP, window_left, window_right, lists, IS_CAUSAL: gl.constexpr,
    IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
    SPARSE_BLOCK_N: gl.constexpr, SPARSE_TILES: gl.constexpr,
):  # fmt: skip
    """``(m_first, per_head, tiles)``: the query blocks of each head of the group that the key block at n0
    visits, block i the one starting at ``_tile_start(i, m_first, tiles, BM, SPARSE_TILES)``: under a
    block mask (SPARSE_TILES query blocks per mask block) the listed ones of the group's first head (the
    launcher checks all heads of a group share the lists), else the range :func:`_q_blocks` gives."""
    count_ptr, index_ptr, full_count_ptr, full_index_ptr, stride_b, stride_h, row_len = lists[:7]
    if SPARSE_TILES:
        row_base, n_partial, n_listed = _block_list(
            count_ptr, full_count_ptr, b, h_kv * GROUP, n0 // SPARSE_BLOCK_N, stride_b, stride_h, row_len
        )
        m_first = 0
        per_head = n_listed * SPARSE_TILES
        tiles = (index_ptr, full_index_ptr, row_base, n_partial)
    else:
        m_first, m_end = _q_blocks(
            n0, seqlen_q, seqlen_k, window_left, window_right, IS_CAUSAL, IS_LOCAL, HAS_WINDOW_LEFT, BM, BN
        )
        per_head = gl.maximum(m_end - m_first, 0)
        tiles = (index_ptr, full_index_ptr, 0, 0)
    return m_first, per_head, tiles


@gluon.jit
def _bits_seen_t(bits, m0, key0, rows, cols, SPARSE_BLOCK_M: gl.constexpr, SPARSE_BLOCK_N: gl.constexpr):
    """A block mask's bits (flashtile.block_mask.MaskBits; ``bits`` = (its tile ids of the program's batch
    element and heads, its words, NK)) as an Sᵀ tile: key ``rows`` (from key0, inside one mask block) by
    query ``cols`` of the block at m0; True where the mask_mod held."""
    ids, words, nk = bits
    qb = m0 // SPARSE_BLOCK_M
    kb = key0 // SPARSE_BLOCK_N
    tile = gl.maximum(gl.load(ids + qb * nk + kb), 0)
    ROW_WORDS: gl.constexpr = SPARSE_BLOCK_N // 32
    first = (key0 - kb * SPARSE_BLOCK_N) // 32
    # Word `first + w` of each query row holds keys [32·(first + w), +32) of the block.
    base = words + (tile * SPARSE_BLOCK_M + cols - qb * SPARSE_BLOCK_M) * ROW_WORDS + first
    key = rows - kb * SPARSE_BLOCK_N
    word_of_key = gl.expand_dims(key // 32 - first, 1)
    picked = gl.expand_dims(gl.load(base), 0) + word_of_key * 0
    for w in gl.static_range(1, rows.shape[0] // 32):
        picked = gl.where(word_of_key == w, gl.expand_dims(gl.load(base + w), 0), picked)
    return ((picked >> gl.expand_dims(key % 32, 1)) & 1) != 0


@gluon.jit
def _mod_mask(
    pt, partial, b, h, m0, key0, cols, rows, seqlen_q, seqlen_k, aux, MASK_MOD: gl.constexpr,
    MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, SPARSE_BLOCK_M: gl.constexpr,
    SPARSE_BLOCK_N: gl.constexpr,
):  # fmt: skip
    """Pᵀ with the pairs (key rows ``rows``, queries ``cols``) that ``MASK_MOD`` (or the mask's bits, under
    MASK_BITS) hides set to 0, in a block mask's partial block (``partial``); unchanged in a full one."""
    if partial:
        if MASK_BITS:
            seen = _bits_seen_t(aux, m0, key0, rows, cols, SPARSE_BLOCK_M, SPARSE_BLOCK_N)
        else:
            seen = call_mod(
                None, b, h, cols[None, :], rows[:, None], seqlen_q, seqlen_k, aux, MASK_MOD, MASK_MOD_AUX
            )
        pt = gl.where(seen, pt, 0.0)
    return pt


@gluon.jit
def _in_sequence(rows, cols, seqlen_q, seqlen_k):
    """Which (key row, query column) pairs of an Sᵀ tile lie in the sequence (packed batches: the rows
    past its ends are the next sequence's)."""
    return (rows < seqlen_k)[:, None] & (cols < seqlen_q)[None, :]


@gluon.jit
def _producer(
    descs, loads, bars, sizes, HEAD_DIM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
    NSTAGE: gl.constexpr, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    lists, SPARSE_BLOCK_N: gl.constexpr, SPARSE_TILES: gl.constexpr, LAST_FIRST: gl.constexpr,
    PERSISTENT: gl.constexpr = False, sched=None, DQ_BY_PRODUCER: gl.constexpr = False, dq_args=None,
    DQ_ROWS: gl.constexpr = 64, DQ_COLS: gl.constexpr = 64,
):  # fmt: skip
    """The TMA warp of the program's key block, or under PERSISTENT (dense batches) of key blocks pid,
    pid + P, … (:func:`_persistent_blocks`), the ring's slots and phases counted across blocks.
    DQ_BY_PRODUCER ("keys" split): it also reduce-adds the dQ the consumers staged (``dq_args``: dQ's
    descriptor, the staging tiles, dq_staged, dq_free), one query block behind its loads."""
    if PERSISTENT:
        seqlen_q, seqlen_k, seqlen_pad, H, GROUP, window_left, window_right = sizes[3:10]
        count, entries = _persistent_blocks(sched, seqlen_q, GROUP, BM)
        for t in range(count):
            b, h_kv, n0 = _persistent_block(sched, t, BN)
            block_sizes = (
                b, h_kv, n0, seqlen_q, seqlen_k, seqlen_pad, H, GROUP, window_left, window_right, 0, 0, 0
            )  # fmt: skip
            _produce_block(
                descs, loads, bars, block_sizes, HEAD_DIM, BM, BN, NSTAGE, IS_CAUSAL, IS_LOCAL,
                HAS_WINDOW_LEFT, lists, SPARSE_BLOCK_N, SPARSE_TILES, LAST_FIRST, PERSISTENT, t * entries, t,
                DQ_BY_PRODUCER, dq_args, DQ_ROWS, DQ_COLS,
            )  # fmt: skip
    else:
        _produce_block(
            descs, loads, bars, sizes, HEAD_DIM, BM, BN, NSTAGE, IS_CAUSAL, IS_LOCAL, HAS_WINDOW_LEFT, lists,
            SPARSE_BLOCK_N, SPARSE_TILES, LAST_FIRST, PERSISTENT, 0, 0, DQ_BY_PRODUCER, dq_args, DQ_ROWS,
            DQ_COLS,
        )  # fmt: skip


@gluon.jit
def _persistent_blocks(sched, seqlen_q, GROUP, BM: gl.constexpr):
    """The program's key blocks on the persistent grid (``sched``: (key blocks of every KV head, key blocks
    a head, KV heads)): how many, and the ring entries each takes, every block of a plain non-causal call
    visiting each query block of its group's heads once."""
    pid = gl.program_id(0)
    return gl.cdiv(sched[0] - pid, gl.num_programs(0)), GROUP * gl.cdiv(seqlen_q, BM)


@gluon.jit
def _persistent_block(sched, t, BN: gl.constexpr):
    """(b, h_kv, n0) of the program's t-th key block, pid + t·P, numbered head by head as the
    one-program-a-block grid numbers them."""
    tile = gl.program_id(0) + t * gl.num_programs(0)
    num_n_blocks, heads_kv = sched[1:]
    bh_kv = tile // num_n_blocks
    return bh_kv // heads_kv, bh_kv % heads_kv, (tile % num_n_blocks) * BN


@gluon.jit
def _produce_block(
    descs, loads, bars, sizes, HEAD_DIM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
    NSTAGE: gl.constexpr, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    lists, SPARSE_BLOCK_N: gl.constexpr, SPARSE_TILES: gl.constexpr, LAST_FIRST: gl.constexpr,
    PERSISTENT: gl.constexpr, it0, t, DQ_BY_PRODUCER: gl.constexpr = False, dq_args=None,
    DQ_ROWS: gl.constexpr = 64, DQ_COLS: gl.constexpr = 64,
):  # fmt: skip
    """One key block: K and V once (under PERSISTENT after the consumers released the last block's,
    ``t`` blocks before), then (Q, LSE) and (dO, Δ) for every query block of every head of the group,
    each pair on its own barrier so Sᵀ can start before dO lands, in ring entries it0, it0 + 1, …;
    LAST_FIRST: the blocks in the "dim" split's order (:func:`_last_first_start`). The row statistics
    of query block m0 of head h are at (b·H + h)·seqlen_pad + stats_off + m0 (packed batches:
    ``stats_off`` is the sequence's aligned offset, :func:`varlen_stats_offset`)."""
    q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc = descs
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem = loads
    kv_bar, q_ready, do_ready, qdo_empty, kv_empty = bars
    b, h_kv, n0, seqlen_q, seqlen_k, seqlen_pad, H, GROUP, window_left, window_right = sizes[:10]
    q_off, k_off, stats_off = sizes[10:]
    kv3: gl.constexpr = k_desc.layout
    if PERSISTENT:
        # An mbarrier starts with its phase-1 wait complete: the first block finds K and V free.
        mbarrier.wait(kv_empty, (t & 1) ^ 1)
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(
        k_desc, [b, k_off + n0, h_kv * HEAD_DIM], kv_bar, _rows3(k_smem, BN, HEAD_DIM, kv3)
    )
    tma.async_copy_global_to_shared(
        v_desc, [b, k_off + n0, h_kv * HEAD_DIM], kv_bar, _rows3(v_smem, BN, HEAD_DIM, kv3)
    )
    m_first, per_head, tiles = _listed_q_blocks(
        n0, b, h_kv, seqlen_q, seqlen_k, GROUP, window_left, window_right, lists, IS_CAUSAL, IS_LOCAL,
        HAS_WINDOW_LEFT, BM, BN, SPARSE_BLOCK_N, SPARSE_TILES,
    )  # fmt: skip
    blocks = GROUP * per_head
    q3: gl.constexpr = q_desc.layout
    for it in range(blocks):
        s = (it0 + it) % NSTAGE
        phase = ((it0 + it) // NSTAGE) & 1
        h = h_kv * GROUP + it // per_head
        if LAST_FIRST:
            m0 = _last_first_start(it % per_head, m_first, per_head, BM)
        else:
            m0 = _tile_start(it % per_head, m_first, tiles, BM, SPARSE_TILES)
        row_stats = (b * H + h) * seqlen_pad + stats_off + m0
        mbarrier.wait(qdo_empty.index(s), phase ^ 1)
        bar = q_ready.index(s)
        mbarrier.expect(bar, q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, q_off + m0, h * HEAD_DIM], bar, _rows3(q_smem.index(s), BM, HEAD_DIM, q3)
        )
        tma.async_copy_global_to_shared(lse_desc, [row_stats], bar, lse_smem.index(s))
        bar = do_ready.index(s)
        mbarrier.expect(bar, do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            do_desc, [b, q_off + m0, h * HEAD_DIM], bar, _rows3(do_smem.index(s), BM, HEAD_DIM, q3)
        )
        tma.async_copy_global_to_shared(delta_desc, [row_stats], bar, delta_smem.index(s))
        if DQ_BY_PRODUCER:  # noqa: SIM102 (a constexpr test, then a runtime one)
            if it > 0:
                # The previous query block's dQ, once the consumers staged it.
                block = (it0, it - 1, b, h_kv * GROUP, per_head, m_first, tiles, q_off)
                _reduce_staged(dq_args, block, HEAD_DIM, BM, SPARSE_TILES, LAST_FIRST, DQ_ROWS, DQ_COLS)
    if DQ_BY_PRODUCER:  # noqa: SIM102 (a constexpr test, then a runtime one)
        if blocks > 0:
            block = (it0, blocks - 1, b, h_kv * GROUP, per_head, m_first, tiles, q_off)
            _reduce_staged(dq_args, block, HEAD_DIM, BM, SPARSE_TILES, LAST_FIRST, DQ_ROWS, DQ_COLS)


@gluon.jit
def _reduce_staged(
    dq_args, block, HEAD_DIM: gl.constexpr, BM: gl.constexpr, SPARSE_TILES: gl.constexpr,
    LAST_FIRST: gl.constexpr, DQ_ROWS: gl.constexpr, DQ_COLS: gl.constexpr,
):  # fmt: skip
    """DQ_BY_PRODUCER: once both consumers staged the dQ of the key block's query block ``i`` (ring entry
    it0 + i; ``block``: (it0, i, b, the group's first head, query blocks a head, the first, the block
    list, the packed row offset); LAST_FIRST: the "dim" split's order), reduce-add their tiles, wait until
    the reduces have read them, and free them."""
    it0, i, b, h0, per_head, m_first, tiles, q_off = block
    dq_desc, dq_smem, dq_staged, dq_free = dq_args
    dq3: gl.constexpr = dq_desc.layout
    h = h0 + i // per_head
    if LAST_FIRST:
        row = q_off + _last_first_start(i % per_head, m_first, per_head, BM)
    else:
        row = q_off + _tile_start(i % per_head, m_first, tiles, BM, SPARSE_TILES)
    mbarrier.wait(dq_staged, (it0 + i) & 1)
    for which in gl.static_range(2):
        # "cols" adds columns [D/2·which, +D/2), "rows" rows [m0 + BM/2·which, +BM/2), "keys" all.
        row0 = row + which * (BM - DQ_ROWS)
        col0 = h * HEAD_DIM + which * (HEAD_DIM - DQ_COLS)
        _tma_reduce_add(dq_desc, [b, row0, col0], _rows3(dq_smem.index(which), DQ_ROWS, DQ_COLS, dq3))
    tma.store_wait(0)
    mbarrier.arrive(dq_free, count=1)


@gluon.jit
def _alibi_probs(score, factor, lse, slope, rows, query_offsets, q0):
    """Pᵀ of a causal "keys" tile with ALiBi: exp2(score·factor − slope·(i′ − j) − LSE) for keys j = ``rows``
    and queries whose i′ = i + N_k − N_q = q0 + c, c = ``query_offsets`` (floats 0 … BM − 1). Every visible
    key is left of its query's i′, so |i′ − j| = c − (j − q0) and the exponent is score·factor +
    slope·(j − q0) − (LSE + slope·c): one FMA and one subtraction a score, the two parts once a row and
    once a column, where the absolute value took three operations. The causal mask zeroes the keys right
    of i′ after the exponential (their exponents may overflow to inf, which its select discards).
    hopper.md, "One FMA a score on one side of the diagonal", has the forward's form."""
    row_part = gl.expand_dims(slope * (rows - q0).to(gl.float32), 1)
    return gl.exp2(score * factor + row_part - gl.expand_dims(lse + slope * query_offsets, 0))


@gluon.jit
def _sink_probs(lse2, sink_ptr, h, m0, seqlen_q, IS_VARLEN: gl.constexpr):
    """P_sink,i = 2^(σ_h·log2 e − lse2_i) of queries m0, m0 + 1, … from their base-2 LSE (+inf on a dense
    batch's padding rows: 0)."""
    p_sink = gl.exp2(gl.load(sink_ptr + h) * LOG2_E_C - lse2)
    if IS_VARLEN:
        # Past a packed sequence's last query the statistics are another sequence's or never written (NaN
        # and inf included), where P is 0: 0, not 0 · NaN.
        cols = m0 + gl.arange(0, lse2.shape[0], layout=lse2.type.layout)
        p_sink = gl.where(cols < seqlen_q, p_sink, 0.0)
    return p_sink


@gluon.jit
def _consumer(
    descs, smem, bars, sizes, qk_scale, softmax_scale, options, HEAD_DIM: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, NSTAGE: gl.constexpr, DQ_SPLIT: gl.constexpr, DQ_ROWS: gl.constexpr,
    DQ_COLS: gl.constexpr, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, COMPUTE_DQ: gl.constexpr, IS_VARLEN: gl.constexpr,
    VARLEN_TMA_STORE: gl.constexpr, lists, SPARSE_BLOCK_N: gl.constexpr, SPARSE_TILES: gl.constexpr,
    MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, HAS_DROPOUT: gl.constexpr,
    HAS_SINK: gl.constexpr, which: gl.constexpr, PERSISTENT: gl.constexpr = False, sched=None,
    DK_LAST: gl.constexpr = False,
):  # fmt: skip
    """One warpgroup of a "keys" split over the program's key block, or under PERSISTENT (dense batches)
    over key blocks pid, pid + P, … in the producer's order (:func:`_producer`). DK_LAST (with COMPUTE_DQ
    only): dK's wgmma issued after dQ's."""
    if PERSISTENT:
        seqlen_q, seqlen_k, GROUP, q_off, k_off, H = sizes[3:9]
        count, entries = _persistent_blocks(sched, seqlen_q, GROUP, BM)
        for t in range(count):
            b, h_kv, n0 = _persistent_block(sched, t, BN)
            block_sizes = (b, h_kv, n0, seqlen_q, seqlen_k, GROUP, q_off, k_off, H, b)
            _consume_block(
                descs, smem, bars, block_sizes, qk_scale, softmax_scale, options, HEAD_DIM, BM, BN, NSTAGE,
                DQ_SPLIT, DQ_ROWS, DQ_COLS, IS_CAUSAL, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI,
                COMPUTE_DQ, IS_VARLEN, VARLEN_TMA_STORE, lists, SPARSE_BLOCK_N, SPARSE_TILES, MASK_MOD,
                MASK_MOD_AUX, MASK_BITS, HAS_DROPOUT, HAS_SINK, which, PERSISTENT, t * entries, t, DK_LAST,
            )  # fmt: skip
    else:
        _consume_block(
            descs, smem, bars, sizes, qk_scale, softmax_scale, options, HEAD_DIM, BM, BN, NSTAGE, DQ_SPLIT,
            DQ_ROWS, DQ_COLS, IS_CAUSAL, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, COMPUTE_DQ,
            IS_VARLEN, VARLEN_TMA_STORE, lists, SPARSE_BLOCK_N, SPARSE_TILES, MASK_MOD, MASK_MOD_AUX,
            MASK_BITS, HAS_DROPOUT, HAS_SINK, which, PERSISTENT, 0, 0, DK_LAST,
        )  # fmt: skip


@gluon.jit
def _consume_block(
    descs, smem, bars, sizes, qk_scale, softmax_scale, options, HEAD_DIM: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, NSTAGE: gl.constexpr, DQ_SPLIT: gl.constexpr, DQ_ROWS: gl.constexpr,
    DQ_COLS: gl.constexpr, IS_CAUSAL: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, COMPUTE_DQ: gl.constexpr, IS_VARLEN: gl.constexpr,
    VARLEN_TMA_STORE: gl.constexpr, lists, SPARSE_BLOCK_N: gl.constexpr, SPARSE_TILES: gl.constexpr,
    MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, HAS_DROPOUT: gl.constexpr,
    HAS_SINK: gl.constexpr, which: gl.constexpr, PERSISTENT: gl.constexpr, it0, t, DK_LAST: gl.constexpr,
):  # fmt: skip
    """One warpgroup of a "keys" split: K/V rows [n0 + BN/2·which, +BN/2) of the block; dK and dV stay
    in registers. Its query blocks take ring entries it0, it0 + 1, …; ``t`` blocks came before it in the
    program (PERSISTENT: K/V's phase, and its release once read). ``options``:
    (window_left, window_right, softcap_qk, softcap_out, alibi_ptr, stride_alibi_b, drop_args, sink_args),
    read under their switches; ``drop_args`` (rng_state_ptr, dropout_threshold,
    1 / (1 − p)), under HAS_DROPOUT: dropout regenerates the forward's mask (kernels/_dropout.py) for dV's P
    and dP; ``sink_args`` (sink_ptr, dsink_ptr), under HAS_SINK: each query head's sink logit (fp32), and its
    gradient's share −Σ P_sink·Σ_j dS in fp32 (docs/design/sinks.md, "The share from dS"; the preprocess
    adds the rest), added into dsink_ptr + h once a head.
    IS_VARLEN: the sequence's rows start at packed rows q_off and k_off; the rows past its ends (the next
    sequence's) are masked out of P and dS, and dK, dV go out by row-masked pointer stores to dk_ptr, dv_ptr
    (VARLEN_TMA_STORE: by TMA boxes where the block lies wholly inside its sequence, the pointer stores for a
    sequence's last block only). A block mask's partial query blocks (listed first) hide the pairs where
    MASK_MOD is False (``lists[-1]``: its aux)."""
    dq_desc, dk_desc, dv_desc, dk_ptr, dv_ptr = descs
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, dkv_smem = smem
    kv_bar, q_ready, do_ready, qdo_empty, ds_ready, kv_empty, THREAD_RELEASE = bars[:7]
    dq_staged, dq_free, DQ_BY_PRODUCER = bars[7:]
    b, h_kv, n0, seqlen_q, seqlen_k, GROUP, q_off, k_off, H, seq = sizes
    window_left, window_right, softcap_qk, softcap_out, alibi_ptr, stride_alibi_b = options[:6]
    drop_args, sink_args = options[6:]
    sink_ptr, dsink_ptr = sink_args
    WG_ROWS: gl.constexpr = BN // 2
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DQ_COLS, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    k_wg = k_smem.slice(which * WG_ROWS, WG_ROWS)
    v_wg = v_smem.slice(which * WG_ROWS, WG_ROWS)
    dk = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, acc_layout)
    zero_s = gl.zeros([WG_ROWS, BM], gl.float32, s_layout)
    zero_dq = gl.zeros([DQ_ROWS, DQ_COLS], gl.float32, dq_layout)
    # Key rows of this warpgroup, and the last query each sees (+ the diagonal's offset).
    rows = n0 + which * WG_ROWS + gl.arange(0, WG_ROWS, layout=row_layout)
    diag_offset = seqlen_k - seqlen_q
    m_first, per_head, tiles = _listed_q_blocks(
        n0, b, h_kv, seqlen_q, seqlen_k, GROUP, window_left, window_right, lists, IS_CAUSAL, IS_LOCAL,
        HAS_WINDOW_LEFT, BM, BN, SPARSE_BLOCK_N, SPARSE_TILES,
    )  # fmt: skip
    n_mod = 0
    if MASK_MOD is not None or MASK_BITS:
        # The partial blocks' query blocks lead each head's list.
        n_mod = tiles[3] * SPARSE_TILES
    aux = lists[-1]
    if MASK_BITS:
        # The tile ids of this batch element and the group's heads (one list for them all), once.
        ids, words, meta = aux
        aux = (ids + b * gl.load(meta) + (h_kv * GROUP) * gl.load(meta + 1), words, gl.load(meta + 2))
    if HAS_DROPOUT:
        seed, rng_offset = dropout.load_rng_state(drop_args[0])
    # ALiBi's column offsets 0 … BM − 1 in fp32, converted once here (ALIBI_OFFSETS) or per tile: beside
    # another option, or with 128-query tiles, keeping them spilled less inside the loop (sm_90 compile:
    # docs/design/hopper_bwd.md, "ALiBi's registers"); plain ALiBi over 64-query tiles spilled less per tile.
    ALIBI_OFFSETS: gl.constexpr = HAS_ALIBI and (HAS_SOFTCAP or HAS_DROPOUT or IS_LOCAL or BM > 64)
    # Causal ALiBi alone takes the one-sided form (_alibi_probs; sm_90, D = 128: 17 local accesses in the
    # key loop against 8). Without the causal mask its branch between the forms grew them from 37 to 94,
    # and beside softcap or dropout the forward's form spilled: those keep the absolute value.
    ALIBI_SPLIT: gl.constexpr = HAS_ALIBI and IS_CAUSAL and not (HAS_SOFTCAP or HAS_DROPOUT or IS_LOCAL)
    if ALIBI_OFFSETS:
        alibi_cols = gl.arange(0, BM, layout=col_layout).to(gl.float32)
    # The sink's gradient, each key row's share summed over its query blocks (two registers a thread).
    sink_rows = gl.zeros([WG_ROWS], gl.float32, row_layout)
    # −Δ and −LSE / scale as the dPᵀ and Sᵀ products' starting accumulators: their slices are read before
    # the products are issued and die there, instead of living beside Pᵀ and dPᵀ (sm_90 compile, key-loop
    # spills: docs/design/hopper_bwd.md, "Δ and the LSE in the products' accumulators"). Off where the
    # products must stay bare (dropout scales dP before Δ), where it grew
    # spills (mask bits: 23 -> 59 at D = 128), did nothing (D = 64 with 64-query tiles), was slower (causal
    # ALiBi alone, 1-2 % at D = 128 on an H200 with 10 spills against 17) or is not yet timed (D = 128
    # plain causal: 2 -> 0 spills; the full kernel's 2 -> 0 gained nothing).
    ANY_OPTION: gl.constexpr = HAS_SOFTCAP or HAS_ALIBI or IS_LOCAL or IS_VARLEN or HAS_SINK
    PLAIN_CAUSAL: gl.constexpr = IS_CAUSAL and not (ANY_OPTION or MASK_MOD is not None or SPARSE_TILES > 0)
    FOLD_DELTA: gl.constexpr = not (HAS_DROPOUT or MASK_BITS or ALIBI_SPLIT) and (
        BM > 64 or (HEAD_DIM > 64 and not PLAIN_CAUSAL)
    )
    # The LSE only where the exponent is the bare scaled score (no softcap, ALiBi or window term).
    FOLD_LSE: gl.constexpr = FOLD_DELTA and not (HAS_SOFTCAP or HAS_ALIBI or IS_LOCAL)
    if FOLD_LSE:
        neg_inv_scale = -1.0 / qk_scale
    dq3: gl.constexpr = dq_desc.layout
    mbarrier.wait(kv_bar, t & 1)
    for it in range(GROUP * per_head):
        # The ring's entry, counted across the program's blocks (one block without PERSISTENT).
        entry = it0 + it
        s = entry % NSTAGE
        phase = (entry // NSTAGE) & 1
        h = h_kv * GROUP + it // per_head
        m0 = _tile_start(it % per_head, m_first, tiles, BM, SPARSE_TILES)
        partial = (it % per_head) < n_mod
        q_s = q_smem.index(s)
        do_s = do_smem.index(s)

        # Packed batches: only a block reaching past the sequence's last query or key holds the next
        # sequence's rows.
        at_end = (m0 + BM > seqlen_q) | (n0 + BN > seqlen_k)
        mbarrier.wait(q_ready.index(s), phase)
        if FOLD_LSE:
            # Sᵀ − LSE / scale: exp2 of it times the scale is P.
            lse = lse_smem.index(s).load(col_layout)
            st0 = gl.broadcast((lse * neg_inv_scale)[None, :], zero_s)[0]
            st = warpgroup_mma(k_wg, q_s.permute((1, 0)), st0, is_async=True)
        else:
            st = warpgroup_mma(k_wg, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        if FOLD_DELTA:
            # dPᵀ − Δ, the factor dS takes of P.
            dpt0 = gl.broadcast(-delta_smem.index(s).load(col_layout)[None, :], zero_s)[0]
            dpt = warpgroup_mma(v_wg, do_s.permute((1, 0)), dpt0, is_async=True)
        else:
            dpt = warpgroup_mma(v_wg, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if HAS_DROPOUT:
            # Dropout's draws while both wgmmas run: a register per eight entries until they are picked.
            drawn = dropout.draw(
                seed, rng_offset, drop_args[1], seq * H + h, n0 + which * WG_ROWS, m0, BM, s_layout, False
            )  # fmt: skip
        if not FOLD_LSE:
            lse = lse_smem.index(s).load(col_layout)
        st = warpgroup_mma_wait(1, deps=(st,))
        if HAS_SOFTCAP or HAS_ALIBI or IS_LOCAL:
            # The forward's base-2 score: softcap · tanh(s / softcap), then −slope · |i + N_k − N_q − j|.
            cols = m0 + gl.arange(0, BM, layout=col_layout)
            # The score's positive factor folds into the exponential's FMA, as in the forward.
            if HAS_SOFTCAP:
                capped = _tanh(st * softcap_qk)
                score, factor = capped, softcap_out
            else:
                score, factor = st, qk_scale
            if HAS_ALIBI:
                slope = gl.load(alibi_ptr + seq * stride_alibi_b + h) * LOG2_E_C
            if ALIBI_SPLIT:
                # Causal ALiBi alone: the distance's row and column parts (_alibi_probs).
                if ALIBI_OFFSETS:
                    query_offsets = alibi_cols
                else:
                    query_offsets = gl.arange(0, BM, layout=col_layout).to(gl.float32)
                pt = _alibi_probs(score, factor, lse, slope, rows, query_offsets, m0 + diag_offset)
            else:
                if HAS_ALIBI:
                    # Distances from the tile's first query, whose offsets converted once: one subtraction
                    # and one FMA a score, exact in fp32 below 2^24.
                    if ALIBI_OFFSETS:
                        rows_f = (rows - (m0 + diag_offset)).to(gl.float32)
                        dist = gl.abs(alibi_cols[None, :] - rows_f[:, None])
                    else:
                        cols_f = (cols + diag_offset).to(gl.float32)
                        dist = gl.abs(cols_f[None, :] - rows.to(gl.float32)[:, None])
                    score = score + (-slope / factor) * dist
                pt = gl.exp2(score * factor - lse[None, :])
            if IS_VARLEN and at_end:
                pt = gl.where(_in_sequence(rows, cols, seqlen_q, seqlen_k), pt, 0.0)
            # Dense batches mask every tile, not only those across the diagonal: with that branch ptxas
            # spilled 140 registers' loads and stores a key loop with softcap (54 without it; sm_90 compile,
            # docs/design/hopper_bwd.md); packed batches spilled more without it, and keep it.
            if IS_CAUSAL and (not IS_VARLEN or m0 < n0 + BN - diag_offset):
                pt = gl.where(rows[:, None] <= (cols + diag_offset)[None, :], pt, 0.0)
            if IS_LOCAL:
                # Key j is visible to query i iff i + diag − left ≤ j ≤ i + diag + right.
                pt = gl.where(rows[:, None] <= (cols + (diag_offset + window_right))[None, :], pt, 0.0)
                if HAS_WINDOW_LEFT:
                    pt = gl.where(rows[:, None] >= (cols + (diag_offset - window_left))[None, :], pt, 0.0)
            if MASK_MOD is not None or MASK_BITS:
                pt = _mod_mask(
                    pt, partial, seq, h, m0, n0 + which * WG_ROWS, cols, rows, seqlen_q, seqlen_k, aux,
                    MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_TILES * BM, SPARSE_BLOCK_N,
                )  # fmt: skip
            # P as the dV operand and P·(1 − tanh²) (the softcap's derivative; the softmax scale comes at the
            # end) before dPᵀ lands: fewer registers live across the wait than P and tanh in fp32.
            if HAS_DROPOUT:
                # Dropped in the operand's dtype, two entries a register (dropout.keep_pairs).
                p_op = gl.convert_layout(dropout.keep_pairs(pt * drop_args[2], *drawn, dtype), a_layout)
            else:
                p_op = gl.convert_layout(pt.to(dtype), a_layout)
            if HAS_SOFTCAP:
                pt = pt * (1.0 - capped * capped)
            if not FOLD_DELTA:
                delta = delta_smem.index(s).load(col_layout)
            dpt = warpgroup_mma_wait(0, deps=(dpt,))
            if HAS_DROPOUT:
                # dP of the dropped P: the forward's mask and 1 / (1 − p); Δ already is that of the output.
                dpt = gl.where(dropout.kept(*drawn), dpt * drop_args[2], 0.0)
            dst = pt * dpt if FOLD_DELTA else pt * (dpt - delta[None, :])
            if IS_VARLEN and at_end:
                # 0, not 0 · (the next sequence's dP − Δ), whatever those rows hold.
                dst = gl.where(_in_sequence(rows, cols, seqlen_q, seqlen_k), dst, 0.0)
        else:
            pt = gl.exp2(st * qk_scale) if FOLD_LSE else gl.exp2(st * qk_scale - lse[None, :])
            if IS_VARLEN and at_end:
                cols = m0 + gl.arange(0, BM, layout=col_layout)
                pt = gl.where(_in_sequence(rows, cols, seqlen_q, seqlen_k), pt, 0.0)
            # Only the blocks that cross the diagonal hold keys a query must not see.
            if IS_CAUSAL and m0 < n0 + BN - diag_offset:
                cols = m0 + gl.arange(0, BM, layout=col_layout)
                pt = gl.where(rows[:, None] <= cols[None, :] + diag_offset, pt, 0.0)
            if MASK_MOD is not None or MASK_BITS:
                cols = m0 + gl.arange(0, BM, layout=col_layout)
                pt = _mod_mask(
                    pt, partial, seq, h, m0, n0 + which * WG_ROWS, cols, rows, seqlen_q, seqlen_k, aux,
                    MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_TILES * BM, SPARSE_BLOCK_N,
                )  # fmt: skip
            if not FOLD_DELTA:
                delta = delta_smem.index(s).load(col_layout)
            dpt = warpgroup_mma_wait(0, deps=(dpt,))
            if HAS_DROPOUT:
                kept = dropout.kept(*drawn)
                dp = gl.where(kept, dpt * drop_args[2], 0.0)
                dst = pt * (dp - delta[None, :])
                p_op = gl.convert_layout(dropout.keep_pairs(pt * drop_args[2], *drawn, dtype), a_layout)
            else:
                dst = pt * dpt if FOLD_DELTA else pt * (dpt - delta[None, :])
                p_op = gl.convert_layout(pt.to(dtype), a_layout)
            if IS_VARLEN and at_end:
                cols = m0 + gl.arange(0, BM, layout=col_layout)
                dst = gl.where(_in_sequence(rows, cols, seqlen_q, seqlen_k), dst, 0.0)
        if HAS_SINK:
            # Σ_i P_sink,i·Σ_j dS_ij from the fp32 dS; the preprocess adds the rest, Σ_i P_sink,i·Δ_i·(1 −
            # P_sink,i) (docs/design/sinks.md, "The share from dS"): Pᵀ and dPᵀ need not stay live together
            # beside the sink's terms (sm_90 key-loop local accesses, without a mask / causal: D = 128 161 /
            # 165 → 43 / 35, D = 64 `m128` 422 / 694 → 34 / 33). The LSE is read again here rather than kept
            # live since the products were issued (D = 128: 43 / 35 against 39 / 92).
            p_sink = _sink_probs(lse_smem.index(s).load(col_layout), sink_ptr, h, m0, seqlen_q, IS_VARLEN)
            sink_rows += gl.sum(dst * p_sink[None, :], axis=1)
        dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
        ds_lo = dst.to(dtype)
        ds_op = gl.convert_layout(ds_lo, a_layout)
        if not DK_LAST:
            dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
        if COMPUTE_DQ:
            ds_buf = ds_smem.index(entry % 2)
            ds_buf.slice(which * WG_ROWS, WG_ROWS).store(ds_lo)
            fence_async_shared()
            if DQ_SPLIT == "keys":
                # dQ += dS[:, keys] · K[keys, :] over this warpgroup's own keys: no exchange.
                dq = warpgroup_mma(
                    ds_buf.slice(which * WG_ROWS, WG_ROWS).permute((1, 0)), k_wg, zero_dq, use_acc=False,
                    is_async=True,
                )  # fmt: skip
            else:
                # Both halves of dSᵀ are needed: wait until the other warpgroup has written its own.
                mbarrier.arrive(ds_ready.index(entry % 2))
                mbarrier.wait(ds_ready.index(entry % 2), (entry // 2) & 1)
                if DQ_SPLIT == "cols":
                    dq = warpgroup_mma(
                        ds_buf.permute((1, 0)), k_smem.slice(which * DQ_COLS, DQ_COLS, dim=1), zero_dq,
                        use_acc=False, is_async=True,
                    )  # fmt: skip
                else:
                    dq = warpgroup_mma(
                        ds_buf.slice(which * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0)), k_smem, zero_dq,
                        use_acc=False, is_async=True,
                    )  # fmt: skip
            if DK_LAST:
                # dK goes after dQ, so that dQ's staging below runs while it does; P (dV's register
                # operand) is free once dV completes.
                dv, _ = warpgroup_mma_wait(1, deps=(dv, p_op))
                dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
                dq = warpgroup_mma_wait(1, deps=(dq,))
            else:
                # The register operands stay alive until their dots complete.
                dv, dk, _, _ = warpgroup_mma_wait(1, deps=(dv, dk, p_op, ds_op))
                _release(qdo_empty.index(s), THREAD_RELEASE)
                dq = warpgroup_mma_wait(0, deps=(dq,))
            # The previous block's reduce must have read the staging tile before it is overwritten.
            if DQ_BY_PRODUCER:
                mbarrier.wait(dq_free, (entry & 1) ^ 1)
            else:
                tma.store_wait(0)
            stage = dq_smem.index(which)
            stage.store(dq)
            fence_async_shared()
            if DQ_BY_PRODUCER:
                mbarrier.arrive(dq_staged, count=1)
            else:
                # "cols" adds columns [D/2·which, +D/2), "rows" rows [m0 + BM/2·which, +BM/2), "keys" all.
                row0 = q_off + m0 + which * (BM - DQ_ROWS)
                col0 = h * HEAD_DIM + which * (HEAD_DIM - DQ_COLS)
                _tma_reduce_add(dq_desc, [b, row0, col0], _rows3(stage, DQ_ROWS, DQ_COLS, dq3))
            if DK_LAST:
                # The register operand dS stays alive until dK completes.
                dk, _ = warpgroup_mma_wait(0, deps=(dk, ds_op))
                _release(qdo_empty.index(s), THREAD_RELEASE)
        else:
            dv, dk, _, _ = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
            _release(qdo_empty.index(s), THREAD_RELEASE)
        if HAS_SINK:  # noqa: SIM102 (a constexpr test, then a runtime one)
            if it % per_head == per_head - 1:
                # Head h's last query block: this warpgroup's share, one atomic add (in no fixed order,
                # so deterministic=True takes the portable backward). Key rows past N_k hold zeros whose P
                # no mask cleared in a dense block without the causal one: their dS = −P·Δ is not zero.
                share = gl.where(rows < seqlen_k, sink_rows, 0.0)
                gl.atomic_add(dsink_ptr + h, -gl.sum(share, axis=0))
                sink_rows = gl.zeros([WG_ROWS], gl.float32, row_layout)
    if PERSISTENT:
        # Every wgmma reading K and V has completed: the producer may load the next block's while this
        # warpgroup stores dK and dV.
        _release(kv_empty, THREAD_RELEASE)
    tma.store_wait(0)

    if IS_VARLEN:
        # A block wholly inside its sequence can leave by TMA boxes; at a sequence's last block a box would
        # overwrite the next sequence's rows.
        if VARLEN_TMA_STORE:
            if n0 + BN <= seqlen_k:
                _store_dkv_boxes(
                    dk, dv, dkv_smem, dk_desc, dv_desc, b, k_off + n0, h_kv, softmax_scale, which
                )
            else:
                _store_dkv_rows(
                    dk, dv, dk_ptr, dv_ptr, n0, k_off, seqlen_k, h_kv, H, GROUP, softmax_scale, which
                )
        else:
            _store_dkv_rows(dk, dv, dk_ptr, dv_ptr, n0, k_off, seqlen_k, h_kv, H, GROUP, softmax_scale, which)
    else:
        _store_dkv_boxes(dk, dv, dkv_smem, dk_desc, dv_desc, b, n0, h_kv, softmax_scale, which)


@gluon.jit
def _store_dkv_rows(
    dk, dv, dk_ptr, dv_ptr, n0, k_off, seqlen_k, h_kv, H, GROUP, softmax_scale, which: gl.constexpr
):
    """dV and scaled dK of one warpgroup's BN/2 key rows by row-masked pointer stores from the registers, into
    packed (total_k, H_KV, D) rows of H_KV·D elements: the rows past the sequence's keys are not written."""
    WG_ROWS: gl.constexpr = dk.shape[0]
    HEAD_DIM: gl.constexpr = dk.shape[1]
    acc_layout: gl.constexpr = dk.type.layout
    dtype: gl.constexpr = dk_ptr.dtype.element_ty
    key_rows = n0 + which * WG_ROWS + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, acc_layout))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    row_elems = (H // GROUP) * HEAD_DIM
    offsets = (k_off + key_rows).to(gl.int64)[:, None] * row_elems + (h_kv * HEAD_DIM + dims)[None, :]
    keep = (key_rows < seqlen_k)[:, None] & (dims < HEAD_DIM)[None, :]
    gl.store(dv_ptr + offsets, dv.to(dtype), mask=keep)
    gl.store(dk_ptr + offsets, (dk * softmax_scale).to(dtype), mask=keep)


@gluon.jit
def _store_dkv_boxes(
    dk, dv, dkv_smem, dk_desc, dv_desc, b, first_row, h_kv, softmax_scale, which: gl.constexpr
):
    """dV and scaled dK of one warpgroup's BN/2 key rows, from ``first_row`` (the block's) on, staged in
    shared memory and stored by TMA boxes."""
    WG_ROWS: gl.constexpr = dk.shape[0]
    HEAD_DIM: gl.constexpr = dk.shape[1]
    dtype: gl.constexpr = dkv_smem.dtype
    out3: gl.constexpr = dk_desc.layout
    stage = dkv_smem.index(which)
    row0 = first_row + which * WG_ROWS
    stage.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(
        dv_desc, [b, row0, h_kv * HEAD_DIM], _rows3(stage, WG_ROWS, HEAD_DIM, out3)
    )
    tma.store_wait(0)
    stage.store((dk * softmax_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(
        dk_desc, [b, row0, h_kv * HEAD_DIM], _rows3(stage, WG_ROWS, HEAD_DIM, out3)
    )
    tma.store_wait(0)


@gluon.jit
def _consumer_dim_joined(
    descs, smem, bars, sizes, qk_scale, softmax_scale, HEAD_DIM: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, NSTAGE: gl.constexpr, IS_CAUSAL: gl.constexpr, COMPUTE_DQ: gl.constexpr,
    DQ_BY_PRODUCER: gl.constexpr = False, dq_bars=None,
):  # fmt: skip
    """The causal "dim" split as one partition of two warpgroups (8 warps): every wgmma spreads its N over
    both, warpgroup w taking Sᵀ and dPᵀ for query rows [BM/2·w, +BM/2) and columns [D/4·w, +D/4) of each D/2
    half of dK, dV and dQ (each half its own accumulator, so that it stages and leaves by the halves' TMA
    boxes). P and dS go to shared memory as [query, key] tiles, read whole by the next wgmmas after a
    partition barrier. The query blocks go from the last to the first (:func:`_last_first_start`).
    DQ_BY_PRODUCER: dQ's halves are staged for the producer warp's reduces (``dq_bars``: dq_staged,
    dq_free)."""
    dq_desc, dk_desc, dv_desc = descs
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem = smem
    kv_bar, q_ready, do_ready, qdo_empty = bars[:4]
    b, h_kv, n0, seqlen_q, seqlen_k, GROUP = sizes
    HALF_D: gl.constexpr = HEAD_DIM // 2
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BM // 2, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, HALF_D // 2, 16]
    )
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    k_lo = k_smem.slice(0, HALF_D, dim=1)
    k_hi = k_smem.slice(HALF_D, HALF_D, dim=1)
    dk_lo = gl.zeros([BN, HALF_D], gl.float32, acc_layout)
    dk_hi = gl.zeros([BN, HALF_D], gl.float32, acc_layout)
    dv_lo = gl.zeros([BN, HALF_D], gl.float32, acc_layout)
    dv_hi = gl.zeros([BN, HALF_D], gl.float32, acc_layout)
    zero_s = gl.zeros([BN, BM], gl.float32, s_layout)
    zero_dq = gl.zeros([BM, HALF_D], gl.float32, acc_layout)
    rows, diag_offset, m_first, per_head = _dim_blocks(n0, seqlen_q, seqlen_k, IS_CAUSAL, BM, BN, row_layout)
    dq3: gl.constexpr = dq_desc.layout
    mbarrier.wait(kv_bar, 0)
    for it in range(GROUP * per_head):
        s, phase, h, m0, buf = _dim_step(it, m_first, per_head, h_kv, GROUP, NSTAGE, BM)
        q_s = q_smem.index(s)
        do_s = do_smem.index(s)

        mbarrier.wait(q_ready.index(s), phase)
        st = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        dpt = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        lse = lse_smem.index(s).load(col_layout)
        st = warpgroup_mma_wait(1, deps=(st,))
        pt = gl.exp2(st * qk_scale - lse[None, :])
        if IS_CAUSAL and m0 < n0 + BN - diag_offset:
            cols = m0 + gl.arange(0, BM, layout=col_layout)
            pt = gl.where(rows[:, None] <= cols[None, :] + diag_offset, pt, 0.0)
        delta = delta_smem.index(s).load(col_layout)
        dpt = warpgroup_mma_wait(0, deps=(dpt,))
        dst = pt * (dpt - delta[None, :])
        p_smem.index(buf).permute((1, 0)).store(pt.to(dtype))
        ds_smem.index(buf).permute((1, 0)).store(dst.to(dtype))
        fence_async_shared()
        # Every query row of P and dS is needed: both warpgroups' halves written.
        gl.thread_barrier()
        p_t = p_smem.index(buf).permute((1, 0))
        ds_t = ds_smem.index(buf).permute((1, 0))
        dv_lo = warpgroup_mma(p_t, do_s.slice(0, HALF_D, dim=1), dv_lo, is_async=True)
        dv_hi = warpgroup_mma(p_t, do_s.slice(HALF_D, HALF_D, dim=1), dv_hi, is_async=True)
        dk_lo = warpgroup_mma(ds_t, q_s.slice(0, HALF_D, dim=1), dk_lo, is_async=True)
        dk_hi = warpgroup_mma(ds_t, q_s.slice(HALF_D, HALF_D, dim=1), dk_hi, is_async=True)
        if COMPUTE_DQ:
            dq_lo = warpgroup_mma(ds_smem.index(buf), k_lo, zero_dq, use_acc=False, is_async=True)
            dq_hi = warpgroup_mma(ds_smem.index(buf), k_hi, zero_dq, use_acc=False, is_async=True)
            dv_lo, dv_hi, dk_lo, dk_hi = warpgroup_mma_wait(2, deps=(dv_lo, dv_hi, dk_lo, dk_hi))
            mbarrier.arrive(qdo_empty.index(s))
            dq_lo, dq_hi = warpgroup_mma_wait(0, deps=(dq_lo, dq_hi))
            # The previous block's reduces must have read the staging tiles before they are overwritten.
            if DQ_BY_PRODUCER:
                mbarrier.wait(dq_bars[1], (it & 1) ^ 1)
            else:
                tma.store_wait(0)
            dq_smem.index(0).store(dq_lo)
            dq_smem.index(1).store(dq_hi)
            fence_async_shared()
            if DQ_BY_PRODUCER:
                mbarrier.arrive(dq_bars[0], count=1)
            else:
                col0 = h * HEAD_DIM
                _tma_reduce_add(dq_desc, [b, m0, col0], _rows3(dq_smem.index(0), BM, HALF_D, dq3))
                _tma_reduce_add(dq_desc, [b, m0, col0 + HALF_D], _rows3(dq_smem.index(1), BM, HALF_D, dq3))
        else:
            dv_lo, dv_hi, dk_lo, dk_hi = warpgroup_mma_wait(0, deps=(dv_lo, dv_hi, dk_lo, dk_hi))
            mbarrier.arrive(qdo_empty.index(s))
    if DQ_BY_PRODUCER:
        # The producer's last reduces have read the tiles (parity 1 of a fresh barrier: no block).
        mbarrier.wait(dq_bars[1], ((GROUP * per_head) & 1) ^ 1)
    tma.store_wait(0)

    # dK and dV are staged in the dQ tiles, free now that the last reduces have read them.
    out3: gl.constexpr = dk_desc.layout
    out_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, HALF_D], dtype)
    col0 = h_kv * HEAD_DIM
    lo = dq_smem.index(0)._reinterpret(dtype, [BN, HALF_D], out_tile)
    hi = dq_smem.index(1)._reinterpret(dtype, [BN, HALF_D], out_tile)
    lo.store(dv_lo.to(dtype))
    hi.store(dv_hi.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dv_desc, [b, n0, col0], _rows3(lo, BN, HALF_D, out3))
    tma.async_copy_shared_to_global(dv_desc, [b, n0, col0 + HALF_D], _rows3(hi, BN, HALF_D, out3))
    tma.store_wait(0)
    lo.store((dk_lo * softmax_scale).to(dtype))
    hi.store((dk_hi * softmax_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, n0, col0], _rows3(lo, BN, HALF_D, out3))
    tma.async_copy_shared_to_global(dk_desc, [b, n0, col0 + HALF_D], _rows3(hi, BN, HALF_D, out3))
    tma.store_wait(0)


# Sizes stay runtime values: packed training changes the totals and the block count at every step.
@gluon.jit(
    do_not_specialize=[
        "seqlen_q", "seqlen_k", "seqlen_pad", "num_n_blocks", "window_left", "window_right", "stride_alibi_b",
        "list_stride_b", "list_stride_h", "list_row_len", "dropout_threshold", "num_tiles",
    ]
)  # fmt: skip
def attn_bwd_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc,
    alibi_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, dk_ptr, dv_ptr,
    q_count_ptr, q_index_ptr, full_q_count_ptr, full_q_index_ptr, aux, rng_state_ptr, sink_ptr, dsink_ptr,
    seqlen_q, seqlen_k, seqlen_pad, num_n_blocks, H, GROUP, qk_scale, softmax_scale,
    window_left, window_right, softcap_qk, softcap_out, stride_alibi_b, dropout_threshold, dropout_keep_frac,
    list_stride_b, list_stride_h, list_row_len, num_tiles, HEAD_DIM: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, NSTAGE: gl.constexpr,
    SPLIT: gl.constexpr, DQ_SPLIT: gl.constexpr, DQ_ROWS: gl.constexpr, DQ_COLS: gl.constexpr,
    IS_CAUSAL: gl.constexpr, COMPUTE_DQ: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr, IS_VARLEN: gl.constexpr,
    VARLEN_TMA_STORE: gl.constexpr, SPARSE_BLOCK_N: gl.constexpr, SPARSE_TILES: gl.constexpr,
    MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, HAS_SINK: gl.constexpr,
    PERSISTENT: gl.constexpr, DQ_BY_PRODUCER: gl.constexpr, DK_LAST: gl.constexpr = False,
):  # fmt: skip
    """Fused dK/dV (and dQ by reduce-add when COMPUTE_DQ) for one BN-row K/V block of one KV head, or
    under PERSISTENT ("keys" split, dense batches) for key blocks pid, pid + P, … of the ``num_tiles``
    (one program an SM; the next block's K and V load while the consumers store this one's dK and dV). A
    window (IS_LOCAL, not the plain causal mask), softcap, ALiBi and dropout (HAS_DROPOUT: the forward's
    mask from the int64 (seed, offset) at rng_state_ptr, kept iff the draw ≥ dropout_threshold, kept
    entries scaled by 1 / dropout_keep_frac) are taken by the "keys" split only. DQ_BY_PRODUCER ("keys"
    split, or the "dim" split's joined partition; COMPUTE_DQ): the consumers stage dQ and the
    producer warp reduce-adds it (:func:`dq_by_producer`). DK_LAST ("keys" split, COMPUTE_DQ): dK's
    wgmma is issued after dQ's (:func:`dk_after_dq`).

    IS_VARLEN ("keys" split only): q/k/v/dO/dQ are packed (1, total, H·D) behind the descriptors,
    seqlen_q/k the totals, sequence b the rows [cu_seqlens[b], cu_seqlens[b + 1]) (clamped into
    [0, total]); the row statistics are (H, seqlen_pad), sequence b's from varlen_stats_offset on; dK and
    dV go to the packed tensors at dk_ptr, dv_ptr (docs/design/hopper_bwd.md, "Variable length").

    SPARSE_TILES > 0 (dense batches, "keys" split): a block mask of (SPARSE_TILES · BM, SPARSE_BLOCK_N)
    blocks whose ``q`` lists (flashtile.BlockMask's, read at b·list_stride_b + h·list_stride_h + row,
    rows of list_row_len entries) are the same for every head of a KV head's group: a program visits the
    listed query blocks of its key block only, and in the partial ones hides the pairs where
    ``MASK_MOD(b, h, q_idx, kv_idx[, aux])`` is False (None: none). Otherwise the list pointers are unused;
    ``aux`` is the mask_mod's tensors or None."""
    pid = gl.program_id(0)
    # Head by head: the programs running at once share their head's Q and dO in L2 (numbering the key
    # blocks across heads first was 25-45 % slower at N = 1k-2k; docs/design/hopper_bwd.md).
    n_block = pid % num_n_blocks
    bh_kv = pid // num_n_blocks
    H_KV = H // GROUP
    b = bh_kv // H_KV
    h_kv = bh_kv % H_KV
    n0 = n_block * BN
    dtype: gl.constexpr = q_desc.dtype
    q_off = 0
    k_off = 0
    if IS_VARLEN:
        q_off, q_end = _sequence_rows(cu_seqlens_q_ptr, b, seqlen_q)
        k_off, k_end = _sequence_rows(cu_seqlens_k_ptr, b, seqlen_k)
        seqlen_q = q_end - q_off
        seqlen_k = k_end - k_off
    # The sequence (its ALiBi slopes' row) and the descriptors' batch coordinate: one batch of packed rows.
    seq = b
    stats_off = q_off
    if IS_VARLEN:
        b = 0
        stats_off = varlen_stats_offset(q_off, seq)
    if n0 >= seqlen_k:
        # A block past this sequence's keys (the grid covers the longest): nothing to do.
        return

    tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, HEAD_DIM], dtype)
    q_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, HEAD_DIM], dtype)
    dq_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DQ_ROWS, DQ_COLS], gl.float32)
    k_smem = gl.allocate_shared_memory(dtype, [BN, HEAD_DIM], tile)
    v_smem = gl.allocate_shared_memory(dtype, [BN, HEAD_DIM], tile)
    q_smem = gl.allocate_shared_memory(dtype, [NSTAGE, BM, HEAD_DIM], q_tile)
    do_smem = gl.allocate_shared_memory(dtype, [NSTAGE, BM, HEAD_DIM], q_tile)
    lse_smem = gl.allocate_shared_memory(gl.float32, [NSTAGE, BM], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [NSTAGE, BM], delta_desc.layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, DQ_ROWS, DQ_COLS], dq_tile)

    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NSTAGE, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NSTAGE, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [NSTAGE, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # DQ_BY_PRODUCER: the consumers stage dQ and arrive on dq_staged; the producer warp reduce-adds it and
    # arrives on dq_free once the reduce has read the staging tiles.
    dq_staged = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    dq_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # Q/dO slots released by every thread of both consumers (_release) in the "keys" split at D = 128,
    # measured on an H200 (s33c: +1-2 %); at D = 64 it was 8 % slower (causal), and in the "dim" split
    # (D = 256) it grew the loops' spills from 56 to 187 (sm_90 compile): one arrival a partition there.
    THREAD_RELEASE: gl.constexpr = SPLIT == "keys" and HEAD_DIM == 128
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_empty, count=2 * WG_THREADS if THREAD_RELEASE else 2)
    # The "dim" split runs its two consumer warpgroups as one partition (_consumer_dim_joined): against
    # two partitions, 6-9 % faster causal at D = 256 on an H200 (s37a), and with the producer's dQ reduces
    # 2-3 % faster without a mask (s49b).
    consumer_arrivals: gl.constexpr = 1 if SPLIT == "dim" else 2
    for i in gl.static_range(NSTAGE):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2 * WG_THREADS if THREAD_RELEASE else consumer_arrivals)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
    mbarrier.init(dq_staged, count=consumer_arrivals)
    mbarrier.init(dq_free, count=1)

    descs = (dq_desc, dk_desc, dv_desc)
    keys_bars = (
        kv_bar, q_ready, do_ready, qdo_empty, ds_ready, kv_empty, THREAD_RELEASE, dq_staged, dq_free,
        DQ_BY_PRODUCER,
    )  # fmt: skip
    sizes = (b, h_kv, n0, seqlen_q, seqlen_k, GROUP)
    loads = (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem)
    load_descs = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc)
    load_bars = (kv_bar, q_ready, do_ready, qdo_empty, kv_empty)
    load_sizes = (
        b, h_kv, n0, seqlen_q, seqlen_k, seqlen_pad, H, GROUP, window_left, window_right, q_off, k_off,
        stats_off,
    )  # fmt: skip
    drop_args = (rng_state_ptr, dropout_threshold, 1.0 / dropout_keep_frac)
    sink_args = (sink_ptr, dsink_ptr)
    options = (
        window_left, window_right, softcap_qk, softcap_out, alibi_ptr, stride_alibi_b, drop_args, sink_args
    )  # fmt: skip
    lists = (
        q_count_ptr, q_index_ptr, full_q_count_ptr, full_q_index_ptr, list_stride_b, list_stride_h,
        list_row_len, aux,
    )  # fmt: skip
    if SPLIT == "dim":
        # P and dS as [query, key] tiles, double-buffered: a warpgroup may run one block ahead.
        pds_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], dtype)
        p_smem = gl.allocate_shared_memory(dtype, [2, BM, BN], pds_tile)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BM, BN], pds_tile)
        smem = (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem)
        gl.warp_specialize(
            [
                (_consumer_dim_joined, (descs, smem, load_bars, sizes, qk_scale, softmax_scale, HEAD_DIM,
                                        BM, BN, NSTAGE, IS_CAUSAL, COMPUTE_DQ,
                                        DQ_BY_PRODUCER and COMPUTE_DQ, (dq_staged, dq_free))),
                (_producer, (load_descs, loads, load_bars, load_sizes, HEAD_DIM, BM, BN, NSTAGE,
                             IS_CAUSAL, False, False, lists, SPARSE_BLOCK_N, 0, True, False, None,
                             DQ_BY_PRODUCER and COMPUTE_DQ, (dq_desc, dq_smem, dq_staged, dq_free),
                             DQ_ROWS, DQ_COLS)),
            ],
            [1],
            [24],
        )  # fmt: skip
    else:
        ds_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
        out_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN // 2, HEAD_DIM], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], ds_tile)
        dkv_smem = gl.allocate_shared_memory(dtype, [2, BN // 2, HEAD_DIM], out_tile)
        smem = (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, dkv_smem)
        keys_descs = (dq_desc, dk_desc, dv_desc, dk_ptr, dv_ptr)
        keys_sizes = (b, h_kv, n0, seqlen_q, seqlen_k, GROUP, q_off, k_off, H, seq)
        sched = (num_tiles, num_n_blocks, H_KV)
        gl.warp_specialize(
            [
                (_consumer, (keys_descs, smem, keys_bars, keys_sizes, qk_scale, softmax_scale, options,
                             HEAD_DIM, BM, BN, NSTAGE, DQ_SPLIT, DQ_ROWS, DQ_COLS, IS_CAUSAL, IS_LOCAL,
                             HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, COMPUTE_DQ, IS_VARLEN, VARLEN_TMA_STORE,
                             lists, SPARSE_BLOCK_N, SPARSE_TILES, MASK_MOD, MASK_MOD_AUX, MASK_BITS,
                             HAS_DROPOUT, HAS_SINK, 0, PERSISTENT, sched, DK_LAST and COMPUTE_DQ)),
                (_consumer, (keys_descs, smem, keys_bars, keys_sizes, qk_scale, softmax_scale, options,
                             HEAD_DIM, BM, BN, NSTAGE, DQ_SPLIT, DQ_ROWS, DQ_COLS, IS_CAUSAL, IS_LOCAL,
                             HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, COMPUTE_DQ, IS_VARLEN, VARLEN_TMA_STORE,
                             lists, SPARSE_BLOCK_N, SPARSE_TILES, MASK_MOD, MASK_MOD_AUX, MASK_BITS,
                             HAS_DROPOUT, HAS_SINK, 1, PERSISTENT, sched, DK_LAST and COMPUTE_DQ)),
                (_producer, (load_descs, loads, load_bars, load_sizes, HEAD_DIM, BM, BN, NSTAGE, IS_CAUSAL,
                             IS_LOCAL, HAS_WINDOW_LEFT, lists, SPARSE_BLOCK_N, SPARSE_TILES, False,
                             PERSISTENT, sched, DQ_BY_PRODUCER and COMPUTE_DQ,
                             (dq_desc, dq_smem, dq_staged, dq_free), DQ_ROWS, DQ_COLS)),
            ],
            [4, 1],
            [240, 24],
        )  # fmt: skip


@gluon.jit
def attn_bwd_dq_kernel(
    q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr,
    seqlen_q, seqlen_k, seqlen_pad, num_m_blocks, H, GROUP, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, IS_CAUSAL: gl.constexpr,
):  # fmt: skip
    """dQ of one 64-row query block, written once (no atomics): the deterministic backward's second pass.
    K/V blocks stream through a two-stage TMA ring issued one block ahead."""
    pid = gl.program_id(0)
    m_block = pid % num_m_blocks
    bh = pid // num_m_blocks
    b = bh // H
    h = bh % H
    h_kv = h // GROUP
    m0 = m_block * BM
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, HEAD_DIM], dtype)
    kv_tile: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, HEAD_DIM], dtype)
    q3: gl.constexpr = q_desc.layout
    kv3: gl.constexpr = k_desc.layout

    q_smem = gl.allocate_shared_memory(dtype, [BM, HEAD_DIM], q_tile)
    do_smem = gl.allocate_shared_memory(dtype, [BM, HEAD_DIM], q_tile)
    k_smem = gl.allocate_shared_memory(dtype, [2, BN, HEAD_DIM], kv_tile)
    v_smem = gl.allocate_shared_memory(dtype, [2, BN, HEAD_DIM], kv_tile)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)

    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, m0, h * HEAD_DIM], q_bar, _rows3(q_smem, BM, HEAD_DIM, q3))
    tma.async_copy_global_to_shared(do_desc, [b, m0, h * HEAD_DIM], q_bar, _rows3(do_smem, BM, HEAD_DIM, q3))
    diag_offset = seqlen_k - seqlen_q
    n_end = seqlen_k
    if IS_CAUSAL:
        # Query i sees keys j ≤ i + N_k − N_q.
        n_end = gl.minimum(seqlen_k, m0 + BM + diag_offset)
    num_n = gl.cdiv(gl.maximum(n_end, 0), BN)
    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    if num_n > 0:
        mbarrier.expect(kv_ready.index(0), kv_bytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, 0, h_kv * HEAD_DIM], kv_ready.index(0), _rows3(k_smem.index(0), BN, HEAD_DIM, kv3)
        )
        tma.async_copy_global_to_shared(
            v_desc, [b, 0, h_kv * HEAD_DIM], kv_ready.index(0), _rows3(v_smem.index(0), BN, HEAD_DIM, kv3)
        )
    rows = m0 + gl.arange(0, BM, layout=row_layout)
    lse = gl.load(lse_ptr + bh * seqlen_pad + rows)
    delta = gl.load(delta_ptr + bh * seqlen_pad + rows)
    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    dq = gl.zeros([BM, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(q_bar, 0)
    for j in range(num_n):
        s = j % 2
        if j + 1 < num_n:
            # The other stage's last reader (block j − 1's dots) has completed.
            nxt = kv_ready.index(1 - s)
            mbarrier.expect(nxt, kv_bytes)
            n_next = (j + 1) * BN
            tma.async_copy_global_to_shared(
                k_desc, [b, n_next, h_kv * HEAD_DIM], nxt, _rows3(k_smem.index(1 - s), BN, HEAD_DIM, kv3)
            )
            tma.async_copy_global_to_shared(
                v_desc, [b, n_next, h_kv * HEAD_DIM], nxt, _rows3(v_smem.index(1 - s), BN, HEAD_DIM, kv3)
            )
        mbarrier.wait(kv_ready.index(s), (j // 2) & 1)
        k_s = k_smem.index(s)
        sc = warpgroup_mma(q_smem, k_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_smem, v_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        sc = warpgroup_mma_wait(1, deps=(sc,))
        p = gl.exp2(sc * qk_scale - lse[:, None])
        if IS_CAUSAL:
            n0 = j * BN
            if n0 + BN > m0 + diag_offset:
                cols = n0 + gl.arange(0, BN, layout=col_layout)
                p = gl.where(cols[None, :] <= rows[:, None] + diag_offset, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp,))
        ds = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq = warpgroup_mma(ds, k_s, dq, is_async=True)
        dq, _ = warpgroup_mma_wait(0, deps=(dq, ds))

    out_smem = gl.allocate_shared_memory(dtype, [BM, HEAD_DIM], q_tile)
    out_smem.store((dq * softmax_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [b, m0, h * HEAD_DIM], _rows3(out_smem, BM, HEAD_DIM, q3))
    tma.store_wait(0)


def _dims4(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of t as (B, N, H, D): a packed (total, H, D) tensor is one batch (no view made:
    a view costs host time at every call)."""
    if t.dim() == 3:
        return (1, *t.shape), (t.numel(), *t.stride())
    return tuple(t.shape), t.stride()


def rank3_fields(
    shape: tuple[int, ...], strides: tuple[int, ...], rows: int, cols: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The rank-3 descriptor (shape, strides, box) of a (B, N, H, D) tensor of these strides, seen as
    [B, N, H·D] (heads packed), moving [1, rows, cols] blocks: the sequence is a dimension of its own, so a
    block never reaches into the next batch."""
    batch, seqlen, heads, head_dim = shape
    return (batch, seqlen, heads * head_dim), (strides[0], strides[1], 1), (1, rows, cols)


def _descriptor(t: torch.Tensor, rows: int, cols: int | None = None) -> CheckedDescriptor:
    """:func:`rank3_fields`' descriptor over t (B, N, H, D), or packed (total, H, D) (one batch), blocks
    [1, rows, cols] (cols = D by default)."""
    shape, strides = _dims4(t)
    return descriptor(t, *rank3_fields(shape, strides, rows, shape[3] if cols is None else cols))


def _row_stats_descriptor(t: torch.Tensor, rows: int) -> CheckedDescriptor:
    return descriptor(t, (t.numel(),), (1,), (rows,))


def heads_packed(t: torch.Tensor) -> bool:
    """Whether a rank-3 descriptor can read ``t``'s layout (heads packed, the last dim contiguous, the
    other strides 16-byte aligned), its address aside."""
    es = t.element_size()
    shape, strides = _dims4(t)
    return strides[3] == 1 and strides[2] == shape[3] and all((s * es) % 16 == 0 for s in strides[:2])


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` if a rank-3 descriptor can read it (:func:`heads_packed`, a 16-byte aligned address), else a
    contiguous copy."""
    return t if heads_packed(t) and t.data_ptr() % 16 == 0 else t.contiguous()


def varlen_enabled() -> bool:
    """Whether packed batches run in the fused kernel (``GPU_CHECKED_VARLEN``, or the knob)."""
    return GPU_CHECKED_VARLEN or os.environ.get(VARLEN_ENV, "").strip() == "1"


def options_enabled() -> bool:
    """Whether windows, softcap and ALiBi run in the fused kernel (``GPU_CHECKED_OPTIONS``, or the knob)."""
    return GPU_CHECKED_OPTIONS or os.environ.get(OPTIONS_ENV, "").strip() == "1"


def bwd_unsupported_reason(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, options: Mapping[str, Any]
) -> str | None:
    """Why this backward cannot run these inputs (then the portable kernel does), or None.

    ``options`` holds the launcher keywords of ``attn_bwd`` (normalised as in docs/design/options.md);
    a missing key is at its default."""
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "the Gluon backward needs a GPU of compute capability 9.x (Hopper)"
    if q.dtype not in SUPPORTED_DTYPES or any(t.dtype != q.dtype for t in (k, v, dout)):
        return f"dtype {q.dtype}: the Gluon backward takes float16 or bfloat16 for q, k, v and dout alike"
    varlen = options.get("cu_seqlens_q") is not None
    if varlen and not varlen_enabled():
        return f"variable-length (packed) batches (not yet GPU-checked here: {VARLEN_ENV}=1 takes them)"
    if q.dim() != (3 if varlen else 4):
        return f"q of {q.dim()} dimensions"
    head_dim = q.shape[-1]
    if varlen and PADDED_HEAD_DIM.get(head_dim, head_dim) == 256:
        return "variable-length (packed) batches at head dims 192 and 256"
    if varlen and options.get("deterministic"):
        return "variable-length (packed) batches with deterministic=True"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head dim {head_dim}: the Gluon backward takes {SUPPORTED_HEAD_DIMS}"
    if v.shape[-1] != head_dim:
        return f"a V head dim ({v.shape[-1]}) other than Q/K's ({head_dim})"
    window = tuple(options.get("window_size", (-1, -1)))
    if (
        window not in ((-1, -1), (-1, 0))
        or options.get("softcap", 0.0)
        or options.get("alibi_slopes") is not None
    ):
        if not options_enabled():
            return (
                f"sliding windows, softcap and ALiBi (not yet GPU-checked here: {OPTIONS_ENV}=1 takes them)"
            )
        if PADDED_HEAD_DIM.get(head_dim, head_dim) == 256:
            return "sliding windows, softcap and ALiBi at head dims 192 and 256"
        if options.get("deterministic"):
            return "sliding windows, softcap and ALiBi with deterministic=True"
    if options.get("dropout_p", 0.0):
        if PADDED_HEAD_DIM.get(head_dim, head_dim) == 256:
            return "dropout at head dims 192 and 256"
        if options.get("deterministic"):
            return "dropout with deterministic=True"
        if options.get("mods") is not None:
            return "dropout with a block mask"
    mods = options.get("mods")
    if mods is not None:
        reason = block_mask_unsupported_reason(mods, varlen)
        if reason is not None:
            return reason
        if PADDED_HEAD_DIM.get(head_dim, head_dim) == 256:
            return "a block mask at head dims 192 and 256"
        if options.get("deterministic"):
            return "a block mask with deterministic=True"
        group = q.shape[-2] // k.shape[-2]
        if group > 1 and mods.block_mask.q_num_blocks.shape[1] > 1:
            return "a block mask that differs between the query heads of a KV head (GQA)"
    if options.get("learnable_sink") is not None:
        # The sink's gradient is summed over the "keys" split's tiles by atomic adds (its share from dS);
        # the "dim" split (D = 192, 256) has no share.
        if PADDED_HEAD_DIM.get(head_dim, head_dim) not in GPU_CHECKED_SINK_DIMS:
            return f"a learnable sink at head dim {head_dim} (the Gluon backward takes it at 64, 96 and 128)"
        if options.get("deterministic"):
            return "a learnable sink with deterministic=True"
        if options.get("softcap", 0.0):
            return "a learnable sink with softcap"
        if options.get("mods") is not None:
            # Compiled for sm_90 (tests/test_hopper_bwd_sm90.py), not yet run on a GPU.
            return "a learnable sink with a block mask"
    if q.numel() == 0 or k.numel() == 0:
        return "empty tensors (nothing to launch)"
    rows = q.shape[0] if varlen else q.shape[0] * q.shape[1]
    if q.shape[-2] * (cdiv(rows, _MAX_BLOCK_M) + 1) * _MAX_BLOCK_M >= 2**31:
        return "more than 2³¹ rows of row statistics"
    return None


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
    deterministic: bool = False,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, ...]:
    """The backward on Hopper; the contract of ``flashtile.kernels.bwd.attn_bwd``: q, dout, out
    (B, N_q, H, D), k, v (B, N_k, H_KV, D), fp16/bf16, D in ``SUPPORTED_HEAD_DIMS``; lse (B, H, N_q) fp32
    natural log. Returns dq, dk, dv, contiguous, in the dtypes and shapes of q, k, v, and with a
    ``learnable_sink`` its fp32 gradient (H,) fourth.
    ``deterministic=True`` computes dQ in a second kernel that owns its rows, so the result is bitwise
    the same every run. ``FLASHTILE_HOPPER_BWD_VARIANT`` picks the fused kernel's configuration.

    >>> dq, dk, dv = attn_bwd(dout, q, k, v, out, lse, q.shape[-1] ** -0.5, causal=True)
    """
    # Causal bounds the right side at 0 and keeps the left one (a causal sliding window).
    window_size = (window_size[0], 0) if causal else tuple(window_size)
    checked = {
        **options, "window_size": window_size, "deterministic": deterministic, "softcap": softcap,
        "alibi_slopes": alibi_slopes,
    }  # fmt: skip
    reason = bwd_unsupported_reason(q, k, v, dout, checked)
    if reason is not None:
        raise FlashtileValueError(f"the Hopper backward does not support these inputs: {reason}")
    return launch_supported(
        dout, q, k, v, out, lse, softmax_scale, window_size, deterministic, softcap, alibi_slopes, options
    )


def launch_supported(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    window_size: tuple[int, int],
    deterministic: bool,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    options: Mapping[str, Any],
) -> tuple[torch.Tensor, ...]:
    """:func:`attn_bwd` for a call :func:`bwd_unsupported_reason` has accepted (the backend's router checks
    once: the check costs host time at every layer of every step); ``window_size`` has causal's right side
    0 already, ``options`` the other launcher keywords. Returns (dq, dk, dv), and the sink's fp32 gradient
    (H,) fourth with a ``learnable_sink``."""
    is_causal = window_size == (-1, 0)
    packed = None
    if options.get("cu_seqlens_q") is not None:
        packed = tuple(options[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"))
    dropout_p = options.get("dropout_p", 0.0)
    extra = (
        window_size,
        softcap,
        alibi_slopes,
        packed,
        options.get("mods"),
        dropout_p,
        options.get("rng_state"),
        options.get("learnable_sink"),
    )
    head_dim = q.shape[-1]
    padded = PADDED_HEAD_DIM.get(head_dim)
    if padded is None:
        return _launch(dout, q, k, v, out, lse, softmax_scale, is_causal, deterministic, *extra)
    wide = [torch.nn.functional.pad(t, (0, padded - head_dim)) for t in (dout, q, k, v, out)]
    grads = _launch(*wide, lse, softmax_scale, is_causal, deterministic, *extra)
    # dQ, dK, dV back to the head dim; the sink's gradient (if any) has none.
    return (*(g[..., :head_dim].contiguous() for g in grads[:3]), *grads[3:])


# The tensors of each launch, in its kernel's parameter order.
PREPROCESS_POINTERS = (
    "o_ptr", "do_ptr", "lse_ptr", "lse2_ptr", "delta_ptr", "dq_accum_ptr", "cu_seqlens_ptr", "sink_ptr",
    "dsink_ptr",
)  # fmt: skip
FUSED_POINTERS = (
    "q_desc", "k_desc", "v_desc", "do_desc", "lse_desc", "delta_desc", "dq_desc", "dk_desc", "dv_desc",
    "alibi_ptr", "cu_seqlens_q_ptr", "cu_seqlens_k_ptr", "dk_ptr", "dv_ptr",
    "q_count_ptr", "q_index_ptr", "full_q_count_ptr", "full_q_index_ptr", "aux", "rng_state_ptr", "sink_ptr",
    "dsink_ptr",
)  # fmt: skip
DQ_POINTERS = ("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc", "lse_ptr", "delta_ptr")
POSTPROCESS_POINTERS = ("src_ptr", "dst_ptr", "cu_seqlens_ptr")


def _stats_rows(seqlen_q: int, block_m: int, varlen: tuple[int, int, int] | None) -> int:
    """The length of each (batch, head) row of row statistics: the query rows in whole blocks, or for a
    packed batch (``varlen``'s sequence count first) :func:`varlen_stats_rows`."""
    if varlen is None:
        return cdiv(seqlen_q, block_m) * block_m
    return varlen_stats_rows(seqlen_q, varlen[0], block_m)


# Everything but the tensors is a function of these arguments: one set of launches per call signature.
@functools.lru_cache(maxsize=512)
def _bwd_launches(
    device: torch.device,
    shape_q: tuple[int, int, int, int],
    shape_k: tuple[int, int],
    softmax_scale: float,
    is_causal: bool,
    deterministic: bool,
    cfg: BwdVariant,
    out_strides: tuple[int, int, int],
    dout_strides: tuple[int, int, int],
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_stride: int | None = None,
    varlen: tuple[int, int, int] | None = None,
    varlen_tma_store: bool = False,
    sparse: Sparse | None = None,
    dropout_p: float = 0.0,
    sink: bool = False,
    persistent: bool = False,
    producer_reduces: bool = False,
    dk_last: bool = False,
) -> tuple[KernelLaunch, KernelLaunch, KernelLaunch]:
    """The preprocess, the fused kernel, and the deterministic dQ kernel or the dQ postprocess.
    ``shape_q`` is q's (B, N_q, H, D), ``shape_k`` (N_k, H_KV); the strides are out's and dout's first
    three, which the preprocess reads by pointer; the window (causal as (−1, 0)), softcap and the ALiBi
    slopes' batch stride (None without slopes) as the forward's :func:`option_arguments` takes them.
    Packed batches: ``shape_q`` (1, total_q, H, D), ``shape_k`` (total_k, H_KV) and ``varlen`` (number
    of sequences, grid_seqlen(max_seqlen_q), grid_seqlen(max_seqlen_k)): the grid covers the rounded
    longest sequence, whose lengths also clamp the window; ``varlen_tma_store``: the packed epilogue's TMA
    boxes (``VARLEN_TMA_STORE_ENV``: on unless it is "0"); ``sparse``: a block mask's
    :data:`flashtile.kernels.hopper.fwd.Sparse`, or None; ``dropout_p``: the forward's (0 without dropout);
    ``sink``: a learnable sink (its gradient summed in the fused kernel); ``persistent``: the fused kernel
    on a persistent grid (:func:`persistent_grid`); ``producer_reduces``: its dQ reduces issued by the
    producer warp (:func:`dq_by_producer`); ``dk_last``: dK's wgmma issued after dQ's
    (:func:`dk_after_dq`)."""
    batch, seqlen_q, heads, head_dim = shape_q
    seqlen_k, heads_kv = shape_k
    longest = (seqlen_q, seqlen_k) if varlen is None else varlen[1:]
    bm, bn = cfg.block_m, cfg.block_n
    sequences = batch if varlen is None else varlen[0]
    seqlen_pad = _stats_rows(seqlen_q, bm, varlen)
    # Dense: blocks of the batch's rows; packed: blocks of each sequence's (up to the rounded longest).
    num_m_blocks = cdiv(longest[0], bm)
    qk_scale = softmax_scale * LOG2_E
    dq_rows, dq_cols = cfg.dq_box(head_dim)
    preprocess = KernelLaunch(
        attn_bwd_preprocess_kernel, (num_m_blocks * sequences * heads,), device, PREPROCESS_POINTERS,
        dict(
            stride_ob=out_strides[0], stride_on=out_strides[1], stride_oh=out_strides[2],
            stride_dob=dout_strides[0], stride_don=dout_strides[1], stride_doh=dout_strides[2],
            seqlen_q=seqlen_q, seqlen_pad=seqlen_pad, num_m_blocks=num_m_blocks, H=heads,
            HEAD_DIM=head_dim, BLOCK=bm, ZERO_DQ=not deterministic, IS_VARLEN=varlen is not None,
            SINK_TERM=sink,
        ),
        {},
    )  # fmt: skip
    num_n_blocks = cdiv(longest[1], bn)
    sizes = dict(
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, seqlen_pad=seqlen_pad, H=heads, GROUP=heads // heads_kv
    )
    scales = dict(qk_scale=qk_scale, softmax_scale=softmax_scale)
    opts = option_arguments(softmax_scale, False, window_size, softcap, alibi_stride, *longest, dropout_p)
    # The plain causal mask keeps its own code (IS_CAUSAL); IS_LOCAL is any other window.
    opts["IS_LOCAL"] = opts["IS_LOCAL"] and not is_causal
    num_tiles = num_n_blocks * sequences * heads_kv
    programs = min(num_tiles, multiprocessor_count(device)) if persistent else num_tiles
    fused = KernelLaunch(
        attn_bwd_kernel, (programs,), device, FUSED_POINTERS,
        dict(
            **sizes, num_n_blocks=num_n_blocks, num_tiles=num_tiles, PERSISTENT=persistent, **scales,
            HEAD_DIM=head_dim, BM=bm, BN=bn,
            NSTAGE=cfg.stages, SPLIT=cfg.split, DQ_SPLIT=cfg.dq_split, DQ_ROWS=dq_rows, DQ_COLS=dq_cols,
            IS_CAUSAL=is_causal, COMPUTE_DQ=not deterministic, IS_VARLEN=varlen is not None,
            VARLEN_TMA_STORE=varlen is not None and varlen_tma_store, **opts,
            **sparse_arguments(sparse, bm, "q"), HAS_SINK=sink,
            DQ_BY_PRODUCER=producer_reduces, DK_LAST=dk_last,
        ),
        {"num_warps": fused_warps(cfg), "maxnreg": FUSED_MAXNREG},
    )  # fmt: skip
    if deterministic:
        num_m_blocks = cdiv(seqlen_q, DQ_BLOCK_M)
        finish = KernelLaunch(
            attn_bwd_dq_kernel, (num_m_blocks * batch * heads,), device, DQ_POINTERS,
            dict(
                **sizes, num_m_blocks=num_m_blocks, **scales, HEAD_DIM=head_dim, BM=DQ_BLOCK_M,
                BN=DQ_BLOCK_N, IS_CAUSAL=is_causal,
            ),
            {"num_warps": DQ_WARPS},
        )  # fmt: skip
    else:
        numel = batch * seqlen_q * heads * head_dim
        finish = KernelLaunch(
            attn_bwd_dq_postprocess_kernel, (cdiv(numel, 1024),), device, POSTPROCESS_POINTERS,
            dict(
                numel=numel, scale=softmax_scale, row_elems=heads * head_dim, sequences=sequences, BLOCK=1024,
                IS_VARLEN=varlen is not None,
            ),
            {},
        )  # fmt: skip
    return preprocess, fused, finish


def _launch(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    is_causal: bool,
    deterministic: bool,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    packed: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
    mods: Mods | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """The kernels for validated inputs whose head dim has a kernel (64, 128, 256); the window with
    causal's (−1, 0) when ``is_causal``. ``packed``: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) of a varlen batch, whose q/k/v/dout/out are (total, H, D) and LSE (H, total_q);
    ``mods``: a block mask (and its mask_mod) the fused kernel takes, or None; ``dropout_p`` > 0 with the
    forward's ``rng_state``: dropout; ``learnable_sink`` fp32 (H,): its gradient is returned fourth."""
    # The sink's gradient, summed by atomic adds (a head whose rows see no key gets 0).
    dsink = () if learnable_sink is None else (torch.zeros_like(learnable_sink, dtype=torch.float32),)
    varlen = None
    cu_q = cu_k = None
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        sequences = cu_q.shape[0] - 1
        if 0 in (q.shape[0], k.shape[0], sequences, max_q, max_k):
            # No pair of a query and a key: every gradient is 0 (and a TMA map over zero rows is invalid).
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), *dsink
        varlen = (sequences, grid_seqlen(max_q), grid_seqlen(max_k))
    # Packed rows are one batch (_dims4): the descriptors' batch coordinate is 0, the preprocess's rows the
    # total; q, k, v, dout, out and the gradients stay (total, H, D), the LSE (H, total_q).
    (batch, seqlen_q, heads, head_dim), _ = _dims4(q)
    plain = is_plain_call(window_size, softcap, alibi_slopes, dropout_p, packed, mods)
    _, cfg = select_variant(head_dim, plain)
    sink = learnable_sink is not None
    persistent = persistent_grid(head_dim, cfg, is_causal, plain, deterministic, sink)
    bm, bn = cfg.block_m, cfg.block_n
    q, k, v, dout = _tma_ready(q), _tma_ready(k), _tma_ready(v), _tma_ready(dout)
    out = out if out.stride(-1) == 1 else out.contiguous()
    lse = lse.contiguous()
    device = q.device
    slopes = None if alibi_slopes is None else alibi_slopes.contiguous()
    km = NO_MODS if mods is None else kernel_mods(mods)
    sparse = sparse_key(km, "q", reads_bits(mods))
    lists = (lse,) * 4
    if sparse is not None:
        lists = km.list_args("q", False) + km.list_args("q", True)
    preprocess, fused, finish = _bwd_launches(
        device, (batch, seqlen_q, heads, head_dim), _dims4(k)[0][1:3], softmax_scale, is_causal,
        deterministic, cfg, _dims4(out)[1][:3], _dims4(dout)[1][:3], tuple(window_size), softcap,
        alibi_stride_b(slopes), varlen,
        varlen is not None and _VARLEN_TMA_STORE.get("").strip() != "0", sparse, dropout_p, bool(dsink),
        persistent, dq_by_producer(deterministic, dropout_p > 0, mods is not None),
        dk_after_dq(head_dim, cfg, is_causal, plain, sink, deterministic),
    )  # fmt: skip
    seqlen_pad = _stats_rows(seqlen_q, bm, varlen)
    # The base-2 LSE and Δ rows, one allocation (each half starts 256-byte aligned: seqlen_pad % 64 == 0);
    # packed batches read up to a block past a sequence's last row (uninitialised, another sequence's or
    # another head's: masked).
    extra_rows = 0 if varlen is None else bm
    # (unbind rather than unpacking, which goes through Tensor.__iter__'s Python checks: ~5 µs a call.)
    lse2, delta = torch.empty(
        (2, batch * heads * seqlen_pad + extra_rows), dtype=torch.float32, device=device
    ).unbind(0)
    dk = torch.empty(k.shape, dtype=k.dtype, device=device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=device)
    dq_rows, dq_cols = cfg.dq_box(head_dim)
    out_rows, out_cols = cfg.out_box(head_dim)
    # The fp32 dQ sum, zeroed by the preprocess (the deterministic dQ kernel writes dQ itself).
    dq_accum = None if deterministic else torch.empty(q.shape, dtype=torch.float32, device=device)
    sink_ptrs = (learnable_sink.contiguous(), dsink[0]) if dsink else (lse2, lse2)
    preprocess(
        out, dout, lse, lse2, delta, lse2 if dq_accum is None else dq_accum, lse2 if cu_q is None else cu_q,
        *sink_ptrs,
    )  # fmt: skip
    # The dQ descriptor is unused when the second kernel makes dQ; any fp32 tensor of q's shape serves.
    dq_target = dq_accum if dq_accum is not None else lse2.new_empty((1, dq_rows, 1, dq_cols))
    fused(
        _descriptor(q, bm), _descriptor(k, bn), _descriptor(v, bn), _descriptor(dout, bm),
        _row_stats_descriptor(lse2, bm), _row_stats_descriptor(delta, bm),
        _descriptor(dq_target, dq_rows, dq_cols), _descriptor(dk, out_rows, out_cols),
        _descriptor(dv, out_rows, out_cols), slopes,
        # Dense launches pass the row statistics for the boundaries they do not read.
        lse2 if cu_q is None else cu_q, lse2 if cu_k is None else cu_k, dk, dv, *lists,
        sparse_aux(km, sparse), lse2 if rng_state is None else rng_state, *sink_ptrs,
    )  # fmt: skip
    if deterministic:
        finish(
            _descriptor(q, DQ_BLOCK_M), _descriptor(k, DQ_BLOCK_N), _descriptor(v, DQ_BLOCK_N),
            _descriptor(dout, DQ_BLOCK_M), _descriptor(dq, DQ_BLOCK_M), lse2, delta,
        )  # fmt: skip
    else:
        finish(dq_accum, dq, dq_accum if cu_q is None else cu_q)
    return dq, dk, dv, *dsink
