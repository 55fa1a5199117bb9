"""Hopper (sm_90) forward in Gluon: a TMA producer warp and two consumer warpgroups per program.

Each program owns BLOCK_M = 128 query rows of one (batch, head). A 1-warp producer partition loads the two
64-row halves of Q once and streams K and V tiles of BLOCK_N keys into a STAGES-deep shared-memory ring,
each slot guarded by a "ready" mbarrier (the TMA completes it) and an "empty" one (both consumers arrive on
it once done). Each 4-warp consumer partition owns 64 query rows and runs the online softmax with async
wgmma, FlashAttention-3's in-warpgroup overlap: issue S(j) = Q·K(j)ᵀ, then O += P(j−1)·V(j−1), wait for
S(j) only, do softmax(j) while P·V runs. P stays in registers as wgmma's A operand. The pipeline, the
barrier protocol and the register budget are drawn and measured in docs/design/hopper.md.

Tensors are (B, N, H, D) and read through 4-D TMA descriptors with boxes [1, rows, 1, D]: rows past a
sequence's end read as zeros (never another batch's or head's data) and rows past it are never written.
"""

from __future__ import annotations

import functools
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashtile.kernels import configs
from flashtile.kernels._launch_cache import KernelLaunch
from flashtile.kernels._layout import cdiv
from flashtile.kernels.fwd import positive_scale
from flashtile.kernels.hopper.descriptors import CheckedDescriptor, descriptor
from flashtile.mods import Mods

LOG2_E = math.log2(math.e)
LN_2 = gl.constexpr(math.log(2.0))
# Query rows per consumer warpgroup (one m64nNk16 wgmma row block); a program has two.
WG_ROWS = gl.constexpr(64)
# The default partition: the producer. Each consumer partition has 4 warps (a warpgroup) as well.
NUM_WARPS = 4
# Registers per consumer thread after setmaxnreg; the producer warpgroup gives its registers up (down to 24).
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _tile_view(buf, desc):
    """A 2-D [rows, D] shared tile seen as the 4-D [1, rows, 1, D] box ``desc`` moves (same bytes)."""
    layout: gl.constexpr = desc.layout
    return buf._reinterpret(buf.dtype, [1, buf.shape[0], 1, buf.shape[1]], layout)


@gluon.jit
def _attn_fwd_producer(loads, smem, bars, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    q_desc, k_desc, v_desc, b, h, h_kv, m0, n_tiles = loads
    q_smem, k_smem, v_smem = smem
    q_bar, k_ready, k_empty, v_ready, v_empty = bars
    if n_tiles > 0:
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        for half in gl.static_range(2):
            tma.async_copy_global_to_shared(
                q_desc, [b, m0 + half * WG_ROWS, h, 0], q_bar, _tile_view(q_smem.index(half), q_desc)
            )
    for j in range(n_tiles):
        slot = j % STAGES
        # An mbarrier starts with its phase-1 wait complete: the first round finds every slot empty.
        phase = (j // STAGES) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, j * BLOCK_N, h_kv, 0], k_ready.index(slot), _tile_view(k_smem.index(slot), k_desc)
        )
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [b, j * BLOCK_N, h_kv, 0], v_ready.index(slot), _tile_view(v_smem.index(slot), v_desc)
        )


@gluon.jit
def _softmax_step(
    s, m_i, l_i, n0, rows, seqlen_k, diag, qk_scale,
    MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
):  # fmt: skip
    """Fold the raw scores ``s`` of keys [n0, n0 + BLOCK_N) into (m, ℓ); return P, m, ℓ and the factor α
    that rescales the running output. Base 2: m is the running max of ``s · qk_scale``."""
    if MASKED:
        cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        keep = gl.expand_dims(cols, 0) < seqlen_k
        if IS_CAUSAL:
            keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + diag)
        s = gl.where(keep, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    # A row that has seen no visible key keeps m = −inf; subtracting 0 avoids −inf − (−inf).
    m_ref = gl.where(m_new == -float("inf"), 0.0, m_new) if MASKED else m_new
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref, 1))
    alpha = gl.exp2(m_i - m_ref)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _attn_fwd_steps(
    acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, lo, hi, rows, seqlen_k, diag,
    qk_scale, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """Tiles [lo, hi): issue S(j), then O += P(j−1)·V(j−1), softmax(j) while the P·V wgmma runs."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    s_zero = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    for j in range(lo, hi):
        slot = j % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        prev = (j - 1) % STAGES
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        # wgmma groups retire in order: one left outstanding is the P·V just issued.
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(slot), count=1)
        p, m_i, l_i, alpha = _softmax_step(
            s, m_i, l_i, j * BLOCK_N, rows, seqlen_k, diag, qk_scale, MASKED, IS_CAUSAL, BLOCK_N
        )
        acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    return acc, m_i, l_i, p


@gluon.jit
def _attn_fwd_consumer(
    program, smem, bars, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    o_desc, lse_ptr, b, h, bh, m0, seqlen_q, seqlen_k, n_tiles, qk_scale = program
    q_smem, k_smem, v_smem = smem
    q_bar, k_ready, k_empty, v_ready, v_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    row0 = m0 + WG * WG_ROWS
    rows = row0 + gl.arange(0, WG_ROWS, layout=s_rows)
    # Bottom-right alignment: query i sees key j iff j ≤ i + diag.
    diag = seqlen_k - seqlen_q
    if IS_CAUSAL:
        # Tiles every row of this warpgroup sees in full skip the mask.
        n_full = gl.minimum(gl.maximum(row0 + diag + 1, 0), seqlen_k) // BLOCK_N
    else:
        n_full = seqlen_k // BLOCK_N
    n_full = gl.minimum(n_full, n_tiles)

    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([WG_ROWS], -float("inf"), gl.float32, s_rows)
    l_i = gl.zeros([WG_ROWS], gl.float32, s_rows)
    q = q_smem.index(WG)
    if n_tiles > 0:
        mbarrier.wait(q_bar, 0)
        # Tile 0 alone: it has no P·V to overlap with, and may need the mask.
        mbarrier.wait(k_ready.index(0), 0)
        s_tok = warpgroup_mma(
            q, k_smem.index(0).permute((1, 0)), gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout),
            use_acc=False, is_async=True,
        )  # fmt: skip
        s = warpgroup_mma_wait(0, deps=[s_tok])
        mbarrier.arrive(k_empty.index(0), count=1)
        p, m_i, l_i, _ = _softmax_step(
            s, m_i, l_i, 0, rows, seqlen_k, diag, qk_scale, True, IS_CAUSAL, BLOCK_N
        )
        acc, m_i, l_i, p = _attn_fwd_steps(
            acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, 1, n_full, rows,
            seqlen_k, diag, qk_scale, False, IS_CAUSAL, BLOCK_N, STAGES,
        )  # fmt: skip
        acc, m_i, l_i, p = _attn_fwd_steps(
            acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, gl.maximum(n_full, 1),
            n_tiles, rows, seqlen_k, diag, qk_scale, True, IS_CAUSAL, BLOCK_N, STAGES,
        )  # fmt: skip
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
        mbarrier.arrive(v_empty.index(last), count=1)

    # Rows that saw no key have ℓ = 0: their output is 0 and their log-sum-exp −inf.
    l_o = gl.convert_layout(l_i, o_rows)
    out = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
    lse = (m_i + gl.log2(l_i)) * LN_2
    gl.store(lse_ptr + bh.to(gl.int64) * seqlen_q + rows, lse, mask=rows < seqlen_q)
    # Q's half is free once this warpgroup's last S wgmma has retired: it stages the output tile.
    q.store(out.to(o_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, row0, h, 0], _tile_view(q, o_desc))
    tma.store_wait(0)


# Sizes stay runtime values: specialising on 1 or on multiples of 16 would only multiply the compiles.
@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k", "num_m_blocks", "H", "GROUP"])
def attn_fwd_kernel(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, seqlen_q, seqlen_k, num_m_blocks, H, GROUP, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    BLOCK_M: gl.constexpr = 2 * WG_ROWS
    pid = gl.program_id(0)
    m_block = pid % num_m_blocks
    bh = pid // num_m_blocks
    if IS_CAUSAL:
        # The longest rows (most key tiles) start first, so the short ones fill the tail of the grid.
        m_block = num_m_blocks - 1 - m_block
    b = bh // H
    h = bh % H
    h_kv = h // GROUP
    m0 = m_block * BLOCK_M
    if IS_CAUSAL:
        # The last row of the block sees keys up to m0 + BLOCK_M − 1 + N_k − N_q.
        n_keys = gl.minimum(gl.maximum(m0 + BLOCK_M + seqlen_k - seqlen_q, 0), seqlen_k)
    else:
        n_keys = seqlen_k
    n_tiles = gl.cdiv(n_keys, BLOCK_N)

    dtype: gl.constexpr = q_desc.dtype
    tile_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_ROWS, HEAD_DIM], dtype)
    tile_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [2, WG_ROWS, HEAD_DIM], tile_q)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_kv)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_kv)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # Each of the two consumer partitions arrives once per tile.
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()

    smem = (q_smem, k_smem, v_smem)
    bars = (q_bar, k_ready, k_empty, v_ready, v_empty)
    loads = (q_desc, k_desc, v_desc, b, h, h_kv, m0, n_tiles)
    program = (o_desc, lse_ptr, b, h, bh, m0, seqlen_q, seqlen_k, n_tiles, qk_scale)
    # The default partition (the kernel's num_warps = 4 warps) is the producer: one warp would be padded to a
    # warpgroup anyway, and setmaxnreg then hands both consumer warpgroups 240 registers a thread.
    gl.warp_specialize(
        [
            (_attn_fwd_producer, (loads, smem, bars, BLOCK_N, STAGES)),
            (_attn_fwd_consumer, (program, smem, bars, 0, HEAD_DIM, BLOCK_N, IS_CAUSAL, STAGES)),
            (_attn_fwd_consumer, (program, smem, bars, 1, HEAD_DIM, BLOCK_N, IS_CAUSAL, STAGES)),
        ],
        [4, 4],
        [CONSUMER_REGS, CONSUMER_REGS],
    )


def _descriptor(t: torch.Tensor, rows: int) -> CheckedDescriptor:
    """A TMA descriptor over (B, N, H, D) ``t`` moving [1, rows, 1, D] boxes; reads past N are zeros."""
    return descriptor(t, t.shape, t.stride(), (1, rows, 1, t.shape[-1]))


# The tensors of a launch, in the kernel's parameter order.
FWD_POINTERS = ("q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr")


# Everything but the tensors is a function of these arguments: one KernelLaunch per call signature.
@functools.lru_cache(maxsize=512)
def _fwd_launch(
    device: torch.device,
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads: int,
    heads_kv: int,
    head_dim: int,
    qk_scale: float,
    is_causal: bool,
    block_n: int,
    stages: int,
) -> KernelLaunch:
    num_m_blocks = cdiv(seqlen_q, 2 * WG_ROWS.value)
    values = dict(
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_m_blocks=num_m_blocks, H=heads, GROUP=heads // heads_kv,
        qk_scale=qk_scale, HEAD_DIM=head_dim, BLOCK_N=block_n, IS_CAUSAL=is_causal, STAGES=stages,
    )  # fmt: skip
    grid = (num_m_blocks * batch * heads,)
    return KernelLaunch(attn_fwd_kernel, grid, device, FWD_POINTERS, values, {"num_warps": NUM_WARPS})


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
    config: configs.HopperFwdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The portable launcher's contract (docs/design/options.md) for calls the fast path supports
    (:func:`flashtile.kernels.hopper.support.fwd_unsupported_reason` is None: dense, no window other than
    causal's, no softcap, ALiBi, dropout, learnable_sink or mods, V's head dim Q's): q (B, N_q, H, D),
    k/v (B, N_k, H_KV, D) with N_q, N_k ≥ 1; returns ``out`` (B, N_q, H, D) in q's dtype and ``lse``
    (B, H, N_q) float32, natural log."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    q, softmax_scale = positive_scale(q, softmax_scale)
    # Causal arrives normalised as the window (−1, 0).
    is_causal = causal or window_size[1] == 0
    cfg = config or configs.hopper_fwd_config(head_dim)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    launch = _fwd_launch(
        q.device, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, softmax_scale * LOG2_E, is_causal,
        cfg.BLOCK_N, cfg.STAGES,
    )  # fmt: skip
    launch(
        _descriptor(q, WG_ROWS.value), _descriptor(k, cfg.BLOCK_N), _descriptor(v, cfg.BLOCK_N),
        _descriptor(out, WG_ROWS.value), lse,
    )  # fmt: skip
    return out, lse
