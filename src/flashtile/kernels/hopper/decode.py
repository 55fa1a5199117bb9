"""Hopper (sm_90) split-KV decode kernel in Gluon: the portable decode kernel's work, with K/V tiles
brought in by TMA.

Each program does what one program of :mod:`flashtile.kernels.decode` does — (batch b, KV head, split,
block of packed query rows), the same splits of the visible keys, the same partial ``(out, lse)`` layout
for :func:`flashtile.kernels.combine.attn_combine` — but its K and V tiles arrive by TMA into a
STAGES-deep shared-memory ring, each slot guarded by one "ready" mbarrier. One 4-warp partition both
issues the copies and computes: after tile t is folded in, a thread barrier tells every warp is done
reading its slot, and the copy of tile t + STAGES goes into it. A TMA copy is one instruction for a whole
[rows, D] box where the portable kernel issues a 16-byte ``cp.async`` per thread and row, so the ring can
be deeper for the same instructions. The dots are ``mma.sync`` (``mma_v2``): a decode tile has 16–64
query rows, below a warpgroup's 64-row wgmma, and the kernel is bound by memory, not by the dots.

Caches are read through rank-4 descriptors, boxes [1, rows, 1, D]: a contiguous cache
``(B_cache, S_max, H_KV, D)`` one BLOCK_N-row box a tile at ``[cache row, leftpad + key, KV head, 0]``
(rows past S_max read as zeros); a paged cache ``(num_pages, page_size, H_KV, D)`` one box a page part,
``min(page_size, BLOCK_N)`` rows at ``[page, slot % page_size, KV head, 0]`` (for parts smaller than a
tile whose rows pass the 128-byte swizzle, one box a 64-column block: :func:`_part_box`), the page looked
up in the block table (clamped to the sequence's slots and to the cache's pages, so a bad entry reads a
wrong page, never outside the cache). A tile may hold slots past the sequence's last key (whatever they
hold, NaN included): their scores are masked and, in masked steps, their V rows are zeroed in registers
before the P·V dot, so ``0·NaN`` never happens. Design and measurements: docs/design/decode.md, "TMA decode".
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from flashtile.kernels import configs
from flashtile.kernels._decode_program import program_coordinates, sequence_keys
from flashtile.kernels._layout import launch as launch_kernel
from flashtile.kernels._masking import visible_span
from flashtile.kernels.hopper.descriptors import CheckedDescriptor, descriptor
from flashtile.kernels.hopper.fwd import _row_terms, _softmax_step
from flashtile.kernels.hopper.support import DTYPES, _tma_unreadable, device_unsupported_reason

LN_2 = gl.constexpr(math.log(2.0))
LOG2_E_C = gl.constexpr(math.log2(math.e))
NUM_WARPS = 4
# Head dims of the kernel: a TMA box row of D elements and a power-of-two dot.
HEAD_DIMS = (64, 128, 256)
# Rows wider than the 128-byte swizzle land in shared memory as column blocks of 128 bytes (one TMA copy
# each), so a slice of a tile's rows is not one stretch of memory: pages smaller than a tile are loaded a
# column block at a time (_part_box; a box of whole rows into a row slice read the wrong rows at D = 128
# with pages of 16 in the first GPU run).
SWIZZLE_BYTES = 128
# From this many cache slots a small batch is split for one program an SM, not two: at batch 1 and a 128k
# cache, H100, one program an SM ran 1-3 % faster than cuDNN in every GQA ratio and steady from run to
# run, two programs an SM 1-3 % slower in their fast runs and 10-18 % in their slow ones (the "two speeds"
# of docs/design/decode.md); below 32k two programs an SM were as fast or faster (docs/design/decode.md,
# "TMA decode").
LONG_CACHE_KEYS = 32768
# Below that, one program an SM where its splits fill ONE_A_SM_FILL of the SMs or more with this many keys
# a split. At batch 1 on an H100, one an SM with 4 of 132 SMs idle ran faster than two an SM on every SM:
# GQA 1 (32 programs a split) 28.9 against 30.2 µs at 4k and 95.4 against 98.9 at 16k; GQA 4 (8) 11.5
# against 12.3 at 4k and 29.6 against 30.6 at 16k; on an H200 (where one an SM takes 3 tiles) as fast or
# 1 % faster. GQA 8 at 16k (33 splits of 496 keys fill every SM) as before; a split of 124 keys (GQA 8 at
# 4k) keeps two an SM, and so do pages smaller than a tile (pages of 16 at batch 1, GQA 4, 16k ran 32.5
# against 25.1 µs on the H200 one an SM). The fifteenth session's measurements, on the kernel of the time,
# had chosen two (docs/design/decode.md, "One program an SM at batch 1").
MIN_KEYS_ONE_A_SM = 256
ONE_A_SM_FILL = 0.95
# Where one program an SM is planned at D = 128 on a GPU whose memory peaks at DEEP_RING_BANDWIDTH bytes a
# second or more, its ring holds 3 tiles, not 2: the copies one program keeps in flight are all its SM
# has, and more bandwidth needs more bytes in flight. At batch 1, one query token and 64k-128k caches, 3
# tiles ran 3-8 % faster than 2 on an H200 (4.8 TB/s) and 2-3 % slower on an H100 (3.35 TB/s)
# (docs/design/decode.md, "A deeper ring for one program an SM").
ONE_A_SM_STAGES = 3
DEEP_RING_BANDWIDTH = 4e12
# Launches of more than one and at most two waves of two programs an SM take 3 tiles too, on any GPU: 512
# programs on 132 SMs (batch 64 at GQA 4, batch 16 at GQA 1) ran 7 % faster on an H100 and 7-13 % on an
# H200 (0.92-0.98x and 0.88-1.00x cuDNN before, 0.97-0.99x and 1.00-1.01x after), where one wave (256
# programs) and four to eight (1024-2048) ran 0-3 % slower against cuDNN on the H200 and as fast on the
# H100 (docs/design/decode.md, "One program an SM at batch 1").
DEEP_RING_WAVES = (1.0, 2.0)


def _warps_m(block_m: int) -> int:
    """Warps along the packed rows of the mma layout: 16 rows a warp, the rest along the keys."""
    return max(1, min(NUM_WARPS, block_m // 16))


@gluon.jit
def _box_view(buf, desc):
    """A 2-D [rows, D] shared tile seen as the [1, rows, 1, D] box ``desc`` moves (same bytes)."""
    return buf._reinterpret(buf.dtype, [1, buf.shape[0], 1, buf.shape[1]], desc.layout)


@gluon.jit
def _part_index(BLOCK_N: gl.constexpr, SUB_ROWS: gl.constexpr):
    """0, 1, … for the page parts of a tile (one box each)."""
    return gl.arange(0, BLOCK_N // SUB_ROWS, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))


@gluon.jit
def _tile_pages(
    first_key, seq, BLOCK_N: gl.constexpr, SUB_ROWS: gl.constexpr, PAGE_SIZE: gl.constexpr,
    IS_PAGED: gl.constexpr,
):  # fmt: skip
    """The pages of keys [first_key, first_key + BLOCK_N) (paged caches; 0 for a contiguous one): one page
    number for a tile inside a page, a vector of one per part (SUB_ROWS rows) otherwise. Each slot is
    clamped into [0, last slot] (a part past the sequence looks up its last page: masked) and each page into
    the cache (a bad block-table entry reads a wrong page, never outside the cache). Issued a tile ahead of
    its copies, so the lookup's latency hides under the wait and the dots of the tile before."""
    leftpad, last_slot, _, _, bt_row, num_blocks = seq
    pages = 0
    if IS_PAGED:
        if SUB_ROWS == BLOCK_N:
            slots = gl.maximum(gl.minimum(leftpad + first_key, last_slot), 0)
        else:
            slots = leftpad + first_key + _part_index(BLOCK_N, SUB_ROWS) * SUB_ROWS
            slots = gl.maximum(gl.minimum(slots, last_slot), 0)
        pages = gl.minimum(gl.maximum(gl.load(bt_row + slots // PAGE_SIZE), 0), num_blocks - 1)
    return pages


@gluon.jit
def _part_box(buf, part, column_block, desc, SUB_ROWS: gl.constexpr):
    """Rows [part·SUB_ROWS, (part + 1)·SUB_ROWS) of a [BLOCK_N, D] tile, columns of ``column_block``, as
    the box ``desc`` moves ([1, SUB_ROWS, 1, COLUMNS]). A tile whose rows pass the swizzle lies in shared
    memory as D / COLUMNS blocks of [BLOCK_N, COLUMNS] (module docstring), each a box's worth of columns:
    a row slice of one block is one stretch of memory."""
    COLUMNS: gl.constexpr = desc.block_type.shape[3]
    block = buf
    if buf.shape[1] != COLUMNS:
        # (A stack of tiles takes the layout of one, as the rings' allocations do.)
        blocks_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([buf.shape[0], COLUMNS], buf.dtype)
        blocks = buf._reinterpret(buf.dtype, [buf.shape[1] // COLUMNS, buf.shape[0], COLUMNS], blocks_layout)
        block = blocks.index(column_block)
    return _box_view(block.slice(part * SUB_ROWS, SUB_ROWS), desc)


@gluon.jit
def _issue_tile(
    k_desc, v_desc, k_buf, v_buf, bar, first_key, pages, seq, BLOCK_N: gl.constexpr, SUB_ROWS: gl.constexpr,
    PAGE_SIZE: gl.constexpr, IS_PAGED: gl.constexpr,
):  # fmt: skip
    """Start the TMA copies of keys [first_key, first_key + BLOCK_N) of the program's sequence and KV head
    into ``k_buf`` / ``v_buf``, completing ``bar``. ``seq`` = (leftpad, last slot, cache row, KV head,
    block-table row, cache pages); ``pages``: :func:`_tile_pages` of the tile. Paged: one box of SUB_ROWS
    rows a page part, and a column block (:func:`_part_box`) where a part is a row slice of a wide tile."""
    leftpad, last_slot, b_cache, h_kv, _, _ = seq
    COLUMNS: gl.constexpr = k_desc.block_type.shape[3]
    BOXES: gl.constexpr = (BLOCK_N // SUB_ROWS) * (k_buf.shape[1] // COLUMNS)
    mbarrier.expect(bar, 2 * BOXES * k_desc.block_type.nbytes)
    if IS_PAGED:
        for part in gl.static_range(BLOCK_N // SUB_ROWS):
            if SUB_ROWS == BLOCK_N:
                page = pages
            else:
                page = gl.sum(gl.where(_part_index(BLOCK_N, SUB_ROWS) == part, pages, 0), axis=0)
            slot = gl.maximum(gl.minimum(leftpad + first_key + part * SUB_ROWS, last_slot), 0)
            within = slot % PAGE_SIZE
            for column_block in gl.static_range(k_buf.shape[1] // COLUMNS):
                at = [page, within, h_kv, column_block * COLUMNS]
                k_part = _part_box(k_buf, part, column_block, k_desc, SUB_ROWS)
                v_part = _part_box(v_buf, part, column_block, v_desc, SUB_ROWS)
                tma.async_copy_global_to_shared(k_desc, at, bar, k_part)
                tma.async_copy_global_to_shared(v_desc, at, bar, v_part)
    else:
        row = leftpad + first_key
        tma.async_copy_global_to_shared(k_desc, [b_cache, row, h_kv, 0], bar, _box_view(k_buf, k_desc))
        tma.async_copy_global_to_shared(v_desc, [b_cache, row, h_kv, 0], bar, _box_view(v_buf, v_desc))


@gluon.jit
def _decode_steps(
    acc, m_i, l_i, q, k_smem, v_smem, ready, descs, seq, split_start, t_lo, t_hi, n_tiles, n_k, rows, scores,
    MASKED: gl.constexpr, IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, BLOCK_N: gl.constexpr, SUB_ROWS: gl.constexpr, PAGE_SIZE: gl.constexpr,
    IS_PAGED: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """Fold the split's key tiles t_lo … t_hi − 1 (tile t holds keys split_start + t·BLOCK_N on, in ring
    slot t % STAGES) into (acc, m, ℓ); once a slot is read, start the copy of tile t + STAGES into it.
    MASKED steps apply the window and the sequence's end and zero the V rows of keys ≥ n_k."""
    k_desc, v_desc = descs
    mma: gl.constexpr = acc.type.layout
    b_operand: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    dtype: gl.constexpr = k_smem.dtype
    for t in range(t_lo, t_hi):
        slot = t % STAGES
        refill_key = split_start + (t + STAGES) * BLOCK_N
        refill_pages = _tile_pages(refill_key, seq, BLOCK_N, SUB_ROWS, PAGE_SIZE, IS_PAGED)
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        n0 = split_start + t * BLOCK_N
        k_t = k_smem.index(slot).permute((1, 0)).load(b_operand)
        s = mma_v2(q, k_t, gl.zeros([q.shape[0], BLOCK_N], gl.float32, mma))
        p, m_i, l_i, alpha = _softmax_step(
            s, m_i, l_i, n0, rows, scores, None, MASKED, IS_LOCAL, HAS_WINDOW_LEFT, HAS_SOFTCAP, HAS_ALIBI,
            BLOCK_N, None, None, False, 1, 1, False,
        )  # fmt: skip
        if MASKED:
            # Slots past the sequence may hold anything, NaN included: their P is 0, and 0·NaN must not be.
            v = v_smem.index(slot).load(rows_layout)
            keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rows_layout))
            v = gl.where(gl.expand_dims(keys < n_k, 1), v, gl.zeros_like(v))
            v = gl.convert_layout(v, b_operand)
        else:
            v = v_smem.index(slot).load(b_operand)
        acc = acc * gl.expand_dims(alpha, 1)
        acc = mma_v2(gl.convert_layout(p.to(dtype), p_operand), v, acc)
        # Every warp has read the slot: it may take the tile STAGES ahead.
        gl.thread_barrier()
        if t + STAGES < n_tiles:
            fence_async_shared()
            _issue_tile(
                k_desc, v_desc, k_smem.index(slot), v_smem.index(slot), ready.index(slot), refill_key,
                refill_pages, seq, BLOCK_N, SUB_ROWS, PAGE_SIZE, IS_PAGED,
            )  # fmt: skip
    return acc, m_i, l_i


@gluon.jit
def _launch_dependents():
    """``griddepcontrol.launch_dependents``: the combine grid may launch now and wait on this one."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit(do_not_specialize=["window_left", "window_right"])
def attn_decode_tma_kernel(
    q_ptr, k_desc, v_desc, o_ptr, lse_ptr, seqlens_ptr, block_table_ptr, batch_idx_ptr, leftpad_ptr,
    alibi_ptr,
    stride_qb, stride_qn, stride_qh, stride_os, stride_ob, stride_on, stride_oh,
    stride_ls, stride_lb, stride_lh, stride_ln, stride_bt, stride_alibi_b,
    seqlen_q, capacity, num_blocks, num_m_blocks, num_splits, H_KV,
    qk_scale, window_left, window_right, softcap_qk, softcap_out,
    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, SUB_ROWS: gl.constexpr, PAGE_SIZE: gl.constexpr, WARPS_M: gl.constexpr,
    IS_PAGED: gl.constexpr, HAS_BATCH_IDX: gl.constexpr, HAS_LEFTPAD: gl.constexpr,
    IS_LOCAL: gl.constexpr, HAS_WINDOW_LEFT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, EARLY_COMBINE: gl.constexpr,
):  # fmt: skip
    """The portable ``attn_decode_kernel``'s program (kernels/decode.py) with TMA loads: see the module
    docstring. The arguments are that kernel's, with descriptors for the caches."""
    if EARLY_COMBINE:
        _launch_dependents()
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[WARPS_M, gl.num_warps() // WARPS_M], instr_shape=[16, 8]
    )
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    row_of: gl.constexpr = gl.SliceLayout(1, mma)
    col_of: gl.constexpr = gl.SliceLayout(0, mma)
    dtype: gl.constexpr = k_desc.dtype
    tile_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_kv)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_kv)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()

    m_block, split, h_kv, b = program_coordinates(gl.program_id(0), num_m_blocks, num_splits, H_KV)
    leftpad, n_k = sequence_keys(seqlens_ptr, leftpad_ptr, b, capacity, HAS_LEFTPAD)

    diag_offset = n_k - seqlen_q
    lo_diag = diag_offset - window_left
    hi_diag = diag_offset + window_right
    i_first = m_block * BLOCK_M // GROUP
    i_last = gl.minimum(m_block * BLOCK_M + BLOCK_M - 1, GROUP * seqlen_q - 1) // GROUP
    # The portable kernel's split of the visible keys: the tiles [start, end) the rows reach, those in
    # [unmasked_start, unmasked_end) seen whole by every row (kernels/_masking.py's visible_span, whose
    # scalar arithmetic compiles in Gluon too).
    start = 0
    unmasked_start = 0
    unmasked_end = n_k // BLOCK_N * BLOCK_N
    end = n_k
    if IS_LOCAL:
        start, unmasked_start, unmasked_end, end = visible_span(
            i_first, i_last + 1, n_k, lo_diag if HAS_WINDOW_LEFT else None, hi_diag, BLOCK_M, BLOCK_N
        )
    tiles_per_split = gl.cdiv(gl.cdiv(gl.maximum(end - start, 0), BLOCK_N), num_splits)
    split_start = gl.minimum(start + split * tiles_per_split * BLOCK_N, end)
    split_end = gl.minimum(split_start + tiles_per_split * BLOCK_N, end)
    mid_start = gl.minimum(gl.maximum(unmasked_start, split_start), split_end)
    mid_end = mid_start + gl.maximum(gl.minimum(unmasked_end, split_end) - mid_start, 0) // BLOCK_N * BLOCK_N
    n_tiles = gl.cdiv(split_end - split_start, BLOCK_N)

    b_cache = b
    if HAS_BATCH_IDX:
        b_cache = gl.minimum(gl.maximum(gl.load(batch_idx_ptr + b), 0), num_blocks - 1)
    # (A contiguous cache has no block table: any int32 pointer stands in for its row.)
    bt_row = seqlens_ptr
    if IS_PAGED:
        bt_row = block_table_ptr + b.to(gl.int64) * stride_bt
    seq = (leftpad, gl.maximum(leftpad + split_end - 1, 0), b_cache, h_kv, bt_row, num_blocks)
    descs = (k_desc, v_desc)
    # The ring's first tiles; each tile's pages are looked up before the copies of the tile before are
    # issued, so the lookups overlap.
    next_pages = _tile_pages(split_start, seq, BLOCK_N, SUB_ROWS, PAGE_SIZE, IS_PAGED)
    for t in gl.static_range(STAGES):
        pages = next_pages
        next_pages = _tile_pages(split_start + (t + 1) * BLOCK_N, seq, BLOCK_N, SUB_ROWS, PAGE_SIZE, IS_PAGED)
        if t < n_tiles:
            _issue_tile(
                k_desc, v_desc, k_smem.index(t), v_smem.index(t), ready.index(t), split_start + t * BLOCK_N,
                pages, seq, BLOCK_N, SUB_ROWS, PAGE_SIZE, IS_PAGED,
            )  # fmt: skip

    # Packed row r is query token r // GROUP of query head h_kv·GROUP + r % GROUP.
    rows = m_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, rows_layout))
    q_rows = (
        q_ptr
        + b.to(gl.int64) * stride_qb
        + (rows // GROUP) * stride_qn
        + (h_kv * GROUP + rows % GROUP) * stride_qh
    )
    q_ok = gl.expand_dims(rows < GROUP * seqlen_q, 1)
    q = gl.load(gl.expand_dims(q_rows, 1) + gl.expand_dims(offs_d, 0), mask=q_ok, other=0.0)
    q = gl.convert_layout(q, gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2))

    rows_m = m_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_of)
    rows_i = rows_m // GROUP
    heads = h_kv * GROUP + rows_m % GROUP
    row_ok = rows_m < GROUP * seqlen_q
    alibi_slope = gl.zeros([BLOCK_M, 1], gl.float32, mma)
    if HAS_ALIBI:
        slopes = gl.load(alibi_ptr + b * stride_alibi_b + heads, mask=row_ok, other=0.0) * LOG2_E_C
        alibi_slope = gl.expand_dims(slopes, 1)
    row_terms = _row_terms(rows_i, diag_offset, lo_diag, hi_diag, n_k, HAS_WINDOW_LEFT, HAS_ALIBI)
    # ALiBi's entry is (slopes,), a slope a row, so fwd._softmax_step takes the absolute value a score (the
    # forward's row range and column offsets are for its own tiles); no dropout; every exponential on the
    # MUFU (EXP2_SHARE 0: decoding is bound by reading the cache).
    scores = (n_k, hi_diag, qk_scale, softcap_qk, softcap_out, (alibi_slope,), 0, 0)

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_of)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_of)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma)
    # Tiles [0, t_mid) are masked, [t_mid, t_tail) whole, [t_tail, n_tiles) masked (mid_start lies on a
    # tile edge unless it is the split's end, when the first loop takes every tile).
    t_mid = gl.cdiv(mid_start - split_start, BLOCK_N)
    t_tail = t_mid + (mid_end - mid_start) // BLOCK_N
    # Three phases: masked head, whole tiles, masked tail.
    bounds = (0, t_mid, t_tail, n_tiles)
    for phase in gl.static_range(3):
        acc, m_i, l_i = _decode_steps(
            acc, m_i, l_i, q, k_smem, v_smem, ready, descs, seq, split_start, bounds[phase],
            bounds[phase + 1], n_tiles, n_k, row_terms, scores, phase != 1, IS_LOCAL, HAS_WINDOW_LEFT,
            HAS_SOFTCAP, HAS_ALIBI, BLOCK_N, SUB_ROWS, PAGE_SIZE, IS_PAGED, STAGES,
        )  # fmt: skip

    # A row that saw no key in this split has ℓ = 0: its output is 0 and its log-sum-exp −inf.
    out = acc / gl.expand_dims(gl.where(l_i == 0.0, 1.0, l_i), 1)
    offs_dm = gl.arange(0, HEAD_DIM, layout=col_of)
    o_rows = (
        o_ptr
        + split.to(gl.int64) * stride_os
        + b.to(gl.int64) * stride_ob
        + rows_i * stride_on
        + heads * stride_oh
    )
    o_ok = gl.expand_dims(row_ok, 1) & gl.expand_dims(offs_dm < HEAD_DIM, 0)
    gl.store(
        gl.expand_dims(o_rows, 1) + gl.expand_dims(offs_dm, 0), out.to(o_ptr.dtype.element_ty), mask=o_ok
    )
    lse = (m_i + gl.log2(l_i)) * LN_2
    lse_rows = (
        lse_ptr
        + split.to(gl.int64) * stride_ls
        + b.to(gl.int64) * stride_lb
        + heads * stride_lh
        + rows_i * stride_ln
    )
    gl.store(lse_rows, lse, mask=row_ok)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


def unsupported_reason(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
) -> str | None:
    """Why the TMA decode kernel does not take this call, or None: it takes fp16/bf16 at head dims 64, 128
    and 256 on a 9.x device, caches TMA can read in place, and paged caches without ``cache_leftpad`` (a
    left pad moves tiles off the pages' edges); the portable decode kernel takes the rest."""
    reason = device_unsupported_reason(q.device)
    if reason is not None:
        return reason
    if q.dtype not in DTYPES:
        return f"the TMA decode kernel takes float16 and bfloat16, not {q.dtype}"
    if q.shape[-1] not in HEAD_DIMS or v_cache.shape[-1] != q.shape[-1]:
        return f"the TMA decode kernel is compiled for head dims {HEAD_DIMS}, not {q.shape[-1]}"
    if block_table is not None and cache_leftpad is not None:
        return "a paged cache with cache_leftpad is not in the TMA decode kernel"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        reason = _tma_unreadable(name, t)
        if reason is not None:
            return reason
    return None


def box_columns(head_dim: int, sub_rows: int, block_n: int, element_size: int) -> int:
    """Columns of a cache box: the whole row, but where a box is a row slice of a tile (pages smaller than
    a tile) whose rows pass the swizzle, one swizzle's worth (:func:`_part_box`)."""
    if sub_rows < block_n and head_dim * element_size > SWIZZLE_BYTES:
        return SWIZZLE_BYTES // element_size
    return head_dim


def shared_bytes(head_dim: int, block_n: int, stages: int, element_size: int = 2) -> int:
    """Shared memory of one program: the K and V ring, and a margin for the layout conversions (q, P and
    a masked step's V go through shared memory on their way to the dot operands)."""
    return 2 * stages * block_n * head_dim * element_size + block_n * head_dim * element_size


def programs_per_sm(
    head_dim: int,
    cfg: configs.DecodeConfig,
    capacity: int,
    programs: int,
    sms: int,
    small_pages: bool = False,
) -> int:
    """Programs an SM the split heuristic plans for, with ``programs`` programs a split on ``sms`` SMs: one
    when the cache has LONG_CACHE_KEYS slots or more, or when one an SM fills every SM exactly, or (where
    the heuristic splits for a wave: half the SMs or more idle without, and unless ``small_pages``: pages
    smaller than a key tile) ONE_A_SM_FILL of them, and gives each split at least MIN_KEYS_ONE_A_SM keys;
    else as many as fit one Hopper SM's 227 KB of shared memory (at most 2)."""
    fit = max(1, min(2, configs.HOPPER_SHARED_BYTES // shared_bytes(head_dim, cfg.BLOCK_N, cfg.num_stages)))
    if capacity >= LONG_CACHE_KEYS or fit == 1:
        return 1
    one = sms // max(programs, 1)
    fills = programs * one == sms or (not small_pages and one >= 2 and programs * one >= ONE_A_SM_FILL * sms)
    if one >= 1 and fills and capacity // one >= MIN_KEYS_ONE_A_SM:
        return 1
    return fit


def ring_stages(
    head_dim: int, cfg: configs.DecodeConfig, per_sm: int, bandwidth: float, programs: int = 0, sms: int = 1
) -> int:
    """The depth of a program's ring: the tiling's, or ONE_A_SM_STAGES at D = 128 where
    :func:`programs_per_sm` plans one program an SM on a GPU of ``bandwidth`` ≥ DEEP_RING_BANDWIDTH bytes a
    second (:func:`flashtile.kernels.configs.peak_memory_bandwidth`), or where the launch's ``programs`` make
    DEEP_RING_WAVES of two an SM on ``sms`` SMs."""
    low, high = DEEP_RING_WAVES
    deep = (per_sm == 1 and bandwidth >= DEEP_RING_BANDWIDTH) or low * 2 * sms < programs <= high * 2 * sms
    if head_dim == 128 and deep:
        return max(cfg.num_stages, ONE_A_SM_STAGES)
    return cfg.num_stages


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    o_part: torch.Tensor,
    lse_part: torch.Tensor,
    tensors: tuple[torch.Tensor | None, ...],
    scalars: dict[str, object],
    switches: dict[str, bool],
    block_m: int,
    cfg: configs.DecodeConfig,
    programs: int,
) -> None:
    """Launch the TMA decode kernel over ``programs`` programs: ``tensors`` = (cache_seqlens, block_table,
    cache_batch_idx, cache_leftpad, alibi slopes), ``scalars`` the portable kernel's runtime arguments by
    name, ``switches`` its constexpr switches."""
    seqlens, block_table, batch_idx, leftpad, slopes = tensors
    head_dim = q.shape[-1]
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 1
    sub_rows = min(page_size, cfg.BLOCK_N) if paged else cfg.BLOCK_N
    box = (1, sub_rows, 1, box_columns(head_dim, sub_rows, cfg.BLOCK_N, q.element_size()))
    k_desc: CheckedDescriptor = descriptor(k_cache, k_cache.shape, k_cache.stride(), box)
    v_desc: CheckedDescriptor = descriptor(v_cache, v_cache.shape, v_cache.stride(), box)
    launch_kernel(
        attn_decode_tma_kernel, (programs,), q.device,
        q, k_desc, v_desc, o_part, lse_part, seqlens, block_table, batch_idx, leftpad, slopes,
        q.stride(0), q.stride(1), q.stride(2), *o_part.stride()[:4], *lse_part.stride(),
        block_table.stride(0) if paged else 0,
        0 if slopes is None or slopes.dim() == 1 else slopes.stride(0),
        **scalars,
        GROUP=q.shape[2] // k_cache.shape[2], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=cfg.BLOCK_N,
        STAGES=cfg.num_stages, SUB_ROWS=sub_rows, PAGE_SIZE=page_size, WARPS_M=_warps_m(block_m),
        IS_PAGED=paged, HAS_BATCH_IDX=switches["HAS_BATCH_IDX"], HAS_LEFTPAD=switches["HAS_LEFTPAD"],
        IS_LOCAL=switches["IS_LOCAL"], HAS_WINDOW_LEFT=switches["HAS_WINDOW_LEFT"],
        HAS_SOFTCAP=switches["HAS_SOFTCAP"], HAS_ALIBI=switches["HAS_ALIBI"],
        EARLY_COMBINE=switches["EARLY_COMBINE"], num_warps=NUM_WARPS,
    )  # fmt: skip
