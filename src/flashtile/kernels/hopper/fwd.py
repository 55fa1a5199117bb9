"""Hopper (sm_90) forward in Gluon: a TMA producer warp and two consumer warpgroups per program.

A work tile is BLOCK_M = 128 query rows of one (batch, head). The grid is persistent: one program an SM,
each taking work tiles pid, pid + P, … (:func:`_work_tile`), so the next tile's Q and first K/V tiles load
while this one's last P·V and output store run. A 1-warp producer partition loads a tile's two 64-row
halves of Q (once the consumers have released the buffer: the q_empty mbarrier; a persistent program has
two at D = 64 and on short rows at D = 128, so the next tile's Q loads while this one runs) and streams K
and V tiles of BLOCK_N keys into a STAGES-deep shared-memory ring, each slot guarded by a "ready" mbarrier
(the TMA completes it) and an "empty" one (both consumers arrive on it once done); the ring's slots and phases
count on across work tiles. Each 4-warp consumer partition owns 64 query rows and runs the online softmax
with async wgmma, FlashAttention-3's in-warpgroup overlap: issue S(j) = Q·K(j)ᵀ, then O += P(j−1)·V(j−1),
wait for S(j) only, do softmax(j) while P·V runs; with softcap, ALiBi or dropout the two consumers issue
their wgmmas in turn (ping-pong: :func:`pingpong`). P stays in registers as wgmma's A operand. The pipeline,
the barrier protocol and the register budget are drawn and measured in docs/design/hopper.md.

Options (docs/design/options.md): a sliding window ``(left, right)`` (causal is (−1, 0)), softcap, ALiBi and
dropout (its Philox mask drawn in the accumulator's layout: hopper/dropout.py), each a constexpr switch with
its runtime values beside it, so the dense and causal kernels compile to what they were. A program loads only
the key tiles its rows' window reaches (:func:`_key_tiles`); each consumer masks only the tiles some of its
rows see in part (:func:`_masked_steps`). Scores with softcap or ALiBi are those of the portable forward
(kernels/_scores.py), in base 2, so the LSE is the same function.

Tensors are (B, N, H, D) and read through 4-D TMA descriptors with boxes [1, rows, 1, D]: rows past a
sequence's end read as zeros (never another batch's or head's data) and rows past it are never written.
Packed (varlen) batches (IS_VARLEN) go through rank-3 descriptors over (total, H, D) instead: rows past a
sequence's end are the next sequence's, so the last key tile is always a masked step (its keys past N_k
get P = 0) and O is written with row-masked pointer stores (docs/design/hopper.md, "Variable length").
"""

from __future__ import annotations

import functools
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashtile._environ import Knob
from flashtile.errors import FlashtileValueError
from flashtile.kernels import configs
from flashtile.kernels._block_sparse import NO_MODS, KernelMods, call_mod, kernel_mods
from flashtile.kernels._launch_cache import KernelLaunch
from flashtile.kernels._layout import cdiv, grid_seqlen
from flashtile.kernels._mask_bits import reads_bits
from flashtile.kernels.fwd import alibi_stride_b, kernel_options, positive_scale, transposed_fp8
from flashtile.kernels.hopper import dropout
from flashtile.kernels.hopper.descriptors import CheckedDescriptor, descriptor
from flashtile.mods import Mods

LOG2_E = math.log2(math.e)
LN_2 = gl.constexpr(math.log(2.0))
LOG2_E_C = gl.constexpr(LOG2_E)
# Query rows per consumer warpgroup (one m64nNk16 wgmma row block); a program has two.
WG_ROWS = gl.constexpr(64)
# Threads of a consumer warpgroup: each arrives on the K/V slots' "empty" barriers (_release).
WG_THREADS = gl.constexpr(128)
# The default partition: the producer. Each consumer partition has 4 warps (a warpgroup) as well.
NUM_WARPS = 4
# Registers per consumer thread after setmaxnreg, with two or three consumer warpgroups; the producer
# warpgroup gives its registers up (down to 24): 2 · 128 · 240 or 3 · 128 · 160 of the SM's 65,536.
CONSUMER_REGS = gl.constexpr(240)
CONSUMER_REGS_3 = gl.constexpr(160)
# Dense batches without a block mask (plain attention, softcap, ALiBi and dropout since the thirty-fourth
# session), sliding windows and causal (runs_persistent) run on a persistent grid, one program an SM
# looping over work tiles, at D = 64 without an option and wherever a tile's keys are at most
# PERSISTENT_MAX_KEYS, unless FLASHTILE_HOPPER_FWD_PERSISTENT is 0 (read at each launch). Kernel time
# against one program a work tile (docs/design/hopper.md, "Persistent forward"), H200: D = 64 10-15 %
# faster at N ≤ 1k, 2-5 % from 2k;
# D = 128 11-17 % at N ≤ 1k, 4-6 % at 2k, 1-2 % slower from 4k; window (256, 0) 4-6 % at D = 64, ±3 % at
# D = 128. H100, causal with row blocks dealt out in pairs (_paired_tile): D = 64 18 / 6 / 5 / 3 % at
# N = 512 / 1k / 2k / 4k, ±1 % from 8k; D = 128 6-11 % up to 4k, 5 % slower at 16k. H200, D = 256 (output
# staged in the one Q buffer, output_in_q): 4 % / 0.5 % / 0 at N = 512 / 1k / 2k, causal 8-11 % to 4k.
PERSISTENT_ENV = "FLASHTILE_HOPPER_FWD_PERSISTENT"
# Three consumer warpgroups (192-row work tiles) at D = 64 from these query lengths (consumer_count); H200
# against two: 3-8 % faster from N = 2k without a mask (kernel time); causal, since each warpgroup takes
# only its own key tiles (s35a, bench), 2 % faster at 4k, 4 % at 8k, 6-9 % at 16k, 13-20 % slower below 4k.
# FLASHTILE_HOPPER_FWD_CONSUMERS = 2 or 3 overrides the lengths (read at each launch).
CONSUMERS_ENV = "FLASHTILE_HOPPER_FWD_CONSUMERS"
# The two consumers' wgmma issues take turns (ping-pong, :func:`pingpong`) with softcap, ALiBi or dropout;
# FLASHTILE_HOPPER_FWD_PINGPONG = 0 or 1 overrides that (read at each launch).
PINGPONG_ENV = "FLASHTILE_HOPPER_FWD_PINGPONG"
_PERSISTENT, _CONSUMERS, _PINGPONG = Knob(PERSISTENT_ENV), Knob(CONSUMERS_ENV), Knob(PINGPONG_ENV)
# One exponential in EXP2_SHARE of the unmasked tiles on the FMA pipes instead of the MUFU
# (:func:`_exp2_shared`): by default under softcap at D = 64, whose tanh and exp2 keep the MUFU busier
# than the tensor cores (s31b: 5-9 % faster; D = 128 even, D = 256 and plain attention slower).
# FLASHTILE_HOPPER_FWD_EXP2_POLY = 0 (every one on the MUFU), 2, 4 or 8 forces a share on every
# configuration (:func:`exp2_share`).
EXP2_POLY_ENV = "FLASHTILE_HOPPER_FWD_EXP2_POLY"
SOFTCAP_EXP2_SHARE = 4
SOFTCAP_EXP2_MAX_HEAD_DIM = 64
_EXP2_POLY = Knob(EXP2_POLY_ENV)
THREE_CONSUMERS_MIN_ROWS = 2048
# With the 3-deep ring of plain D = 64 calls, two consumers are 1-2 % faster than three at 4k causal and
# three 3 % faster at 8k (H200, s43d / s43e; docs/design/hopper.md, "A 3-deep ring at D = 64").
THREE_CONSUMERS_MIN_ROWS_CAUSAL = 8192
# Shared memory the Q, output and K/V tiles of a persistent program may take (of the 227 KB an sm_90
# program may have; the rest is for the mbarriers and the compiler's scratch): at D = 256 only with one
# Q buffer staging the output (output_in_q).
PERSISTENT_SMEM = 200 * 1024
# PERSISTENT's value for a persistent program whose one Q buffer stages the output (output_in_q).
OUTPUT_IN_Q = gl.constexpr(2)
PERSISTENT_MAX_KEYS = 2048
# Two Q buffers at D = 128 up to this many keys (q_buffers).
Q_BUFS_MAX_KEYS_D128 = 1024
# Runtime values: a window bound, a batch stride of 1 or a dropout threshold divisible by 16 would otherwise
# compile a kernel of its own.
WINDOW_ARGS = ["window_left", "window_right", "stride_alibi_b", "dropout_threshold"]
# A block mask's list strides and row length: runtime values too (0 where broadcast).
LIST_ARGS = ["list_stride_b", "list_stride_h", "list_row_len"]
# The launcher's magic numbers for dividing by M, by H and by the programs (divider_arguments), any int32.
DIVIDER_ARGS = ["m_magic", "m_shift", "h_magic", "h_shift", "p_magic", "p_shift"]


@gluon.jit
def _sequence_rows(cu_seqlens_ptr, b, total):
    """Sequence b's packed rows [start, end), clamped into [0, total] (a bad cu_seqlens reads no row past
    the packed tensor)."""
    start = gl.minimum(gl.maximum(gl.load(cu_seqlens_ptr + b), 0), total)
    end = gl.minimum(gl.maximum(gl.load(cu_seqlens_ptr + b + 1), start), total)
    return start, end


@gluon.jit
def _tile_view(buf, desc):
    """A 2-D [rows, D] shared tile seen as the box ``desc`` moves (same bytes): [1, rows, 1, D] over a
    dense (B, N, H, D) tensor, [rows, 1, D] over a packed (total, H, D) one."""
    layout: gl.constexpr = desc.layout
    if len(desc.block_shape) == 4:
        view = buf._reinterpret(buf.dtype, [1, buf.shape[0], 1, buf.shape[1]], layout)
    else:
        view = buf._reinterpret(buf.dtype, [buf.shape[0], 1, buf.shape[1]], layout)
    return view


@gluon.jit
def _load_rows(desc, b, start, row, h, bar, buf, IS_VARLEN: gl.constexpr):
    """TMA-load rows [row, row + rows) of head h of sequence b into ``buf``: dense, rows of batch b
    (past N zeros); varlen, packed rows start + row on (past the sequence, the next one's: masked)."""
    if IS_VARLEN:
        tma.async_copy_global_to_shared(desc, [start + row, h, 0], bar, _tile_view(buf, desc))
    else:
        tma.async_copy_global_to_shared(desc, [b, row, h, 0], bar, _tile_view(buf, desc))


# The index helpers (_key_tiles, _masked_steps, _row_terms, _visible) use only +, −, //, comparisons and
# gl.maximum / gl.minimum / gl.cdiv / gl.expand_dims, so tests/test_gluon_tile_ranges.py runs their very
# bodies in Python, on checked int32 scalars and numpy arrays, against flash_attn's visibility rule.
# Triton's integer // truncates towards zero: every dividend is clamped to ≥ 0 first.
@gluon.jit
def _key_tiles(
    m0, seqlen_k, lo_diag, hi_diag, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr,
):  # fmt: skip
    """The key tiles the query rows [m0, m0 + BLOCK_M) reach, ``(t_lo, n_tiles)``: tiles t_lo + i for i in
    [0, n_tiles), inside [0, cdiv(N_k, BLOCK_N)). Query i sees key j iff i + lo_diag ≤ j ≤ i + hi_diag
    (lo_diag only under HAS_WINDOW_LEFT, hi_diag only under IS_LOCAL)."""
    # The first row sees keys from m0 + lo_diag on, the others from later keys.
    t_lo = gl.maximum(m0 + lo_diag, 0) // BLOCK_N if HAS_WINDOW_LEFT else 0
    # The last row of the block sees keys up to m0 + BLOCK_M − 1 + hi_diag (rows past N_q would see keys
    # past N_k only, so they widen nothing).
    n_keys = gl.minimum(gl.maximum(m0 + BLOCK_M + hi_diag, 0), seqlen_k) if IS_LOCAL else seqlen_k
    n_tiles = gl.cdiv(n_keys, BLOCK_N)
    if HAS_WINDOW_LEFT:
        n_tiles = gl.maximum(n_tiles - t_lo, 0)
    return t_lo, n_tiles


@gluon.jit
def _masked_steps(
    row0, t_lo, n_tiles, seqlen_k, lo_diag, hi_diag, BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr,
):  # fmt: skip
    """How the consumer of rows [row0, row0 + WG_ROWS) splits the program's tiles (indices i of
    :func:`_key_tiles`, n_tiles ≥ 1): ``(a, b)`` with 1 ≤ a ≤ b ≤ n_tiles; tile 0 and tiles [1, a) and
    [b, n_tiles) take the masked step, tiles [a, b) — inside N_k and seen whole by each of the WG_ROWS
    rows — the unmasked one. Without a left bound a = 1."""
    if IS_LOCAL:
        # Every row sees the keys up to row0 + hi_diag.
        n_full = gl.minimum(gl.maximum(row0 + hi_diag + 1, 0), seqlen_k) // BLOCK_N
    else:
        n_full = seqlen_k // BLOCK_N
    if HAS_WINDOW_LEFT:
        # Every row sees the keys from row0 + WG_ROWS − 1 + lo_diag on.
        first_full = gl.cdiv(gl.maximum(row0 + (WG_ROWS - 1) + lo_diag, 0), BLOCK_N)
        a = gl.maximum(gl.minimum(first_full - t_lo, n_tiles), 1)
        b = gl.maximum(gl.minimum(n_full - t_lo, n_tiles), a)
    else:
        a = 1
        b = gl.maximum(gl.minimum(n_full, n_tiles), 1)
    return a, b


@gluon.jit
def _first_tile_partial(
    row0, t_lo, seqlen_k, lo_diag, hi_diag, BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr,
):  # fmt: skip
    """Whether some row of [row0, row0 + WG_ROWS) misses a key of the consumer's first tile (t_lo), or the
    tile reaches past N_k: only then does the first tile, always a masked step, apply the mask (causal at
    N = 512, 3 of a warpgroup's 7 masked steps in a head need not)."""
    n_end = (t_lo + 1) * BLOCK_N
    partial = n_end > seqlen_k
    if IS_LOCAL:
        # The first row sees the keys up to row0 + hi_diag.
        partial = partial | (row0 + hi_diag < n_end - 1)
    if HAS_WINDOW_LEFT:
        # The last row sees the keys from row0 + WG_ROWS − 1 + lo_diag on.
        partial = partial | (row0 + (WG_ROWS - 1) + lo_diag > t_lo * BLOCK_N)
    return partial


@gluon.jit
def _block_list(count_ptr, full_count_ptr, b, h, row, stride_b, stride_h, row_len):
    """A block mask's list row ``row`` of (batch b, head h), strides 0 where broadcast: ``(first entry's
    offset, partial blocks, partial and full blocks)``, the partial key blocks listed first."""
    offset = b * stride_b + h * stride_h + row
    n_partial = gl.load(count_ptr + offset)
    return offset * row_len, n_partial, n_partial + gl.load(full_count_ptr + offset)


@gluon.jit
def _tile_start(j, t_lo, tiles, TILE: gl.constexpr, SPARSE_TILES: gl.constexpr):
    """The first row of step j's tile: tile t_lo + j, or with a block mask (SPARSE_TILES kernel tiles per
    mask block) the j-th tile of the listed blocks, its partial blocks first, then its full ones."""
    if SPARSE_TILES:
        index_ptr, full_index_ptr, row_base, n_partial = tiles
        e = j // SPARSE_TILES
        if e < n_partial:
            block = gl.load(index_ptr + row_base + e)
        else:
            block = gl.load(full_index_ptr + row_base + (e - n_partial))
        start = (block * SPARSE_TILES + j % SPARSE_TILES) * TILE
    else:
        start = (t_lo + j) * TILE
    return start


@gluon.jit
def _divmod(n, divider):
    """``(n // d, n % d)`` for 0 ≤ n < 2³¹ by a multiply-high, an add and a shift: ``divider`` is
    ``(d, magic, shift)`` (:func:`divider_arguments`, uint32 magic and shift). A division compiles to some
    28 instructions (sm_90), and a persistent program's work tiles divided twice each on their way to the
    first wgmma."""
    d, magic, shift = divider
    u = n.to(gl.uint32)
    q = ((gl.umulhi(u, magic.to(gl.uint32, bitcast=True)) + u) >> shift.to(gl.uint32)).to(gl.int32)
    return q, n - q * d


@gluon.jit
def _paired_tile(r, unit, pair, k, num_m_blocks, batch_heads):
    """Round r of program p on a persistent causal grid (slot w = r·P + p): its unit (r // 2)·P + p, and
    that unit's pair = unit // M and k = unit % M (:func:`_divmod`). A unit is row blocks k and M − 1 − k of
    one head, about M + 1 key tiles whatever k; with M odd, the middle blocks of two heads make one more. So
    the units cost about the same and dealing them out statically balances the programs. They run two heads
    at a time (M units a pair of heads), so programs running side by side read the same keys (L2); with an
    odd number of heads the last one's units come last, its middle block alone. Program p's rounds 2i and
    2i + 1 take unit i·P + p's longer block, then its other one. Returns (bh, m_block, live): live False
    past the last unit. Integer arithmetic only, r ≥ 0 (bit operations for its halvings): the tests run it
    in Python (``.fn``)."""
    half = r & 1
    paired_units = (batch_heads >> 1) * num_m_blocks
    if unit < paired_units:
        # 1 for the unit of the two middle blocks (its k is M − 1, M odd), else 0.
        middle = (k + 1 == num_m_blocks) * (num_m_blocks & 1)
        bh = 2 * pair + (k & 1) + middle * half
        step = k >> 1
        # True, as a value of the other branch's type.
        live = unit < paired_units
    else:
        step = unit - paired_units
        bh = batch_heads - 1
        alone = 2 * step + 1 == num_m_blocks
        live = ((batch_heads & 1) == 1) & ((2 * step + 1 < num_m_blocks) | (alone & (half == 0)))
    m_block = step + (1 - half) * (num_m_blocks - 1 - 2 * step)
    return bh, m_block, live


@gluon.jit
def _work_slots(sched, PAIRED: gl.constexpr):
    """The slots a persistent grid's programs step through (pid, pid + P, … below it): the work tiles, or
    PAIRED two rounds of P slots per P units (:func:`_paired_tile`), the last ones partly dead."""
    num_m_blocks = sched[0]
    num_programs, total_work = sched[10:]
    slots = total_work
    if PAIRED:
        batch_heads = total_work // num_m_blocks
        units = batch_heads // 2 * num_m_blocks + batch_heads % 2 * ((num_m_blocks + 1) // 2)
        slots = 2 * num_programs * ((units + num_programs - 1) // num_programs)
    return slots


@gluon.jit
def _work_tile(
    w, sched, BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    IS_VARLEN: gl.constexpr, SPARSE_TILES: gl.constexpr, SPARSE_BLOCK_M: gl.constexpr,
    CONSUMERS: gl.constexpr, PAIRED: gl.constexpr,
):  # fmt: skip
    """Work tile w: the query rows [m0, m0 + BLOCK_M) (BLOCK_M = CONSUMERS · WG_ROWS) of one (batch b,
    head h), bh = b·H + h, with row blocks of one head adjacent (they read the same keys, which stay in
    L2), the longest first when causal.
    Returns ``(b, h, bh, m0, q_start, k_start, seqlen_q, seqlen_k, live, lo_diag, hi_diag, t_lo, n_tiles,
    tiles)``: seqlen_q/k the sequence's lengths (its packed rows from q_start / k_start under IS_VARLEN),
    ``live`` False for a block past its sequence's end (nothing to do; a block of a sequence without keys
    is live and writes out 0, LSE −inf), the key tiles of :func:`_key_tiles` or of the block mask's lists,
    ``tiles`` as :func:`_tile_start` takes them. PAIRED: w is a persistent program's slot
    (:func:`_paired_tile`), not a work tile's index."""
    num_m_blocks = sched[0]
    total_q, total_k, window_left, window_right = sched[2:6]
    cu_seqlens_q_ptr, cu_seqlens_k_ptr, lists = sched[6:9]
    BLOCK_M: gl.constexpr = CONSUMERS * WG_ROWS
    if PAIRED:
        # Slot w = r·P + p: round r of program p, whose unit is (r // 2)·P + p.
        r, p = _divmod(w, sched[14])
        unit = (r >> 1) * sched[10] + p
        pair, k = _divmod(unit, sched[12])
        bh, m_block, live = _paired_tile(r, unit, pair, k, num_m_blocks, sched[11] // num_m_blocks)
    elif HAS_WINDOW_LEFT:
        # Windows bounded on the left keep the divisions: without them ptxas parked 8-24 B of the kernel's
        # registers on the stack at D = 128 and 256 (sm_90).
        m_block = w % num_m_blocks
        bh = w // num_m_blocks
        live = True
    else:
        bh, m_block = _divmod(w, sched[12])
        if IS_LOCAL:
            # The longest rows (most key tiles) start first, so the short ones fill the tail of the grid.
            m_block = num_m_blocks - 1 - m_block
        live = True
    if HAS_WINDOW_LEFT:
        b = bh // sched[1]
        h = bh % sched[1]
    else:
        b, h = _divmod(bh, sched[13])
    m0 = m_block * BLOCK_M
    if IS_VARLEN:
        q_start, q_end = _sequence_rows(cu_seqlens_q_ptr, b, total_q)
        k_start, k_end = _sequence_rows(cu_seqlens_k_ptr, b, total_k)
        seqlen_q = q_end - q_start
        seqlen_k = k_end - k_start
        # The grid covers the longest sequence; blocks past this one's end have nothing to do.
        live = m0 < seqlen_q
    else:
        q_start = 0
        k_start = 0
        seqlen_q = total_q
        seqlen_k = total_k
    diag = seqlen_k - seqlen_q
    lo_diag = diag - window_left
    hi_diag = diag + window_right
    kv_count_ptr, kv_index_ptr, full_kv_count_ptr, full_kv_index_ptr, stride_b, stride_h, row_len = lists
    if SPARSE_TILES:
        row_base, n_partial, n_listed = _block_list(
            kv_count_ptr, full_kv_count_ptr, b, h, m0 // SPARSE_BLOCK_M, stride_b, stride_h, row_len
        )
        t_lo = 0
        n_tiles = n_listed * SPARSE_TILES
        tiles = (kv_index_ptr, full_kv_index_ptr, row_base, n_partial)
    else:
        t_lo, n_tiles = _key_tiles(
            m0, seqlen_k, lo_diag, hi_diag, BLOCK_M, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT
        )
        tiles = (kv_index_ptr, full_kv_index_ptr, 0, 0)
    return b, h, bh, m0, q_start, k_start, seqlen_q, seqlen_k, live, lo_diag, hi_diag, t_lo, n_tiles, tiles


@gluon.jit
def _attn_fwd_producer(
    sched, work, descs, smem, bars, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr, IS_VARLEN: gl.constexpr, SPARSE_TILES: gl.constexpr,
    SPARSE_BLOCK_M: gl.constexpr, PERSISTENT: gl.constexpr, CONSUMERS: gl.constexpr,
):  # fmt: skip
    """The loads of the program's work tiles: ``work`` (tile pid) alone, or under PERSISTENT tiles pid,
    pid + P, …"""
    if PERSISTENT:
        # Causal: a head's row blocks paired, longest with shortest (_paired_tile).
        PAIRED: gl.constexpr = IS_LOCAL and not HAS_WINDOW_LEFT
        pid, num_programs = sched[9:11]
        it = 0
        n_live = 0
        for w in range(pid, _work_slots(sched, PAIRED), num_programs):
            tile = _work_tile(
                w, sched, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT, IS_VARLEN, SPARSE_TILES, SPARSE_BLOCK_M,
                CONSUMERS, PAIRED,
            )  # fmt: skip
            it, n_live = _produce_tile(
                tile, it, n_live, descs, smem, bars, BLOCK_N, STAGES, IS_VARLEN, SPARSE_TILES, PERSISTENT,
                CONSUMERS,
            )  # fmt: skip
    else:
        _produce_tile(
            work, 0, 0, descs, smem, bars, BLOCK_N, STAGES, IS_VARLEN, SPARSE_TILES, PERSISTENT, CONSUMERS
        )


@gluon.jit
def _produce_tile(
    work, it, n_live, descs, smem, bars, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
    SPARSE_TILES: gl.constexpr, PERSISTENT: gl.constexpr, CONSUMERS: gl.constexpr,
):  # fmt: skip
    """Work tile ``work`` (:func:`_work_tile`), if live: its Q parts once the consumers are done with the
    last tile's (q_empty, under PERSISTENT), or with no key tile an arrival on q_bar alone; then its key
    tiles into the ring, whose slots and phases count the ``it`` key tiles loaded before. Returns ``it``
    and ``n_live`` (live tiles) counted on."""
    q_desc, k_desc, v_desc, group = descs
    q_smem, k_smem, v_smem = smem
    q_bar, q_empty, k_ready, k_empty, v_ready, v_empty = bars
    # Q's buffers (two where q_buffers says so: the next tile's Q loads during this one).
    q_bufs: gl.constexpr = q_bar.shape[0]
    q_buf = n_live % q_bufs
    b, h = work[:2]
    m0, q_start, k_start = work[3:6]
    t_lo, n_tiles, tiles = work[11:]
    # One program a tile: the kernel returned already if its tile has nothing to do.
    live = True
    if PERSISTENT:
        live = work[8]
    if live:
        h_kv = h // group
        kv = (
            k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, b, k_start, h_kv, t_lo, tiles
        )  # fmt: skip
        # With the output staged in the one Q buffer, that buffer comes back only once the last tile's
        # store has read it: the first K/V tiles load before, while the consumers finish the last tile.
        ahead = 0
        if PERSISTENT == OUTPUT_IN_Q:
            ahead = gl.minimum(n_tiles, STAGES)
            for j in range(ahead):
                _load_kv_tile(kv, it, j, BLOCK_N, STAGES, IS_VARLEN, SPARSE_TILES)
        if PERSISTENT:
            # An mbarrier starts with its phase-1 wait complete: the first tile finds Q's buffer free.
            mbarrier.wait(q_empty.index(q_buf), ((n_live // q_bufs) & 1) ^ 1)
            n_live += 1
        if n_tiles > 0:
            mbarrier.expect(q_bar.index(q_buf), CONSUMERS * q_desc.block_type.nbytes)
            for part in gl.static_range(CONSUMERS):
                row = m0 + part * WG_ROWS
                q_part = q_smem.index(q_buf * CONSUMERS + part)
                _load_rows(q_desc, b, q_start, row, h, q_bar.index(q_buf), q_part, IS_VARLEN)
        elif PERSISTENT:
            mbarrier.arrive(q_bar.index(q_buf), count=1)
        for j in range(ahead, n_tiles):
            _load_kv_tile(kv, it, j, BLOCK_N, STAGES, IS_VARLEN, SPARSE_TILES)
        if PERSISTENT:
            it += n_tiles
    return it, n_live


@gluon.jit
def _load_kv_tile(
    kv, it, j, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
    SPARSE_TILES: gl.constexpr,
):  # fmt: skip
    """Key tile j of the work tile (ring entry it + j): K and V into their ring slot once it is free."""
    k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, b, k_start, h_kv, t_lo, tiles = kv
    slot = (it + j) % STAGES
    phase = ((it + j) // STAGES) & 1
    n0 = _tile_start(j, t_lo, tiles, BLOCK_N, SPARSE_TILES)
    mbarrier.wait(k_empty.index(slot), phase ^ 1)
    mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
    _load_rows(k_desc, b, k_start, n0, h_kv, k_ready.index(slot), k_smem.index(slot), IS_VARLEN)
    mbarrier.wait(v_empty.index(slot), phase ^ 1)
    mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
    if v_desc.dtype == gl.float8e4nv:
        # Vᵀ (B, H_KV, D, N): a [D, BLOCK_N] box of head h_kv's columns n0 … (_v_operand).
        vt_view = v_smem.index(slot)._reinterpret(
            v_desc.dtype, [1, 1, v_smem.shape[1], v_smem.shape[2]], v_desc.layout
        )
        tma.async_copy_global_to_shared(v_desc, [b, h_kv, 0, n0], v_ready.index(slot), vt_view)
    else:
        _load_rows(v_desc, b, k_start, n0, h_kv, v_ready.index(slot), v_smem.index(slot), IS_VARLEN)


@gluon.jit
def _row_terms(
    rows, diag, lo_diag, hi_diag, seqlen_k, HAS_WINDOW_LEFT: gl.constexpr, HAS_ALIBI: gl.constexpr
):
    """(rows, first visible key, last visible key, i + N_k − N_q) of each query row i: the bounds under
    HAS_WINDOW_LEFT (the last also below N_k), the ALiBi distance's origin under HAS_ALIBI; ``rows``
    stands in for those a kernel does not use."""
    lo_rows = rows
    hi_rows = rows
    alibi_rows = rows
    if HAS_WINDOW_LEFT:
        lo_rows = rows + lo_diag
        hi_rows = gl.minimum(rows + hi_diag, seqlen_k - 1)
    if HAS_ALIBI:
        alibi_rows = rows + diag
    return rows, lo_rows, hi_rows, alibi_rows


@gluon.jit
def _visible(
    n0, offsets, rows, seqlen_k, hi_diag, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr,
    LOCAL_OFFSETS: gl.constexpr = False,
):  # fmt: skip
    """Which (query, key) pairs of a tile exist and are visible: the tile's keys n0 + ``offsets`` (0 …
    BLOCK_N − 1), ``rows`` the :func:`_row_terms` of its query rows; query i sees key j < N_k iff
    i + lo_diag ≤ j ≤ i + hi_diag."""
    rows, lo_rows, hi_rows, _ = rows
    offsets = gl.expand_dims(offsets, 0)
    if HAS_WINDOW_LEFT:
        # The per-row bounds hold the window and N_k.
        cols = n0 + offsets
        keep = (cols >= gl.expand_dims(lo_rows, 1)) & (cols <= gl.expand_dims(hi_rows, 1))
    elif IS_LOCAL and LOCAL_OFFSETS:
        # One compare a score: the row's last key (N_k's bound folded in) counted from the tile's first,
        # against the offsets, which stay in registers from tile to tile. Compared as keys, ptxas computed
        # the compares before the S wgmma's wait and packed their predicates into registers (sm_90 SASS,
        # D = 64 causal: 551 instructions a masked step, against 690 with two compares, 666-812 with one).
        last = gl.minimum(rows + hi_diag, seqlen_k - 1) - n0
        keep = offsets <= gl.expand_dims(last, 1)
    else:
        cols = n0 + offsets
        keep = cols < seqlen_k
        if IS_LOCAL:
            keep = keep & (cols <= gl.expand_dims(rows, 1) + hi_diag)
    return keep


@gluon.jit
def _tanh(x):
    """tanh of fp32 ``x``: one MUFU ``tanh.approx.f32``, as kernels/_scores.py's FAST_TANH."""
    return gl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1
    )


# 2^f on [−0.5, 0.5] as c0 + f·(c1 + f·(c2 + f·c3)): a degree-3 fit of the relative error (7.5e-5 at most,
# fp32 Horner included; docs/design/hopper.md, "Softcap's exponentials"), as fp32 bit patterns for PTX.
_EXP2_COEFFICIENTS = ("0f3F7FFB4B", "0f3F31798E", "0f3E786ED1", "0f3D61FB35")


def _exp2_poly_ptx(out: str, x: str) -> str:
    """PTX for out = 2^x on the FMA and integer pipes, for x ≤ 0 (clamped at −125, whose 2^x ≈ 2e-38
    stands for the underflow): j = round(x) by adding 1.5·2^23 (whose low mantissa bits then hold j),
    2^(x − j) by the polynomial, and j added to its exponent field."""
    c0, c1, c2, c3 = _EXP2_COEFFICIENTS
    return (
        f"{{ .reg .f32 x, t, j, f, p; .reg .b32 tb, pb; "
        f"max.f32 x, {x}, 0fC2FA0000; add.rn.f32 t, x, 0f4B400000; sub.rn.f32 j, t, 0f4B400000; "
        f"sub.rn.f32 f, x, j; fma.rn.f32 p, f, {c3}, {c2}; fma.rn.f32 p, p, f, {c1}; "
        f"fma.rn.f32 p, p, f, {c0}; mov.b32 tb, t; mov.b32 pb, p; shl.b32 tb, tb, 23; "
        f"add.s32 pb, pb, tb; mov.b32 {out}, pb; }}"
    )


def _exp2_shared_ptx(every: int) -> str:
    """One asm instance over ``every`` consecutive elements: the first every − 1 on the MUFU
    (``ex2.approx.ftz``, as ``gl.exp2``), the last by :func:`_exp2_poly_ptx`."""
    mufu = " ".join(f"ex2.approx.ftz.f32 ${i}, ${every + i};" for i in range(every - 1))
    return f"{mufu} {_exp2_poly_ptx(f'${every - 1}', f'${2 * every - 1}')}"


_EXP2_SHARED_2 = gl.constexpr(_exp2_shared_ptx(2))
_EXP2_SHARED_4 = gl.constexpr(_exp2_shared_ptx(4))
_EXP2_SHARED_8 = gl.constexpr(_exp2_shared_ptx(8))
_CONSTRAINTS_8 = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 8))


@gluon.jit
def _exp2_shared(x, EVERY: gl.constexpr):
    """2^x (x ≤ 0, finite) with one element in EVERY (2, 4 or 8) on the FMA pipes and the rest on the MUFU:
    where the MUFU is as busy as the tensor cores (softcap's tanh and exp2), this evens the two out."""
    if EVERY == 2:
        p = gl.inline_asm_elementwise(
            _EXP2_SHARED_2, "=r,=r,r,r", [x], dtype=gl.float32, is_pure=True, pack=2
        )
    elif EVERY == 4:
        p = gl.inline_asm_elementwise(
            _EXP2_SHARED_4, "=r,=r,=r,=r,r,r,r,r", [x], dtype=gl.float32, is_pure=True, pack=4
        )
    else:
        p = gl.inline_asm_elementwise(
            _EXP2_SHARED_8, _CONSTRAINTS_8, [x], dtype=gl.float32, is_pure=True, pack=8
        )
    return p


@gluon.jit
def _bits_seen(bits, m0, n0, rows, cols, SPARSE_BLOCK_M: gl.constexpr, SPARSE_BLOCK_N: gl.constexpr):
    """A block mask's bits (flashtile.block_mask.MaskBits; ``bits`` = (its tile ids' row of the program's
    query block, its words)) for query ``rows`` of the program's block at m0 and the keys ``cols`` of the tile
    at n0 (inside one mask block): True where the mask_mod held. Off the partial tiles it reads tile 0's
    bits, which the caller discards."""
    ids_row, words = bits
    qb = m0 // SPARSE_BLOCK_M
    tile = gl.load(ids_row + n0 // SPARSE_BLOCK_N)
    ROW_WORDS: gl.constexpr = SPARSE_BLOCK_N // 32
    # The tile's rows start at word (tile · block_q + row) · ROW_WORDS; its keys at word (n0 % block_k) / 32.
    base = words + (gl.maximum(tile, 0) * SPARSE_BLOCK_M + rows - qb * SPARSE_BLOCK_M) * ROW_WORDS
    base = base + (n0 % SPARSE_BLOCK_N) // 32
    col = cols - n0
    word_of_col = gl.expand_dims(col // 32, 0)
    picked = gl.expand_dims(gl.load(base), 1) + word_of_col * 0
    for w in gl.static_range(1, cols.shape[0] // 32):
        picked = gl.where(word_of_col == w, gl.expand_dims(gl.load(base + w), 1), picked)
    return ((picked >> gl.expand_dims(col % 32, 0)) & 1) != 0


@gluon.jit
def _v_operand(v_tile):
    """V's tile as the P·V wgmma's B operand, [BLOCK_N, D]. A float8 ring holds Vᵀ's [D, BLOCK_N] tiles
    (float8 wgmma reads B K-major only: docs/design/fp8.md), seen transposed."""
    operand = v_tile
    if v_tile.dtype == gl.float8e4nv:
        operand = v_tile.permute((1, 0))
    return operand


@gluon.jit
def _wait_pv(o_tok, p_op):
    """Wait for the P·V wgmma; P's registers stay live until then (the wait's deps). Triton 3.6 cannot pass
    8-bit registers through the wait ("Unexpected bitwidth in WGMMAWaitGroupOp"), so float8 P is left to
    ptxas, which knows wgmma's register reads (Triton's own float8 dots do the same)."""
    if p_op.dtype.primitive_bitwidth == 8:
        acc = warpgroup_mma_wait(0, deps=[o_tok])
    else:
        acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
    return acc


@gluon.jit
def _take_turn(turn, step, WG: gl.constexpr):
    """Under ping-pong (``turn`` holds two mbarriers), wait until the other consumer has issued its wgmmas of
    ring entry ``step`` − 1 (WG 1: of ``step``), so the tensor cores run one consumer's matmuls while the
    other's softmax runs. An mbarrier's phase-1 wait is complete from the start: WG 0 goes first."""
    if turn.shape[0] == 2:
        mbarrier.wait(turn.index(WG), (step + 1 - WG) & 1)


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr):
    """Under ping-pong, let the other consumer issue its wgmmas (this one's are issued)."""
    if turn.shape[0] == 2:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _alibi_scores(s, n0, alibi_rows, alibi, s_scale, BLOCK_N: gl.constexpr):
    """ALiBi's bias −slope·|i′ − j| (i′ = i + N_k − N_q, the slope times log2(e)) on the raw scores ``s`` of
    keys j = n0 + c, c < BLOCK_N: (t, shift) with s_total = t + shift / s_scale, the shift one value a row,
    so that the row max is max(t)·s_scale + shift and the exponent t·s_scale − (m − shift). ``alibi`` =
    (slope, the consumer's first i′, whether every visible key is at or left of its row's i′[, the columns'
    offsets 0 … BLOCK_N − 1 as floats]). Where the whole tile lies on one side of every row's i′ (each tile
    under causal; all but the diagonal's under full attention), |i′ − j| = ±(i′ − n0 − c) and a score costs
    one FMA (t = s ± a·c, a = slope / s_scale); the tiles across the diagonal take the absolute value, one
    subtraction and one FMA a score. Positions convert to fp32 per row and per column (exact below 2^24)."""
    if len(alibi) == 4:
        offsets = alibi[3]
    else:
        offsets = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout)).to(gl.float32)
    a = alibi[0] / s_scale
    rows_f = (alibi_rows - n0).to(gl.float32)
    row0, left_always = alibi[1], alibi[2]
    # Rows i′ ∈ [row0, row0 + rows − 1]; keys [n0, n0 + BLOCK_N − 1].
    left = left_always | (n0 + (BLOCK_N - 1) <= row0)
    right = n0 >= row0 + (s.type.shape[0] - 1)
    if left | right:
        side = -a
        if left:
            side = a
        # Left: −a·(i′ − n0 − c) = a·c − a·(i′ − n0); right: the opposite signs.
        t = s + side * gl.expand_dims(offsets, 0)
        shift = (-side * s_scale) * rows_f
    else:
        t = s - a * gl.abs(gl.expand_dims(rows_f, 1) - gl.expand_dims(offsets, 0))
        shift = rows_f * 0.0
    return t, shift


@gluon.jit
def _softmax_step(
    s, m_i, l_i, n0, rows, scores, mod_args, MASKED: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, BLOCK_N: gl.constexpr,
    MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, SPARSE_BLOCK_M: gl.constexpr,
    SPARSE_TILES: gl.constexpr, SCALE_FIRST: gl.constexpr, LOCAL_OFFSETS: gl.constexpr = False,
):  # fmt: skip
    """Fold the raw scores ``s`` of keys [n0, n0 + BLOCK_N) into (m, ℓ); return P, m, ℓ and the factor α
    that rescales the running output. Base 2: m is the running max of the scores times log2(e), ``s ·
    qk_scale`` or, with softcap or ALiBi, kernels/_scores.py's ``base2_scores``. ``rows``: the query rows
    and the per-row terms :func:`_row_terms` computes once. A masked step with MASK_MOD (a block mask's
    partial tile) also hides the pairs where ``MASK_MOD(b, h, q_idx, kv_idx[, aux])`` is False, or under
    MASK_BITS where the block mask's bits (``aux``) say so, when the ``use_mod`` of ``mod_args`` = (b, h, N_q,
    aux, use_mod, m0) holds. ``scores``' last entry, dropout's, is the caller's (:func:`_draw_tile`): ℓ sums
    every entry (the softmax before dropout); its ALiBi entry is (slope,) or (slope, the float column
    offsets 0 … BLOCK_N − 1)."""
    alibi_rows = rows[3]
    seqlen_k, hi_diag, qk_scale, softcap_qk, softcap_out, alibi, _, EXP2_SHARE = scores
    if MASKED:
        offsets = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        cols = n0 + offsets
    # qk_scale > 0 (the launcher makes it so, but for float8: SCALE_FIRST): the row max commutes with the
    # scaling, which folds into one FMA per score below; so does softcap's factor.
    s_scale = qk_scale
    if SCALE_FIRST and not HAS_SOFTCAP:
        # Float8: the scale times the caller's descales may have either sign, so it scales the scores
        # before the row max (one multiply a score more).
        s = s * qk_scale
        s_scale = 1.0
    if HAS_SOFTCAP:
        # Softcap: c·tanh(scale·qk / c)·log2(e), with softcap_qk = scale / c and softcap_out = c·log2(e) > 0,
        # which the same FMA applies.
        s = _tanh(s * softcap_qk)
        s_scale = softcap_out
    # ALiBi as a score plus a per-row shift where ``alibi`` brings the consumer's rows (_alibi_scores).
    ALIBI_SHIFT: gl.constexpr = HAS_ALIBI and len(alibi) > 1
    if ALIBI_SHIFT:
        # s_total = s + shift / s_scale, the shift scaled like m.
        s, shift = _alibi_scores(s, n0, alibi_rows, alibi, s_scale, BLOCK_N)
    elif HAS_ALIBI:
        # −slope·|i + N_k − N_q − j| (the slope times log2(e)), divided by the scale still to come: with
        # softcap or dropout beside it, and in the decode kernel (a slope a row). Positions convert per row
        # and per column, not per score: one subtraction and one FMA per score, in fp32 (exact distances
        # below 2^24).
        cols_f = (n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))).to(gl.float32)
        dist = gl.abs(gl.expand_dims(alibi_rows.to(gl.float32), 1) - gl.expand_dims(cols_f, 0))
        s = s + (-alibi[0] / s_scale) * dist
    if MASKED:
        keep = _visible(n0, offsets, rows, seqlen_k, hi_diag, IS_LOCAL, HAS_WINDOW_LEFT, LOCAL_OFFSETS)
        if MASK_MOD is not None or MASK_BITS:
            b, h, seqlen_q, aux, use_mod, m0 = mod_args
            if MASK_BITS:
                seen = _bits_seen(aux, m0, n0, rows[0], cols, SPARSE_BLOCK_M, SPARSE_TILES * BLOCK_N)
            else:
                seen = call_mod(
                    None, b, h, gl.expand_dims(rows[0], 1), gl.expand_dims(cols, 0), seqlen_q, seqlen_k, aux,
                    MASK_MOD, MASK_MOD_AUX,
                )  # fmt: skip
            keep = keep & (seen | (use_mod == 0))
        s = gl.where(keep, s, -float("inf"))
    if ALIBI_SHIFT:
        m_new = gl.maximum(m_i, gl.max(s, 1) * s_scale + shift)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * s_scale)
    # A row that has seen no visible key keeps m = −inf; subtracting 0 avoids −inf − (−inf).
    m_ref = gl.where(m_new == -float("inf"), 0.0, m_new) if MASKED else m_new
    # What each score's exponent subtracts: m, less ALiBi's row shift.
    m_sub = m_ref - shift if ALIBI_SHIFT else m_ref
    if EXP2_SHARE > 1 and not MASKED:
        # Unmasked tiles (every score finite): one exponential in EXP2_SHARE on the FMA pipes.
        p = _exp2_shared(s * s_scale - gl.expand_dims(m_sub, 1), EXP2_SHARE)
    else:
        p = gl.exp2(s * s_scale - gl.expand_dims(m_sub, 1))
    alpha = gl.exp2(m_i - m_ref)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _release(bar, PER_THREAD: gl.constexpr):
    """Every thread of a consumer arrives on a ring slot's "empty" barrier (K or V here, Q/dO in the
    backward; it counts WG_THREADS a consumer), after the wgmmas that read the slot have completed: no
    partition-wide bar.sync before the arrive, which Gluon's one-thread ``mbarrier.arrive`` places. The
    slot was only read, so the arrive publishes no data of the consumer's (docs/design/hopper.md,
    "Releasing a ring slot"). Without PER_THREAD, Gluon's one-thread arrive (the barrier counts one a
    consumer)."""
    if PER_THREAD:
        async_copy.mbarrier_arrive(bar, increment_count=False)
    else:
        mbarrier.arrive(bar, count=1)


@gluon.jit
def _draw_tile(drop, n0, BLOCK_N: gl.constexpr, layout: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Dropout's keep bits (hopper/dropout.py) of the consumer's rows and the keys [n0, n0 + BLOCK_N);
    ``drop`` = (seed, offset, threshold, bh, the consumer's first row)."""
    seed, offset, threshold, bh, row0 = drop
    # At D = 256 the output's 128 registers a thread leave no room for the key schedule's 20 (they spilled
    # inside the key loop); the asm adds the round keys itself there.
    return dropout.draw(seed, offset, threshold, bh, row0, n0, BLOCK_N, layout, True, HEAD_DIM < 256)


@gluon.jit
def _attn_fwd_steps(
    acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, base, lo, hi, t_lo, tiles,
    rows, scores, mod_args, WG: gl.constexpr, MASKED: gl.constexpr, IS_LOCAL: gl.constexpr,
    HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
    P_OPERAND: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SPARSE_TILES: gl.constexpr,
    MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, SPARSE_BLOCK_M: gl.constexpr,
    HAS_DROPOUT: gl.constexpr, LOCAL_OFFSETS: gl.constexpr = False, THREAD_RELEASE: gl.constexpr = False,
):  # fmt: skip
    """Tiles [lo, hi) (key tile t_lo + j, ring entry base + j): issue S(j), then O += P(j−1)·V(j−1),
    softmax(j) while the P·V wgmma runs, both issued in consumer WG's turn under ping-pong
    (:func:`_take_turn`). P passes from one tile to the next in fp32, or with P_OPERAND as the wgmma
    operand."""
    # The wgmma instruction's K: 16 for 16-bit operands, 32 for float8.
    MMA_K: gl.constexpr = 256 // v_smem.dtype.primitive_bitwidth
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, MMA_K]
    )
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=acc.type.layout, k_width=32 // v_smem.dtype.primitive_bitwidth
    )
    s_zero = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    for j in range(lo, hi):
        slot = (base + j) % STAGES
        mbarrier.wait(k_ready.index(slot), ((base + j) // STAGES) & 1)
        _take_turn(turn, base + j, WG)
        s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        prev = (base + j - 1) % STAGES
        mbarrier.wait(v_ready.index(prev), ((base + j - 1) // STAGES) & 1)
        p_op = p if P_OPERAND else gl.convert_layout(p.to(v_smem.dtype), p_layout)
        o_tok = warpgroup_mma(p_op, _v_operand(v_smem.index(prev)), acc, is_async=True)
        _pass_turn(turn, WG)
        # The tile's keys matter only to the mask, ALiBi and dropout (a listed tile's start is a load).
        n0 = 0
        if MASKED or HAS_ALIBI or HAS_DROPOUT:
            n0 = _tile_start(j, t_lo, tiles, BLOCK_N, SPARSE_TILES)
        if HAS_DROPOUT:
            # Dropout's draws while both wgmmas run (after S lands they measured 3–7 % slower).
            drawn = _draw_tile(scores[6], n0, BLOCK_N, s_layout, acc.type.shape[1])
        # wgmma groups retire in order: one left outstanding is the P·V just issued.
        s = warpgroup_mma_wait(1, deps=[s_tok])
        _release(k_empty.index(slot), THREAD_RELEASE)
        p, m_i, l_i, alpha = _softmax_step(
            s, m_i, l_i, n0, rows, scores, mod_args, MASKED, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP,
            HAS_ALIBI, BLOCK_N, MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, SPARSE_TILES,
            v_smem.dtype == gl.float8e4nv, LOCAL_OFFSETS,
        )  # fmt: skip
        if HAS_DROPOUT:
            if P_OPERAND:
                # Dropped in the operand's dtype, two entries a register (dropout.keep_pairs).
                p = dropout.keep_pairs(p, *drawn, v_smem.dtype)
            else:
                p = gl.where(dropout.kept(*drawn), p, 0.0)
        acc = _wait_pv(o_tok, p_op)
        _release(v_empty.index(prev), THREAD_RELEASE)
        if P_OPERAND:
            p = gl.convert_layout(p.to(v_smem.dtype), p_layout)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    return acc, m_i, l_i, p


@gluon.jit
def _attn_fwd_consumer(
    sched, work, program, options, smem, bars, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, P_OPERAND: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
    SPARSE_TILES: gl.constexpr, MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr,
    SPARSE_BLOCK_M: gl.constexpr, HAS_DROPOUT: gl.constexpr, PERSISTENT: gl.constexpr,
    CONSUMERS: gl.constexpr,
):  # fmt: skip
    """Consumer WG of the program's work tiles, in the producer's order: ``work`` (tile pid) alone, or under
    PERSISTENT tiles pid, pid + P, …; ``it`` counts the ring entries consumed, ``n_live`` the live tiles
    (q_bar's phases)."""
    if PERSISTENT:
        # Causal: a head's row blocks paired, longest with shortest (_paired_tile).
        PAIRED: gl.constexpr = IS_LOCAL and not HAS_WINDOW_LEFT
        pid, num_programs = sched[9:11]
        it = 0
        n_live = 0
        for w in range(pid, _work_slots(sched, PAIRED), num_programs):
            tile = _work_tile(
                w, sched, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT, IS_VARLEN, SPARSE_TILES, SPARSE_BLOCK_M,
                CONSUMERS, PAIRED,
            )  # fmt: skip
            it, n_live = _consume_tile(
                tile, it, n_live, program, options, smem, bars, WG, HEAD_DIM, BLOCK_N, IS_LOCAL,
                HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES, MASK_MOD,
                MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT,
            )  # fmt: skip
        # The last tile's output store reads the staging buffer until it completes.
        tma.store_wait(0)
    else:
        _consume_tile(
            work, 0, 0, program, options, smem, bars, WG, HEAD_DIM, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT,
            HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES, MASK_MOD, MASK_MOD_AUX,
            MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT,
        )  # fmt: skip


@gluon.jit
def _consume_tile(
    work, it, n_live, program, options, smem, bars, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, P_OPERAND: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
    SPARSE_TILES: gl.constexpr, MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr,
    SPARSE_BLOCK_M: gl.constexpr, HAS_DROPOUT: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """Work tile ``work`` for consumer WG, if live (:func:`_attn_fwd_tile`); returns ``it`` and ``n_live``
    counted on."""
    live = True
    if PERSISTENT:
        live = work[8]
    if live:
        _attn_fwd_tile(
            work, it, n_live, program, options, smem, bars, WG, HEAD_DIM, BLOCK_N, IS_LOCAL,
            HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES, MASK_MOD,
            MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT,
        )  # fmt: skip
        if PERSISTENT:
            n_live += 1
            it += work[12]
    return it, n_live


@gluon.jit
def _release_staged_q(q_turn, q_empty, q_bufs: gl.constexpr):
    """Under STAGED_IN_Q: the previous live tile's Q buffer staged its output; once that TMA store has read
    it (every warp's wait done first: the warp that issued it may lag), the producer may load Q into it.
    Under PERSISTENT = OUTPUT_IN_Q (one buffer, q_turn the next tile's): at the end of the tile."""
    tma.store_wait(0)
    gl.thread_barrier()
    if q_turn > 0:
        mbarrier.arrive(q_empty.index((q_turn - 1) % q_bufs), count=1)


@gluon.jit
def _attn_fwd_tile(
    work, it, q_turn, program, options, smem, bars, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, P_OPERAND: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
    SPARSE_TILES: gl.constexpr, MASK_MOD: gl.constexpr, MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr,
    SPARSE_BLOCK_M: gl.constexpr, HAS_DROPOUT: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """One work tile (:func:`_work_tile`) for consumer WG: its Q (the program's live tile ``q_turn``: Q's
    buffer q_turn mod Q_BUFS and the phase of its barriers), its 64 rows'
    online softmax over the tile's key tiles (ring entries it, it + 1, …), then out and LSE. Without key
    tiles, under PERSISTENT, it takes its turn on q_bar all the same. Under PERSISTENT the output has a
    staging buffer of its own and Q's buffer is released (q_empty) once this warpgroup's last S wgmma has
    retired, or under STAGED_IN_Q Q's buffer stages the output and is released during the next tile;
    otherwise Q's half stages the output."""
    b, h, bh, m0 = work[:4]
    seqlen_q, seqlen_k = work[6:8]
    lo_diag, hi_diag, t_lo, n_tiles, tiles = work[9:]
    o_desc, o_ptr, lse_ptr, cu_seqlens_q_ptr, H, total_q, qk_scale = program
    softcap_qk, softcap_out, alibi_ptr, stride_alibi_b, aux, drop_args, descale_ptr, EXP2_SHARE = options[:8]
    sink_ptr, HAS_SINK = options[8:]
    q_smem, o_smem, k_smem, v_smem = smem
    # Float8 q, k, v (docs/design/fp8.md): the fp32 descales of (batch, query head) at descale_ptr, (B, H, 3)
    # (q's, k's, v's), fold into the scale and the output; the output is staged in a buffer of its own
    # dtype.
    FP8: gl.constexpr = v_smem.dtype == gl.float8e4nv
    v_descale = 1.0
    if FP8:
        descales = descale_ptr + bh.to(gl.int64) * 3
        qk_descale = gl.load(descales) * gl.load(descales + 1)
        qk_scale = qk_scale * qk_descale
        softcap_qk = softcap_qk * qk_descale
        v_descale = gl.load(descales + 2)
    q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turn, THREAD_RELEASE = bars
    # The wgmma instruction's K: 16 for 16-bit operands, 32 for float8.
    MMA_K: gl.constexpr = 256 // v_smem.dtype.primitive_bitwidth
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, MMA_K]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, MMA_K]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    # P as the second wgmma's register operand: 32 bits a register (2 bf16 / fp16 entries, 4 float8).
    p_layout: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=o_layout, k_width=32 // v_smem.dtype.primitive_bitwidth
    )

    row0 = m0 + WG * WG_ROWS
    # Bottom-right alignment: query i sees key j iff i + lo_diag ≤ j ≤ i + hi_diag (each bound if present).
    rows = _row_terms(
        row0 + gl.arange(0, WG_ROWS, layout=s_rows), seqlen_k - seqlen_q, lo_diag, hi_diag, seqlen_k,
        HAS_WINDOW_LEFT, HAS_ALIBI,
    )  # fmt: skip
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = gl.load(alibi_ptr + b * stride_alibi_b + h) * LOG2_E_C
    seed = 0
    offset = 0
    if HAS_DROPOUT:
        seed, offset = dropout.load_rng_state(drop_args[0])
    drop = (seed, offset, drop_args[1], bh, row0)
    # ALiBi alone: its distances count from the consumer's first row (i + N_k − N_q at row0), and a right
    # bound at or left of the diagonal (causal) puts every visible key at or left of its row's
    # (_alibi_scores). Beside softcap or dropout the per-row shift spilled registers (sm_90: 8-216 B of
    # stack, up to 125 local accesses in the key loops), so those keep the absolute value a score.
    alibi = (alibi_slope,)
    if HAS_ALIBI and not (HAS_SOFTCAP or HAS_DROPOUT):
        alibi_row0 = row0 + (seqlen_k - seqlen_q)
        left_always = False
        if IS_LOCAL:
            left_always = hi_diag <= seqlen_k - seqlen_q
        alibi = (alibi_slope, alibi_row0, left_always)
        if HEAD_DIM > 64:
            # The key tiles' column offsets as floats, the same for every tile: kept across the key loops
            # (32 registers a thread; at D = 64 that spilled registers, sm_90, so each tile converts its own).
            alibi = (
                alibi_slope, alibi_row0, left_always,
                gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)).to(gl.float32),
            )  # fmt: skip
    scores = (seqlen_k, hi_diag, qk_scale, softcap_qk, softcap_out, alibi, drop, EXP2_SHARE)
    q_bufs: gl.constexpr = q_bar.shape[0]
    consumers: gl.constexpr = q_smem.shape[0] // q_bufs
    # The causal mask compares the tile's key offsets, held in registers (_visible), at D = 64 and 256 with
    # two consumers and no option only (H200 kernel time: D = 64 causal 3-5 % faster at N <= 2k, D = 256
    # 1-3 % at 512 and 16k): elsewhere the registers grew ptxas's stack frames (sm_90: 32 B at D = 128
    # causal, 40 B with three consumers or packed at D = 256, local accesses in the float8 key loop).
    LOCAL_OFFSETS: gl.constexpr = (
        (HEAD_DIM == 64 or (HEAD_DIM == 256 and not (IS_VARLEN or SPARSE_TILES)))
        and consumers == 2
        and not (HAS_SOFTCAP or HAS_ALIBI or HAS_DROPOUT or FP8)
    )
    # Three consumers under a window bounded on the right only (causal): the work tile's 192 rows reach up
    # to two key tiles past a lower warpgroup's last key; that warpgroup takes its own tiles, n_steps, and
    # releases the ring slots of the rest unread (wholly masked for its rows). So do two consumers with
    # 64-key tiles (D = 256, and D = 64 at configs.short_causal): the lower one skips the diagonal's last
    # tile (H200 kernel time, plain causal: D = 64 2 % less at 512; D = 256 4 / 2 / 2 % less at 512 / 1k /
    # 2k, within ±2 % from 4k).
    OWN_TILES: gl.constexpr = (
        (consumers == 3 or BLOCK_N == 64) and IS_LOCAL and not (HAS_WINDOW_LEFT or SPARSE_TILES or IS_VARLEN)
    )
    n_steps = n_tiles
    if OWN_TILES:
        # The warpgroup's last row sees the keys up to row0 + WG_ROWS − 1 + hi_diag; at least tile 0 (rows
        # that see no key take it masked, as with two consumers).
        n_steps = gl.minimum(gl.maximum(gl.cdiv(row0 + WG_ROWS + hi_diag, BLOCK_N), 1), n_tiles)
    # Tiles [1, a) and [b_full, n_steps) need the mask (tile 0 too); [a, b_full) every row sees in full.
    n_mod = 0
    if SPARSE_TILES:
        # The partial blocks' tiles lead: with a mask_mod, tiles [1, a) take it (tile 0 if it is one).
        if MASK_MOD is not None or MASK_BITS:
            n_mod = gl.minimum(tiles[3] * SPARSE_TILES, n_tiles)
        a = gl.maximum(n_mod, 1)
        # Listed tiles are in no order along the keys: the rest all take the masked step where any tile may
        # need it (a window, or keys past N_k in the last tile), none otherwise.
        b_full = a
        if not (IS_LOCAL or HAS_WINDOW_LEFT):
            b_full = gl.maximum(a, n_tiles * (seqlen_k % BLOCK_N == 0).to(gl.int32))
        first_partial = True
    else:
        a, b_full = _masked_steps(
            row0, t_lo, n_steps, seqlen_k, lo_diag, hi_diag, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT
        )
        # Tile 0 skips its mask where it can only on the persistent grid, in plain kernels with two
        # consumers (windows and causal included): elsewhere the second softmax step grew ptxas's stack
        # frames (184 B at D = 128 with softcap and ALiBi, 1 KB at D = 256 with dropout, 64 B with three
        # consumers), and one program a tile at D = 128 ran 9-12 % slower at N = 4k-16k with key loops of
        # the same instructions (docs/design/hopper.md, "The consumer's schedule").
        first_partial = True
        if PERSISTENT and consumers == 2 and not (HAS_SOFTCAP or HAS_ALIBI or HAS_DROPOUT or IS_VARLEN):
            first_partial = _first_tile_partial(
                row0, t_lo, seqlen_k, lo_diag, hi_diag, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT
            )

    if MASK_BITS:
        # The tile ids of this query block's row (the ids have the kv lists' layout), and the words.
        aux = (aux[0] + tiles[2], aux[1])
    mod_args = (b, h, seqlen_q, aux, n_mod > 0, m0)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([WG_ROWS], -float("inf"), gl.float32, s_rows)
    l_i = gl.zeros([WG_ROWS], gl.float32, s_rows)
    # A persistent program with two Q buffers and no output buffer of its own (D > 64) stages each tile's
    # output in that tile's Q buffer and releases it during the next tile.
    STAGED_IN_Q: gl.constexpr = PERSISTENT and q_bufs == 2 and HEAD_DIM > 64
    # The one Q buffer stages the output and goes back to the producer once the store has read it.
    OUT_IN_Q: gl.constexpr = PERSISTENT == OUTPUT_IN_Q
    q_buf = q_turn % q_bufs
    q_phase = (q_turn // q_bufs) & 1
    q = q_smem.index(q_buf * consumers + WG)
    if n_tiles > 0:
        mbarrier.wait(q_bar.index(q_buf), q_phase)
        # Tile 0 alone: it has no P·V to overlap with, and may need the mask.
        mbarrier.wait(k_ready.index(it % STAGES), (it // STAGES) & 1)
        _take_turn(turn, it, WG)
        s_tok = warpgroup_mma(
            q, k_smem.index(it % STAGES).permute((1, 0)), gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout),
            use_acc=False, is_async=True,
        )  # fmt: skip
        _pass_turn(turn, WG)
        if STAGED_IN_Q:
            _release_staged_q(q_turn, q_empty, q_bufs)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        _release(k_empty.index(it % STAGES), THREAD_RELEASE)
        n_first = _tile_start(0, t_lo, tiles, BLOCK_N, SPARSE_TILES)
        # Two whole softmax steps, not a branch around the mask alone: with that, ptxas spilled the second
        # consumer's key loops at D = 128 (69 local accesses, sm_90).
        if first_partial:
            p, m_i, l_i, _ = _softmax_step(
                s, m_i, l_i, n_first, rows, scores, mod_args, True, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP,
                HAS_ALIBI, BLOCK_N, MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, SPARSE_TILES,
                v_smem.dtype == gl.float8e4nv,
            )  # fmt: skip
        else:
            p, m_i, l_i, _ = _softmax_step(
                s, m_i, l_i, n_first, rows, scores, mod_args, False, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP,
                HAS_ALIBI, BLOCK_N, MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, SPARSE_TILES,
                v_smem.dtype == gl.float8e4nv,
            )  # fmt: skip
        if HAS_DROPOUT:
            p = gl.where(dropout.kept(*_draw_tile(drop, n_first, BLOCK_N, s_layout, HEAD_DIM)), p, 0.0)
        if P_OPERAND:
            p = gl.convert_layout(p.to(v_smem.dtype), p_layout)
        if HAS_WINDOW_LEFT or MASK_MOD is not None or MASK_BITS:
            # The window's left edge: tiles some rows see in part, before those all rows see in full; or
            # a block mask's partial tiles, with its mask_mod.
            acc, m_i, l_i, p = _attn_fwd_steps(
                acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, it, 1, a,
                t_lo, tiles, rows, scores, mod_args, WG, True, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP,
                HAS_ALIBI, P_OPERAND, BLOCK_N, STAGES, SPARSE_TILES, MASK_MOD, MASK_MOD_AUX, MASK_BITS,
                SPARSE_BLOCK_M, HAS_DROPOUT, THREAD_RELEASE=THREAD_RELEASE,
            )  # fmt: skip
        acc, m_i, l_i, p = _attn_fwd_steps(
            acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, it, a, b_full,
            t_lo, tiles, rows, scores, mod_args, WG, False, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI,
            P_OPERAND, BLOCK_N, STAGES, SPARSE_TILES, None, False, False, SPARSE_BLOCK_M, HAS_DROPOUT,
            THREAD_RELEASE=THREAD_RELEASE,
        )  # fmt: skip
        acc, m_i, l_i, p = _attn_fwd_steps(
            acc, m_i, l_i, p, q, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, it, b_full,
            n_steps, t_lo, tiles, rows, scores, mod_args, WG, True, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP,
            HAS_ALIBI, P_OPERAND, BLOCK_N, STAGES, SPARSE_TILES, None, False, False, SPARSE_BLOCK_M,
            HAS_DROPOUT, LOCAL_OFFSETS, THREAD_RELEASE,
        )  # fmt: skip
        if PERSISTENT and not (STAGED_IN_Q or OUT_IN_Q):
            # Every S wgmma of this tile has retired: the producer may load Q into this buffer again.
            mbarrier.arrive(q_empty.index(q_buf), count=1)
        last = (it + n_steps - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((it + n_steps - 1) // STAGES) & 1)
        p_op = p if P_OPERAND else gl.convert_layout(p.to(v_smem.dtype), p_layout)
        o_tok = warpgroup_mma(p_op, _v_operand(v_smem.index(last)), acc, is_async=True)
        acc = _wait_pv(o_tok, p_op)
        _release(v_empty.index(last), THREAD_RELEASE)
        if OWN_TILES:
            # The other warpgroups' tiles: each slot released once loaded, in the ring's order (the
            # producer refills in that order, so no wait here blocks it).
            for j in range(n_steps, n_tiles):
                e = it + j
                mbarrier.wait(k_ready.index(e % STAGES), (e // STAGES) & 1)
                _release(k_empty.index(e % STAGES), THREAD_RELEASE)
                mbarrier.wait(v_ready.index(e % STAGES), (e // STAGES) & 1)
                _release(v_empty.index(e % STAGES), THREAD_RELEASE)
    elif PERSISTENT:
        # No key tile: the producer's arrival on q_bar instead of Q (so this tile's turn is taken in order).
        mbarrier.wait(q_bar.index(q_buf), q_phase)
        if STAGED_IN_Q:
            _release_staged_q(q_turn, q_empty, q_bufs)
        elif not OUT_IN_Q:
            mbarrier.arrive(q_empty.index(q_buf), count=1)

    if HAS_SINK:
        # The sink joins the row's softmax as a key with no value row, the max moving to max(m, sink) so
        # that ℓ cannot overflow; a row that saw no key ends at ℓ = 1, m = sink: out 0, lse = sink.
        sink2 = gl.load(sink_ptr + h) * LOG2_E_C
        m_new = gl.maximum(m_i, sink2)
        # A sink of −inf on a row with no key keeps ℓ = 0 (out 0, lse −inf) without −inf − (−inf).
        m_ref = gl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_ref)
        l_i = l_i * alpha + gl.exp2(sink2 - m_ref)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
        m_i = m_new
    # Rows that saw no key have ℓ = 0: their output is 0 and their log-sum-exp −inf.
    l_o = gl.convert_layout(l_i, o_rows)
    if HAS_DROPOUT:
        # The kept entries' 1 / (1 − p): out = acc / (ℓ · (1 − p)), once per row.
        l_o = l_o * drop_args[2]
    l_o = gl.where(l_o == 0.0, 1.0, l_o)
    # On the persistent grid one reciprocal a row, then a multiply an element: a division an element
    # compiles to three instructions (sm_90, div.full.f32's range scaling). One program a tile keeps the
    # division: its code stays that of the kernel measured before (see first_partial above).
    out = acc * gl.expand_dims(1.0 / l_o, 1) if PERSISTENT else acc / gl.expand_dims(l_o, 1)
    if FP8:
        out = out * v_descale
    lse = (m_i + gl.log2(l_i)) * LN_2
    out_rows = rows[0]
    if IS_VARLEN:
        # The sequence's first row, loaded again here rather than held through the loop (a register less).
        q_start = gl.minimum(gl.maximum(gl.load(cu_seqlens_q_ptr + b), 0), total_q)
        lse_row = lse_ptr + h.to(gl.int64) * total_q + q_start
    else:
        lse_row = lse_ptr + bh.to(gl.int64) * seqlen_q
    gl.store(lse_row + out_rows, lse, mask=out_rows < seqlen_q)
    if PERSISTENT and not (STAGED_IN_Q or OUT_IN_Q):
        # The staging buffer: this warpgroup's own, which the last tile's store must have read (every
        # warp's wait done before any warp writes: the warp that issued the store may be behind).
        staged = o_smem.index(WG)
        tma.store_wait(0)
        gl.thread_barrier()
    elif FP8:
        # One program a tile (float8 takes no persistent grid): the buffer has held nothing before.
        staged = o_smem.index(WG)
    else:
        # Q's half is free once this warpgroup's last S wgmma has retired: it stages the output tile (under
        # STAGED_IN_Q the buffer goes back to the producer once the store has read it, next tile).
        staged = q
    staged.store(out.to(o_smem.dtype))
    if IS_VARLEN:
        # A TMA store would write the rows past the sequence, the next sequence's: masked stores instead,
        # STORE_ROWS rows at a time read back from the staged tile (a few registers a thread).
        STORE_ROWS: gl.constexpr = 16
        store_layout: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 8], threads_per_warp=[256 // HEAD_DIM, HEAD_DIM // 8],
            warps_per_cta=[4, 1], order=[1, 0],
        )  # fmt: skip
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
        # One 64-bit base (a uniform value), then 32-bit offsets: 64 rows of H·D elements stay far below 2³¹.
        o_rows = o_ptr + (q_start + row0).to(gl.int64) * (H * HEAD_DIM) + h.to(gl.int64) * HEAD_DIM
        for c in gl.static_range(WG_ROWS // STORE_ROWS):
            tile = staged.slice(c * STORE_ROWS, STORE_ROWS, dim=0).load(store_layout)
            r = c * STORE_ROWS + gl.arange(0, STORE_ROWS, layout=gl.SliceLayout(1, store_layout))
            offs = gl.expand_dims(r * (H * HEAD_DIM), 1) + gl.expand_dims(cols, 0)
            gl.store(o_rows + offs, tile, mask=gl.expand_dims(r < seqlen_q - row0, 1))
    else:
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, row0, h, 0], _tile_view(staged, o_desc))
        if not PERSISTENT:
            tma.store_wait(0)
        if OUT_IN_Q:
            _release_staged_q(q_turn + 1, q_empty, q_bufs)


# Sizes stay runtime values: specialising on 1 or on multiples of 16 would only multiply the compiles (and
# varlen training changes the totals, the block count and the batch at every step).
SIZE_ARGS = ["seqlen_q", "seqlen_k", "num_m_blocks", "total_work", "H", "GROUP", *DIVIDER_ARGS]


@gluon.jit(do_not_specialize=[*SIZE_ARGS, *WINDOW_ARGS, *LIST_ARGS])
def attn_fwd_kernel(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, alibi_ptr, o_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
    kv_count_ptr, kv_index_ptr, full_kv_count_ptr, full_kv_index_ptr, aux, rng_state_ptr, descale_ptr,
    sink_ptr, seqlen_q, seqlen_k, num_m_blocks, total_work, H, GROUP, m_magic, m_shift, h_magic, h_shift,
    p_magic, p_shift, qk_scale, window_left, window_right, softcap_qk, softcap_out, stride_alibi_b,
    dropout_threshold, dropout_keep_frac, list_stride_b, list_stride_h, list_row_len, HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
    SPARSE_BLOCK_M: gl.constexpr, SPARSE_TILES: gl.constexpr, MASK_MOD: gl.constexpr,
    MASK_MOD_AUX: gl.constexpr, MASK_BITS: gl.constexpr, PERSISTENT: gl.constexpr, CONSUMERS: gl.constexpr,
    Q_BUFS: gl.constexpr, PINGPONG: gl.constexpr, EXP2_SHARE: gl.constexpr, HAS_SINK: gl.constexpr,
):  # fmt: skip
    """IS_LOCAL: the right side of the window is bounded (causal: window_right = 0); HAS_WINDOW_LEFT: the
    left side is (window_left); HAS_SOFTCAP: softcap_qk = scale / c, softcap_out = c·log2(e); HAS_ALIBI:
    fp32 slopes at alibi_ptr + b·stride_alibi_b + h (any pointer without); HAS_DROPOUT: the int64 (seed,
    offset) at rng_state_ptr draws kernels/_dropout.py's mask, an entry kept iff its draw ≥
    dropout_threshold, the output scaled by 1 / dropout_keep_frac (= 1 − p; any pointer and values without);
    HAS_SINK: each query head's learnable sink, fp32 at sink_ptr + h, joins every row's softmax once after its
    last key tile (docs/design/sinks.md; any pointer without).

    IS_VARLEN: q/k/v are packed (total, H, D) behind rank-3 descriptors, seqlen_q/k the totals, sequence b
    the rows [cu_seqlens[b], cu_seqlens[b + 1]) (clamped into [0, total]); the output goes to the packed
    contiguous ``o_ptr`` through masked stores (o_desc is unused), the LSE is (H, total_q). Otherwise o_ptr
    and cu_seqlens_* are unused (any pointer).

    SPARSE_TILES > 0 (dense batches): a block mask of (SPARSE_BLOCK_M, SPARSE_TILES · BLOCK_N) blocks
    (flashtile.BlockMask's ``kv_*`` lists, read at b·list_stride_b + h·list_stride_h + row, rows of
    list_row_len entries); a program visits its query block's listed key blocks only, and in the partial
    ones hides the pairs where ``MASK_MOD(b, h, q_idx, kv_idx[, aux])`` (a ``@triton.jit`` function, None:
    none) is False, or under MASK_BITS where the mask's bits (``aux`` = flashtile.block_mask.MaskBits' ids,
    words, meta) say so. Otherwise the list pointers are unused; ``aux`` is the mask_mod's tensors or None.

    CONSUMERS (2, or 3 at D = 64 with no softcap, ALiBi, dropout, packed batch or block mask:
    :func:`consumer_count`): consumer warpgroups of WG_ROWS query rows each, so a work tile has
    CONSUMERS · WG_ROWS rows. PINGPONG (two consumers): they issue their wgmmas of each key tile in turn.

    Float8 e4m3 q, k (dense, one program a work tile; docs/design/fp8.md): v_desc is over Vᵀ (B, H_KV, D, N)
    in [1, 1, D, BLOCK_N] boxes, ``descale_ptr`` the fp32 descales (B, H, 3) of q, k and v per query head,
    o_desc bf16. Otherwise descale_ptr is unused (any pointer).

    Work tiles: num_m_blocks · B · H = ``total_work``; PERSISTENT: the grid's P programs take tiles pid,
    pid + P, …, else program pid takes tile pid (P = total_work)."""
    # With an option on, P passes between tiles as the bf16 wgmma operand (32 registers a thread fewer
    # than fp32 P at the loop's edge) at D ≥ 128, where the options' terms would otherwise spill; at D = 64
    # the fp32 P of the dense kernel fits and the operand form made ptxas spill (docs/design/hopper.md).
    # Three consumers have 160 registers a thread: P as the operand too.
    P_OPERAND: gl.constexpr = (
        (HAS_WINDOW_LEFT or HAS_SOFTCAP or HAS_ALIBI or HAS_DROPOUT) and HEAD_DIM > 64
    ) or CONSUMERS == 3
    dtype: gl.constexpr = q_desc.dtype
    FP8: gl.constexpr = dtype == gl.float8e4nv
    tile_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_ROWS, HEAD_DIM], dtype)
    tile_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    # Float8's V ring holds Vᵀ tiles, [D, BLOCK_N] (_v_operand).
    v_tile: gl.constexpr = [HEAD_DIM, BLOCK_N] if FP8 else [BLOCK_N, HEAD_DIM]
    tile_v: gl.constexpr = gl.NVMMASharedLayout.get_default_for(v_tile, dtype)
    # Q_BUFS = 2 (a persistent program, :func:`q_buffers`): the producer loads the next tile's Q as soon as
    # it is done with this tile's key tiles, not once the consumers release Q.
    q_smem = gl.allocate_shared_memory(dtype, [Q_BUFS * CONSUMERS, WG_ROWS, HEAD_DIM], tile_q)
    o_smem = q_smem
    if PERSISTENT and (HEAD_DIM <= 64 or Q_BUFS == 1) and PERSISTENT != OUTPUT_IN_Q:
        # The output's own staging buffer; at D = 128 it does not fit beside two Q buffers, and each tile's
        # output is staged in its Q buffer (_attn_fwd_tile's STAGED_IN_Q); at D = 256 not beside one
        # (OUTPUT_IN_Q).
        o_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_ROWS, HEAD_DIM], tile_q)
    if FP8:
        # The bf16 output's own staging buffer (Q's float8 one cannot hold it).
        o_dtype: gl.constexpr = o_desc.dtype
        tile_o: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_ROWS, HEAD_DIM], o_dtype)
        o_smem = gl.allocate_shared_memory(o_dtype, [CONSUMERS, WG_ROWS, HEAD_DIM], tile_o)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_kv)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, v_tile[0], v_tile[1]], tile_v)
    q_bar = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # Ping-pong's two turns (consumer WG waits on its own, arrives on the other's); else one, unused.
    TURNS: gl.constexpr = 2 if PINGPONG else 1
    turn = gl.allocate_shared_memory(gl.int64, [TURNS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(TURNS):
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(Q_BUFS):
        mbarrier.init(q_bar.index(i), count=1)
        # Each consumer partition arrives once per tile.
        mbarrier.init(q_empty.index(i), count=CONSUMERS)
    # K/V slots released thread by thread (_release) at D = 64 with two consumers only: measured on an
    # H200 (s33b) +1-3 % at N = 512-1k there, 1-4 % slower at D = 128; three consumers (128 registers a
    # thread) keep the one-thread arrive, with which ptxas keeps the causal stack at 8 B (40 B otherwise).
    THREAD_RELEASE: gl.constexpr = CONSUMERS == 2 and HEAD_DIM == 64
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS * WG_THREADS if THREAD_RELEASE else CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS * WG_THREADS if THREAD_RELEASE else CONSUMERS)
    fence_async_shared()

    # The program's work tiles: pid, pid + P, … of total_work (P programs; one per tile without persistence).
    lists = (
        kv_count_ptr, kv_index_ptr, full_kv_count_ptr, full_kv_index_ptr, list_stride_b, list_stride_h,
        list_row_len,
    )  # fmt: skip
    # Division by M, by H and by the programs (_divmod): the launcher's magic numbers.
    divide_m = (num_m_blocks, m_magic, m_shift)
    divide_h = (H, h_magic, h_shift)
    divide_p = (gl.num_programs(0), p_magic, p_shift)
    sched = (
        num_m_blocks, H, seqlen_q, seqlen_k, window_left, window_right, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
        lists, gl.program_id(0), gl.num_programs(0), total_work, divide_m, divide_h, divide_p,
    )  # fmt: skip
    bars = (q_bar, q_empty, k_ready, k_empty, v_ready, v_empty)
    consumer_bars = (q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turn, THREAD_RELEASE)
    # One program a tile: the tile's indices here, before the partitions split (as captured values they
    # cost the consumers fewer registers than computed in each).
    # (The persistent partitions find their tiles themselves: any value will do.)
    work = gl.program_id(0)
    if not PERSISTENT:
        work = _work_tile(
            gl.program_id(0), sched, BLOCK_N, IS_LOCAL, HAS_WINDOW_LEFT, IS_VARLEN, SPARSE_TILES,
            SPARSE_BLOCK_M, CONSUMERS, False,
        )  # fmt: skip
        # A block past its sequence's end has nothing to do.
        if IS_VARLEN and work[3] >= work[6]:
            return
    program = (o_desc, o_ptr, lse_ptr, cu_seqlens_q_ptr, H, seqlen_q, qk_scale)
    drop_args = (rng_state_ptr, dropout_threshold, dropout_keep_frac)
    options = (
        softcap_qk, softcap_out, alibi_ptr, stride_alibi_b, aux, drop_args, descale_ptr, EXP2_SHARE, sink_ptr,
        HAS_SINK,
    )  # fmt: skip
    consumer_smem = (q_smem, o_smem, k_smem, v_smem)
    # The default partition (the kernel's num_warps = 4 warps) is the producer: one warp would be padded to a
    # warpgroup anyway, and setmaxnreg then hands the consumer warpgroups CONSUMER_REGS registers a thread.
    # Each call spells its partitions out: Gluon takes no jit function inside a tuple value, and no *args.
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_attn_fwd_producer, (
                sched, work, (q_desc, k_desc, v_desc, GROUP), (q_smem, k_smem, v_smem), bars, BLOCK_N, STAGES,
                IS_LOCAL, HAS_WINDOW_LEFT, IS_VARLEN, SPARSE_TILES, SPARSE_BLOCK_M, PERSISTENT, CONSUMERS)),
            (_attn_fwd_consumer, (
                sched, work, program, options, consumer_smem, consumer_bars, 0, HEAD_DIM, BLOCK_N, IS_LOCAL,
                HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES,
                MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT, CONSUMERS)),
            (_attn_fwd_consumer, (
                sched, work, program, options, consumer_smem, consumer_bars, 1, HEAD_DIM, BLOCK_N, IS_LOCAL,
                HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES,
                MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT, CONSUMERS)),
            (_attn_fwd_consumer, (
                sched, work, program, options, consumer_smem, consumer_bars, 2, HEAD_DIM, BLOCK_N, IS_LOCAL,
                HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES,
                MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT, CONSUMERS)),
        ], [4, 4, 4], [CONSUMER_REGS_3, CONSUMER_REGS_3, CONSUMER_REGS_3])  # fmt: skip
    else:
        gl.warp_specialize([
            (_attn_fwd_producer, (
                sched, work, (q_desc, k_desc, v_desc, GROUP), (q_smem, k_smem, v_smem), bars, BLOCK_N, STAGES,
                IS_LOCAL, HAS_WINDOW_LEFT, IS_VARLEN, SPARSE_TILES, SPARSE_BLOCK_M, PERSISTENT, CONSUMERS)),
            (_attn_fwd_consumer, (
                sched, work, program, options, consumer_smem, consumer_bars, 0, HEAD_DIM, BLOCK_N, IS_LOCAL,
                HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES,
                MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT, CONSUMERS)),
            (_attn_fwd_consumer, (
                sched, work, program, options, consumer_smem, consumer_bars, 1, HEAD_DIM, BLOCK_N, IS_LOCAL,
                HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI, P_OPERAND, STAGES, IS_VARLEN, SPARSE_TILES,
                MASK_MOD, MASK_MOD_AUX, MASK_BITS, SPARSE_BLOCK_M, HAS_DROPOUT, PERSISTENT, CONSUMERS)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])  # fmt: skip


def _descriptor(t: torch.Tensor, rows: int) -> CheckedDescriptor:
    """A TMA descriptor over (B, N, H, D) ``t`` moving [1, rows, 1, D] boxes (reads past N are zeros), or
    over packed (total, H, D) ``t`` moving [rows, 1, D] boxes (reads past total are zeros)."""
    box = (1, rows, 1, t.shape[-1]) if t.dim() == 4 else (rows, 1, t.shape[-1])
    return descriptor(t, t.shape, t.stride(), box)


def divider_arguments(name: str, divisor: int) -> dict[str, int]:
    """The kernel's ``{name}_magic`` and ``{name}_shift`` for :func:`_divmod` by ``divisor`` (1 ≤ d < 2³⁰):
    Granlund and Montgomery's division by an invariant integer, q = (umulhi(n, magic) + n) >> shift for
    0 ≤ n < 2³¹, with shift = ⌈log2 d⌉ and magic = ⌊2³² · (2^shift − d) / d⌋ + 1 < 2³², passed as the
    int32 of its bits."""
    if not 1 <= divisor < 2**30:
        raise FlashtileValueError(f"the forward's work tiles divide by {divisor}; accepted: 1 to 2**30 - 1")
    shift = (divisor - 1).bit_length()
    magic = (((1 << shift) - divisor) << 32) // divisor + 1
    return {f"{name}_magic": magic - 2**32 if magic >= 2**31 else magic, f"{name}_shift": shift}


# Called once per prepared launch (_fwd_launch is cached), so it needs no cache of its own.
def option_arguments(
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_stride: int | None,
    seqlen_q: int,
    seqlen_k: int,
    dropout_p: float = 0.0,
) -> dict[str, object]:
    """The kernel's window, softcap and ALiBi arguments, runtime values and switches, as the portable
    forward takes them (:func:`flashtile.kernels.fwd.kernel_options`): causal is the window (left, 0), an
    unlimited right side a bound of N_q; ``alibi_stride`` is the slopes' batch stride (0 for (H,)), None
    without slopes. Bounds are clamped to what changes no visible row (left ≥ N_k − 1 and right ≥ N_q − 1
    already reach every key), which keeps the kernel's index sums far from int32 overflow."""
    opts = kernel_options(
        softmax_scale, causal, window_size, softcap, alibi_stride is not None, dropout_p, False, seqlen_q
    )
    switches = opts.switches
    return dict(
        window_left=min(opts.window_left, seqlen_k),
        window_right=min(opts.window_right, seqlen_q),
        softcap_qk=opts.softcap_qk,
        softcap_out=opts.softcap_out,
        stride_alibi_b=alibi_stride or 0,
        dropout_threshold=opts.dropout_threshold,
        dropout_keep_frac=1.0 - dropout_p,
        IS_LOCAL=switches["IS_LOCAL"],
        HAS_WINDOW_LEFT=switches["HAS_WINDOW_LEFT"],
        HAS_SOFTCAP=switches["HAS_SOFTCAP"],
        HAS_ALIBI=switches["HAS_ALIBI"],
        HAS_DROPOUT=switches["HAS_DROPOUT"],
    )


def exp2_share(values: dict[str, object], forced: str = "") -> int:
    """The kernel's EXP2_SHARE: one exponential in that many of the unmasked tiles on the FMA pipes
    (:func:`_exp2_shared`), 0 for none. ``forced`` (EXP2_POLY_ENV's value) "0", "2", "4" or "8" decides;
    otherwise SOFTCAP_EXP2_SHARE under softcap up to SOFTCAP_EXP2_MAX_HEAD_DIM and none elsewhere."""
    forced = forced.strip()
    if forced:
        if forced not in ("0", "2", "4", "8"):
            raise FlashtileValueError(f"{EXP2_POLY_ENV}={forced!r}; accepted: 0, 2, 4 or 8")
        return int(forced)
    mufu_bound = values["HAS_SOFTCAP"] and values["HEAD_DIM"] <= SOFTCAP_EXP2_MAX_HEAD_DIM
    return SOFTCAP_EXP2_SHARE if mufu_bound else 0


def consumer_count(
    head_dim: int,
    seqlen_q: int,
    window_size: tuple[int, int],
    softcap: float,
    alibi: bool,
    dropout_p: float,
    varlen: bool,
    sparse: bool,
    fp8: bool = False,
) -> int:
    """Consumer warpgroups a program has (``window_size`` normalised, causal (−1, 0)). Three, in 192-row
    work tiles, at D = 64 for dense batches with no option, N_q ≥ 2048 without a mask or ≥ 8192 causal: their
    160 registers a thread hold D = 64's accumulators with P as the wgmma operand, and the third warpgroup
    hides more of the softmax. Shorter rows lose more to the 192-row tiles' padding and, in a window, to
    the key tiles a warpgroup steps through wholly masked (causal, each takes only its own;
    docs/design/hopper.md, "Three consumers at D = 64"). CONSUMERS_ENV = 2 or 3 overrides the length rule
    (3 only where D = 64 allows)."""
    if head_dim != 64 or softcap or alibi or dropout_p or varlen or sparse or fp8:
        return 2
    forced = _CONSUMERS.get("").strip()
    if forced in ("2", "3"):
        return int(forced)
    if window_size == (-1, -1):
        return 3 if seqlen_q >= THREE_CONSUMERS_MIN_ROWS else 2
    if window_size == (-1, 0):
        return 3 if seqlen_q >= THREE_CONSUMERS_MIN_ROWS_CAUSAL else 2
    return 2


def plain_tiling(
    head_dim: int, plain: bool, window_size: tuple[int, int], seqlen_q: int, seqlen_k: int
) -> configs.HopperFwdConfig:
    """The forward's tiling of a dense call (``plain``: :func:`plain_call`; ``window_size`` normalised):
    configs.hopper_fwd_config, with its short causal tiles where two consumers run the call (three take
    128-key tiles: FLASHTILE_HOPPER_CONSUMERS=3 may force them at any length)."""
    window = tuple(window_size)
    short = configs.short_causal(head_dim, plain, window == (-1, 0), seqlen_q, seqlen_k) and (
        consumer_count(head_dim, seqlen_q, window, 0.0, False, 0.0, False, False) == 2
    )
    return configs.hopper_fwd_config(head_dim, plain, short)


def plain_call(
    window_size: tuple[int, int], softcap: float, alibi: bool, dropout_p: float, varlen: bool, mods: bool,
    fp8: bool, sink: bool,
) -> bool:  # fmt: skip
    """Whether a forward call is plain attention, dense or causal (``window_size`` normalised, causal
    (−1, 0)) with no option, packed batch, block mask, float8 input or sink: what
    :func:`flashtile.kernels.configs.hopper_fwd_config`'s ``plain`` tiling was timed on."""
    return tuple(window_size) in ((-1, -1), (-1, 0)) and not (
        softcap or alibi or dropout_p or varlen or mods or fp8 or sink
    )


def runs_persistent(values: dict[str, object]) -> bool:
    """Whether a launch whose kernel arguments ``values`` are takes the persistent grid: work tiles of about
    equal cost (:func:`even_work`) on dense batches with no block mask (softcap, ALiBi and dropout
    included, but dropout at D = 256: each work tile sets up its own slope and counters), whose Q, output
    and K/V tiles fit PERSISTENT_SMEM, at D = 64 without an option or with at most PERSISTENT_MAX_KEYS keys
    a tile."""
    # Packed batches' tiles differ in cost; a block mask's lists set each tile's.
    uneven = ("IS_VARLEN", "SPARSE_TILES")
    if values["HAS_DROPOUT"] and values["HEAD_DIM"] > 128:
        # Dropout at D = 256 spilled inside the key loops on this grid (sm_90: a 96 B frame and 74 local
        # accesses in a loop, 422 with a window, softcap and ALiBi beside it).
        return False
    # Q's buffers and the output's staging buffer (as the kernel allocates them: two Q and one output at
    # D = 64; at D = 128 two Q, or one Q and one output), or at D = 256 one Q buffer staging the output
    # (output_in_q).
    row_tiles = 3 if values["HEAD_DIM"] <= 64 else 2
    fits = _tiles_bytes(values, row_tiles) <= PERSISTENT_SMEM or output_in_q(values)
    # With softcap, ALiBi or dropout at D = 64 too: their forward at N = 4k without a mask read −1.6 % to
    # +3.3 % against one program a tile (H200), 2k +1-4 %, causal in pairs +5-47 % at 1k-4k.
    option = values["HAS_SOFTCAP"] or values["HAS_ALIBI"] or values["HAS_DROPOUT"]
    few_keys = (values["HEAD_DIM"] <= 64 and not option) or keys_per_tile(values) <= PERSISTENT_MAX_KEYS
    return even_work(values) and not any(values[switch] for switch in uneven) and fits and few_keys


def _tiles_bytes(values: dict[str, object], row_tiles: int) -> int:
    """Shared memory of ``row_tiles`` Q or output buffers (CONSUMERS · WG_ROWS rows each) and the K and V
    rings, 2-byte."""
    head_dim, block_n, stages = values["HEAD_DIM"], values["BLOCK_N"], values["STAGES"]
    return 2 * (row_tiles * values["CONSUMERS"] * WG_ROWS.value + 2 * stages * block_n) * head_dim


def output_in_q(values: dict[str, object]) -> bool:
    """Whether a persistent program stages each tile's output in its one Q buffer and gives the buffer back
    once the store has read it (the kernel's PERSISTENT = OUTPUT_IN_Q): where a second row buffer does not
    fit beside the ring (D = 256), the producer loads the next tile's first K/V tiles before its Q."""
    return values["HEAD_DIM"] > 64 and _tiles_bytes(values, 2) > PERSISTENT_SMEM >= _tiles_bytes(values, 1)


def persistent_mode(values: dict[str, object], persistent: bool) -> int:
    """The kernel's PERSISTENT: 0 one program a work tile, 1 persistent, OUTPUT_IN_Q persistent with the
    output staged in the one Q buffer (:func:`output_in_q`)."""
    if not persistent:
        return 0
    return OUTPUT_IN_Q.value if output_in_q(values) else 1


def even_work(values: dict[str, object]) -> bool:
    """Whether the persistent grid's programs get about as many keys each: plain attention, or a sliding
    window whose span (left + right + a tile's rows) is at most half of N_k (every work tile visits about
    as many keys), or causal (a window bounded on the right only), whose row blocks the kernel pairs
    longest with shortest (:func:`paired`). A window bounded on the left only keeps one program a tile."""
    if not values["HAS_WINDOW_LEFT"]:
        return True
    span = _window_span(values)
    return span is not None and 2 * span <= values["seqlen_k"]


def q_buffers(values: dict[str, object]) -> int:
    """Q's buffers in a program: two on the persistent grid at D = 64, and at D = 128 up to N_k = 1024
    (its output then staged in Q's buffer), else one. Kernel time against one buffer (docs/design/hopper.md,
    "Two Q buffers"): D = 64 4-13 % faster below 2k-4k and within ±1.5 % above (H200); D = 128 3-15 %
    faster up to 1k, 2-5 % slower at 2k-4k (H100)."""
    if not values["PERSISTENT"] or output_in_q(values):
        return 1
    return 2 if values["HEAD_DIM"] <= 64 or values["seqlen_k"] <= Q_BUFS_MAX_KEYS_D128 else 1


def pingpong(values: dict[str, object], forced: str = "") -> bool:
    """Whether the two consumers issue their wgmmas in turn (the kernel's PINGPONG): with softcap, ALiBi or
    dropout, whose softmax no longer hides under the wgmmas when both consumers run it at once
    (docs/design/hopper.md, "Ping-pong"). ``forced`` (PINGPONG_ENV's value) 0 or 1 overrides that; three
    consumers never."""
    if values["CONSUMERS"] != 2:
        return False
    forced = forced.strip()
    if forced in ("0", "1"):
        return forced == "1"
    return bool(values["HAS_SOFTCAP"] or values["HAS_ALIBI"] or values["HAS_DROPOUT"])


def paired(values: dict[str, object]) -> bool:
    """Whether a persistent launch deals out pairs of row blocks (the kernel's PAIRED, ``_paired_tile``):
    causal, or any window bounded on the right only, where a row block's keys grow with its rows."""
    return bool(values["IS_LOCAL"]) and not values["HAS_WINDOW_LEFT"]


def persistent_programs(values: dict[str, object], sms: int) -> int:
    """The persistent grid's programs: one an SM, or fewer where there are fewer work tiles, or under
    :func:`paired` fewer units (two row blocks). 0: too few paired units to fill every SM, where
    one program a tile runs twice as many programs at once."""
    if not paired(values):
        return min(values["total_work"], sms)
    m_blocks = values["num_m_blocks"]
    batch_heads = values["total_work"] // m_blocks
    units = batch_heads // 2 * m_blocks + batch_heads % 2 * ((m_blocks + 1) // 2)
    return sms if units >= sms else 0


def keys_per_tile(values: dict[str, object]) -> int:
    """About how many keys one work tile visits: a sliding window's span, half of N_k on average where the
    row blocks are :func:`paired` (causal), else N_k. At D = 128 causal on an H100 (docs/design/hopper.md),
    paired against one program a tile: 6-11 % faster up to N = 4k, 2 % at 8k, 5 % slower at 16k."""
    span = _window_span(values)
    if span is not None:
        return min(span, values["seqlen_k"])
    return values["seqlen_k"] // 2 if paired(values) else values["seqlen_k"]


def _window_span(values: dict[str, object]) -> int | None:
    """The keys a work tile's rows reach in a window bounded on both sides (left + right + the tile's
    rows), or None without such a window."""
    if not (values["IS_LOCAL"] and values["HAS_WINDOW_LEFT"]):
        return None
    return values["window_left"] + values["window_right"] + values["CONSUMERS"] * WG_ROWS.value


# A block mask as the launches take it: (query block, key block, (batch stride, head stride, row length) of
# its lists, the mask_mod of its partial blocks or None, whether that takes aux_tensors, whether the kernels
# read the mask's bits instead).
Sparse = tuple[int, int, tuple[int, int, int], object, bool, bool]


def sparse_key(km: KernelMods, side: str, bits: bool) -> Sparse | None:
    """What the launches take from the kernels' view of the mods (None without a block mask): its ``side``
    lists' layout ("kv" for the forward, "q" for the backward) and its mask function, or with ``bits``
    (flashtile.kernels._mask_bits.reads_bits) the mask's bits in its place."""
    if km.block_mask is None:
        return None
    if bits:
        return (*km.block_mask.block_size, km.strides(side), None, False, True)
    mod = km.switches["MASK_MOD"], km.switches["MASK_MOD_AUX"]
    return (*km.block_mask.block_size, km.strides(side), *mod, False)


def sparse_aux(km: KernelMods, sparse: Sparse | None) -> tuple[torch.Tensor, ...] | None:
    """The kernels' ``aux``: the mask bits' tensors when they read them, else the call's aux_tensors."""
    if sparse is not None and sparse[-1]:
        bits = km.block_mask.bits
        return bits.ids, bits.words, bits.meta
    return km.aux


def sparse_arguments(sparse: Sparse | None, tile: int, side: str = "kv") -> dict[str, object]:
    """A kernel's block-mask arguments for ``sparse``, or for none (SPARSE_TILES = 0). ``side`` "kv": the
    forward, walking listed key blocks in tiles of ``tile`` keys (its SPARSE_BLOCK_M the query block);
    "q": the backward, walking listed query blocks in tiles of ``tile`` queries (SPARSE_BLOCK_N the key
    block)."""
    kept = "SPARSE_BLOCK_M" if side == "kv" else "SPARSE_BLOCK_N"
    if sparse is None:
        return {
            "list_stride_b": 0, "list_stride_h": 0, "list_row_len": 0, kept: 1, "SPARSE_TILES": 0,
            "MASK_MOD": None, "MASK_MOD_AUX": False, "MASK_BITS": False,
        }  # fmt: skip
    block_q, block_k, (stride_b, stride_h, row_len), mask_mod, takes_aux, bits = sparse
    listed, other = (block_k, block_q) if side == "kv" else (block_q, block_k)
    return {
        "list_stride_b": stride_b, "list_stride_h": stride_h, "list_row_len": row_len, kept: other,
        "SPARSE_TILES": listed // tile, "MASK_MOD": mask_mod, "MASK_MOD_AUX": takes_aux, "MASK_BITS": bits,
    }  # fmt: skip


# The tensors of a launch, in the kernel's parameter order.
FWD_POINTERS = (
    "q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr", "alibi_ptr", "o_ptr", "cu_seqlens_q_ptr",
    "cu_seqlens_k_ptr", "kv_count_ptr", "kv_index_ptr", "full_kv_count_ptr", "full_kv_index_ptr", "aux",
    "rng_state_ptr", "descale_ptr", "sink_ptr",
)  # fmt: skip


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
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_stride: int | None,
    block_n: int,
    stages: int,
    varlen: tuple[int, int, int, int] | None = None,
    sparse: Sparse | None = None,
    dropout_p: float = 0.0,
    persistent: bool = True,
    consumers: int = 2,
    pingpong_forced: str = "",
    fp8: bool = False,
    exp2_forced: str = "",
    sink: bool = False,
) -> KernelLaunch:
    """Dense: ``seqlen_q/k`` are N_q, N_k. Varlen: ``varlen`` is (total_q, total_k, grid_seqlen(max_seqlen_q),
    grid_seqlen(max_seqlen_k)) and ``seqlen_q/k`` are unused (pass 0): the work tiles cover the rounded
    longest sequence and the window bounds are clamped by it (_layout.grid_seqlen keeps the launches few).
    ``sparse``: a block mask's :data:`Sparse` (:func:`sparse_key`), or None. ``persistent``: dense batches
    without a block mask (:func:`runs_persistent`) at D = 64 or N_k ≤ PERSISTENT_MAX_KEYS run on as many
    programs as SMs (or work tiles, if fewer), else one program a work tile (PERSISTENT_ENV).
    ``pingpong_forced``: PINGPONG_ENV's value (:func:`pingpong`). ``fp8``: float8 inputs (one program a
    work tile: the bf16 output's staging buffer needs its own shared memory). ``exp2_forced``:
    EXP2_POLY_ENV's value (:func:`exp2_share`). ``sink``: a learnable sink (HAS_SINK)."""
    if varlen is None:
        totals, longest = (seqlen_q, seqlen_k), (seqlen_q, seqlen_k)
    else:
        totals, longest = varlen[:2], varlen[2:]
    num_m_blocks = cdiv(longest[0], consumers * WG_ROWS.value)
    total_work = num_m_blocks * batch * heads
    values = dict(
        seqlen_q=totals[0], seqlen_k=totals[1], num_m_blocks=num_m_blocks, total_work=total_work, H=heads,
        GROUP=heads // heads_kv, **divider_arguments("m", num_m_blocks), **divider_arguments("h", heads),
        qk_scale=softmax_scale * LOG2_E, HEAD_DIM=head_dim, BLOCK_N=block_n, STAGES=stages,
        IS_VARLEN=varlen is not None, CONSUMERS=consumers,
        **option_arguments(softmax_scale, causal, window_size, softcap, alibi_stride, *longest, dropout_p),
        **sparse_arguments(sparse, block_n), HAS_SINK=sink,
    )  # fmt: skip
    values["EXP2_SHARE"] = exp2_share(values, exp2_forced)
    # One program fits an SM (its shared memory and 384 threads of up to 240 registers).
    programs = persistent_programs(values, configs.multiprocessor_count(device))
    persistent = persistent and not fp8 and runs_persistent(values) and programs > 0
    values["PERSISTENT"] = persistent_mode(values, persistent)
    values["Q_BUFS"] = q_buffers(values)
    values["PINGPONG"] = pingpong(values, pingpong_forced)
    grid = (programs if persistent else total_work,)
    # The causal slot map divides a slot by the persistent grid's programs.
    values.update(divider_arguments("p", programs if persistent else 1))
    return KernelLaunch(attn_fwd_kernel, grid, device, FWD_POINTERS, values, {"num_warps": NUM_WARPS})


def launch_for(
    q: torch.Tensor,
    k: torch.Tensor,
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    slopes: torch.Tensor | None,
    dropout_p: float,
    varlen: tuple[int, int, int, int] | None,
    sparse: Sparse | None,
    cfg: configs.HopperFwdConfig,
    fp8: bool = False,
    sink: bool = False,
) -> KernelLaunch:
    """The prepared launch of a call :func:`attn_fwd` runs (its arguments as there, the scale positive;
    dense ``seqlen_q/k`` N_q and N_k, 0 for a packed batch, whose ``varlen`` is :func:`_fwd_launch`'s;
    ``sink``: a learnable sink)."""
    head_dim = q.shape[-1]
    return _fwd_launch(
        q.device, batch, seqlen_q, seqlen_k, q.shape[-2], k.shape[-2], head_dim, softmax_scale, causal,
        tuple(window_size), softcap, alibi_stride_b(slopes), cfg.BLOCK_N, cfg.STAGES, varlen, sparse,
        dropout_p, _PERSISTENT.get("1") != "0",
        consumer_count(
            head_dim, seqlen_q if varlen is None else 0, tuple(window_size), softcap, slopes is not None,
            dropout_p, varlen is not None, sparse is not None, fp8,
        ),
        _PINGPONG.get(""),
        fp8,
        _EXP2_POLY.get(""),
        sink,
    )  # fmt: skip


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
    descale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The portable launcher's contract (docs/design/options.md) for calls the fast path supports
    (:func:`flashtile.kernels.hopper.support.fwd_unsupported_reason` is None: no score_mod, V's head dim
    Q's): q (B, N_q, H, D), k/v (B, N_k, H_KV, D) with N_q, N_k ≥ 1, or varlen
    (cu_seqlens_q/k int32 (B + 1,), max_seqlen_q/k) q (total_q, H, D), k/v (total_k, H_KV, D) giving out
    (total_q, H, D) and lse (H, total_q);
    ``window_size`` normalised (causal is (−1, 0), −1 unlimited), ``softcap`` ≥ 0 (0 off), ``alibi_slopes``
    None or fp32 (H,) / (B, H) on q's device. Returns ``out`` (B, N_q, H, D) in q's dtype and ``lse``
    (B, H, N_q) float32, natural log: those of the portable forward, a row that sees no key giving out 0 and
    lse −inf. Float8 e4m3 q, k, v (dense, no ALiBi, dropout or mods) take ``descale`` (B, H_KV, 3) fp32, as
    the portable forward does (docs/design/fp8.md); ``out`` is then bfloat16. ``learnable_sink``: None or
    fp32 (H,), folded into each row's softmax (the LSE includes it, as the portable forward's)."""
    heads, head_dim = q.shape[-2], q.shape[-1]
    fp8 = descale is not None
    out = torch.empty(q.shape, dtype=torch.bfloat16 if fp8 else q.dtype, device=q.device)
    if cu_seqlens_q is not None:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, 0, 0
        total_q, total_k = q.shape[0], k.shape[0]
        lse = torch.empty((heads, total_q), dtype=torch.float32, device=q.device)
        if total_q == 0 or batch == 0 or max_seqlen_q == 0:
            return out, lse
        if total_k == 0:
            # As the portable forward: no row sees a key (and a TMA map over zero rows is not valid).
            return out.zero_(), lse.fill_(-math.inf)
        varlen = (total_q, total_k, grid_seqlen(max_seqlen_q), grid_seqlen(max_seqlen_k))
    else:
        batch, seqlen_q = q.shape[:2]
        seqlen_k = k.shape[1]
        lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
        varlen = None
    if fp8:
        # Per query head (the kernel reads them at b·H + h), and Vᵀ (float8 wgmma reads B K-major only).
        descale = descale.repeat_interleave(heads // k.shape[-2], dim=1).contiguous()
        v = transposed_fp8(v)
    else:
        q, softmax_scale = positive_scale(q, softmax_scale)
    plain = plain_call(
        window_size, softcap, alibi_slopes is not None, dropout_p, cu_seqlens_q is not None, mods is not None,
        fp8, learnable_sink is not None,
    )  # fmt: skip
    cfg = config or plain_tiling(head_dim, plain, window_size, seqlen_q, seqlen_k)
    slopes = None if alibi_slopes is None else alibi_slopes.contiguous()
    km = NO_MODS if mods is None else kernel_mods(mods)
    sparse = sparse_key(km, "kv", reads_bits(mods))
    lists = (lse,) * 4
    if sparse is not None:
        lists = km.list_args("kv", False) + km.list_args("kv", True)
    launch = launch_for(
        q, k, batch, seqlen_q, seqlen_k, softmax_scale, causal, window_size, softcap, slopes, dropout_p,
        varlen, sparse, cfg, fp8, learnable_sink is not None,
    )  # fmt: skip
    q_desc = _descriptor(q, WG_ROWS.value)
    if fp8:
        # Vᵀ (B, H_KV, D, N) in [D, BLOCK_N] boxes, its shape stopping at N (the rows' padding unread).
        batch_, heads_kv, dim, _ = v.shape
        shape = (batch_, heads_kv, dim, seqlen_k)
        v_desc = descriptor(v, shape, v.stride(), (1, 1, dim, cfg.BLOCK_N))
    else:
        v_desc = _descriptor(v, cfg.BLOCK_N)
    if varlen is None:
        o_desc, o_ptr, cu_q, cu_k = _descriptor(out, WG_ROWS.value), lse, lse, lse
    else:
        # The output is stored through pointers (kernel docstring); any descriptor of its type will do.
        o_desc, o_ptr, cu_q, cu_k = q_desc, out, cu_seqlens_q, cu_seqlens_k
    launch(
        q_desc, _descriptor(k, cfg.BLOCK_N), v_desc, o_desc, lse, lse if slopes is None else slopes, o_ptr,
        cu_q, cu_k, *lists, sparse_aux(km, sparse), lse if rng_state is None else rng_state,
        lse if descale is None else descale, lse if learnable_sink is None else learnable_sink.contiguous(),
    )  # fmt: skip
    return out, lse
