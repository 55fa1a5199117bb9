"""Split-KV decode kernel (flash-decoding): a few query tokens against a long, possibly paged, KV cache.

One program owns (batch b, KV head, split, block of packed query rows). The rows are the GQA group's query
heads × the query tokens, so every K/V byte of a head is read by one program once; the visible keys of a
sequence are cut into ``num_splits`` stretches of whole tiles, and the splits' partial ``(out, lse)`` are
merged by ``combine.attn_combine``. Design, split heuristic and combine math: docs/design/decode.md.

Key ``j`` (0 ≤ j < n_k, ``n_k = cache_seqlens[b] − leftpad``) is cache slot ``leftpad + j`` of the sequence:
row ``cache_batch_idx[b]`` of a contiguous cache, or page ``block_table[b, slot // page_size]`` of a paged
one. Only slots of valid keys are ever read: slots and pages past a sequence may hold anything.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from flashtile._environ import Knob
from flashtile.kernels import configs
from flashtile.kernels._decode_program import program_coordinates, sequence_keys
from flashtile.kernels._layout import cdiv, launch
from flashtile.kernels._masking import visible, visible_span
from flashtile.kernels._scores import base2_scores
from flashtile.kernels._tiles import dot_operand
from flashtile.kernels.combine import attn_combine
from flashtile.kernels.fwd import LOG2_E, dot_options, positive_scale

LN_2 = tl.constexpr(math.log(2.0))
LOG2_E_C = tl.constexpr(LOG2_E)
# A split of a one-program-an-SM wave gets at least this many key tiles, so its fixed cost (q load, partial
# store, combine) stays small. The two-program wave takes splits down to one tile (batch 1, 4k cache, 8 KV
# heads: 33 splits of about 2 tiles ran 1.11x faster than 16 of 4).
MIN_TILES_PER_SPLIT = 4
MAX_SPLITS = 128
# The heuristic takes the fewest splits whose wave efficiency is within this factor of the best.
SPLIT_EFFICIENCY = 0.95
# Programs a Hopper SM runs at once when a small batch is split at head dims up to 128 (two fit its 227 KB
# of shared memory, 96 KB each): at batch 1 with 8 KV heads, 33 splits (two programs on every SM) ran
# 1.09-1.11x faster than 16 at 4k and 16k caches and as fast at 64k and 128k
# (H100, docs/test-runs/2026-11-23-h100-session6/j/).
PROGRAMS_PER_SM = 2
# After the portable split kernel the combine kernel is launched with programmatic dependent launch (Hopper
# and later), so that its launch overlaps the split kernel: 0.4-0.8 µs less a step at batch 1 (H200: 4k
# cache 12.10 against 12.82 µs, 16k 25.19 against 25.98; docs/test-runs/2026-11-25-session9/t/). After the
# TMA split kernel it is not: there the step ran 0.2-1.1 µs faster without it at batch 1 in five of six
# cells and 0.2-0.5 µs slower in one (GQA 4, 16k), in two runs (H100; docs/design/decode.md, "Combine").
# FLASHTILE_DECODE_PDL=0 turns it off for both kernels, =1 on for both.
PDL_ENV = "FLASHTILE_DECODE_PDL"
# On Hopper the TMA decode kernel (kernels/hopper/decode.py) takes the calls it supports;
# FLASHTILE_DECODE_KERNEL=portable sends every call to this module's kernel, =tma requires the TMA one.
KERNEL_ENV = "FLASHTILE_DECODE_KERNEL"
_KERNEL, _PDL = Knob(KERNEL_ENV), Knob(PDL_ENV)
# A split of this many key tiles or fewer runs at 2 pipeline stages, not 3: a third stage has no tile to
# fetch (H200, batch 1, 4k cache, 33 splits of 2 tiles: 13.0 µs against 14.1; at 16k and more, 8 tiles a
# split and up, 3 stages stay 6-9 % faster; docs/test-runs/2026-11-25-session9/r/).
SHALLOW_TILES_PER_SPLIT = 2


@triton.jit
def _cache_rows(
    k_base, v_base, bt_row, first_slot, last_slot, slots, slot_ok, num_blocks, stride_kn, stride_vn,
    stride_kp, stride_vp, MASKED: tl.constexpr, IS_PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    TILE_IN_PAGE: tl.constexpr, PAGE_IN_REGISTER: tl.constexpr,
):  # fmt: skip
    """Addresses of cache slots ``slots`` (from ``first_slot`` on; ``last_slot`` is the last slot of the
    loop's range) of the program's sequence and KV head in K and V, through int64 offsets. MASKED: only the
    slots of ``slot_ok`` are looked up in the block table; TILE_IN_PAGE: the tile lies in one page, whose
    number is one scalar load; PAGE_IN_REGISTER: that load goes straight to a register (docs/design/decode.md,
    "Paged loads")."""
    if IS_PAGED:
        if TILE_IN_PAGE and PAGE_IN_REGISTER:
            # Through tl.load, the pipeliner would copy the page number to shared memory asynchronously,
            # and the copies' FIFO order makes each step wait for every K/V copy in flight (wait_group 0).
            # Pure, it can be issued unpredicated for a step past the loop's last (memcheck found a read one
            # entry past the last row's end when the last key filled its page): clamped into the loop's
            # slots, it never reads past the block table's row.
            page_slot = tl.maximum(tl.minimum(first_slot, last_slot), 0)
            page = tl.inline_asm_elementwise(
                "ld.global.nc.b32 $0, [$1];",
                "=r,l",
                [bt_row + page_slot // PAGE_SIZE],
                dtype=tl.int32,
                is_pure=True,
                pack=1,
            )
        elif TILE_IN_PAGE:
            page = tl.load(bt_row + first_slot // PAGE_SIZE)
        elif MASKED:
            page = tl.load(bt_row + slots // PAGE_SIZE, mask=slot_ok, other=0)
        else:
            page = tl.load(bt_row + slots // PAGE_SIZE)
        # A bad block-table entry may read a wrong page, never outside the cache.
        page = tl.minimum(tl.maximum(page, 0), num_blocks - 1).to(tl.int64)
        within = (slots % PAGE_SIZE).to(tl.int64)
        return k_base + page * stride_kp + within * stride_kn, v_base + page * stride_vp + within * stride_vn
    slots = slots.to(tl.int64)
    return k_base + slots * stride_kn, v_base + slots * stride_vn


@triton.jit
def _attn_decode_steps(
    acc, l_i, m_i, q, k_base, v_base, bt_row, start_n, end_n, leftpad, num_blocks, rows_i,
    alibi_slopes, qk_scale, lo_diag, hi_diag, diag_offset, softcap_qk, softcap_out,
    stride_kn, stride_vn, stride_kp, stride_vp,
    MASKED: tl.constexpr, IS_LOCAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr,
    HAS_ALIBI: tl.constexpr, IS_PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, TILE_IN_PAGE: tl.constexpr,
    PAGE_IN_REGISTER: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
):  # fmt: skip
    """Fold keys [start_n, end_n) into (acc, ℓ, m). MASKED tiles load only keys < end_n (the split's end,
    never past the sequence) and apply the window; unmasked tiles lie wholly inside both."""
    offs_d = tl.arange(0, BLOCK_D)
    for n0 in tl.range(start_n, end_n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        key_ok = offs_n < end_n
        k_rows, v_rows = _cache_rows(
            k_base, v_base, bt_row, leftpad + n0, leftpad + end_n - 1, leftpad + offs_n, key_ok, num_blocks,
            stride_kn, stride_vn, stride_kp, stride_vp, MASKED, IS_PAGED, PAGE_SIZE, TILE_IN_PAGE,
            PAGE_IN_REGISTER,
        )  # fmt: skip
        if MASKED or BLOCK_D != HEAD_DIM:
            load_ok = key_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
            # Unread slots become 0, not whatever they hold: a masked score must meet a finite V.
            k = tl.load(k_rows[:, None] + offs_d[None, :], mask=load_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
            v = tl.load(v_rows[:, None] + offs_d[None, :], mask=load_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
        else:
            k = tl.load(k_rows[:, None] + offs_d[None, :])  # [BLOCK_N, BLOCK_D]
            v = tl.load(v_rows[:, None] + offs_d[None, :])  # [BLOCK_N, BLOCK_D]
        k = dot_operand(k, DOT_FP32)
        v = dot_operand(v, DOT_FP32)
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
        if HAS_SOFTCAP or HAS_ALIBI:
            s, _ = base2_scores(
                s, rows_i[:, None], offs_n[None, :], qk_scale, softcap_qk, softcap_out, alibi_slopes[:, None],
                diag_offset, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
            )  # fmt: skip
            s_scale = 1.0
        else:
            # qk_scale > 0: the row max commutes with the scaling, which folds into one FMA below.
            s_scale = qk_scale
        if MASKED:
            keep = visible(rows_i[:, None], offs_n[None, :], end_n, lo_diag, hi_diag, IS_LOCAL)
            s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * s_scale)
        # A row with every key masked so far keeps m = −inf; subtracting 0 avoids −inf − (−inf).
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new) if MASKED else m_new
        p = tl.math.exp2(s * s_scale - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["window_left", "window_right"])
def attn_decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, seqlens_ptr, block_table_ptr, batch_idx_ptr, leftpad_ptr, alibi_ptr,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_os, stride_ob, stride_on, stride_oh, stride_ls, stride_lb, stride_lh, stride_ln,
    stride_bt, stride_alibi_b,
    seqlen_q, capacity, num_blocks, num_m_blocks, num_splits, H_KV,
    qk_scale, window_left, window_right, softcap_qk, softcap_out,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    IS_PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr,
    IS_LOCAL: tl.constexpr, HAS_WINDOW_LEFT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_FP32: tl.constexpr, PAGE_IN_REGISTER: tl.constexpr,
    EARLY_COMBINE: tl.constexpr,
):  # fmt: skip
    if EARLY_COMBINE:
        # The combine kernel may launch now and wait on this grid (programmatic dependent launch), so its
        # launch latency hides under this kernel.
        gdc_launch_dependents()
    # Without leftpad every tile starts at a multiple of BLOCK_N: with pages a multiple of it, in one page.
    TILE_IN_PAGE: tl.constexpr = IS_PAGED and PAGE_SIZE % BLOCK_N == 0 and not HAS_LEFTPAD
    pid = tl.program_id(0).to(tl.int64)
    m_block, split, h_kv, b = program_coordinates(pid, num_m_blocks, num_splits, H_KV)
    leftpad, n_k = sequence_keys(seqlens_ptr, leftpad_ptr, b, capacity, HAS_LEFTPAD)

    # Packed row r is query token r // GROUP of query head h_kv·GROUP + r % GROUP.
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * seqlen_q
    rows_i = rows // GROUP
    heads = h_kv * GROUP + rows % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q_rows = q_ptr + b * stride_qb + rows_i * stride_qn + heads * stride_qh
    q = dot_operand(tl.load(q_rows[:, None] + offs_d[None, :], mask=q_ok, other=0.0), DOT_FP32)

    diag_offset = n_k - seqlen_q
    lo_diag = diag_offset - window_left if HAS_WINDOW_LEFT else None
    hi_diag = diag_offset + window_right
    i_first = m_block * BLOCK_M // GROUP
    i_last = tl.minimum(m_block * BLOCK_M + BLOCK_M - 1, GROUP * seqlen_q - 1) // GROUP
    if IS_LOCAL:
        start, unmasked_start, unmasked_end, end = visible_span(
            i_first, i_last + 1, n_k, lo_diag, hi_diag, BLOCK_M, BLOCK_N
        )
    else:
        start = 0
        unmasked_start = 0
        unmasked_end = n_k // BLOCK_N * BLOCK_N
        end = n_k
    # This split's whole tiles of [start, end); the three loops below cut them at the window's edges.
    tiles_per_split = tl.cdiv(tl.cdiv(tl.maximum(end - start, 0), BLOCK_N), num_splits)
    split_start = tl.minimum(start + split * tiles_per_split * BLOCK_N, end)
    split_end = tl.minimum(split_start + tiles_per_split * BLOCK_N, end)
    mid_start = tl.minimum(tl.maximum(unmasked_start, split_start), split_end)
    mid_end = mid_start + tl.maximum(tl.minimum(unmasked_end, split_end) - mid_start, 0) // BLOCK_N * BLOCK_N

    alibi_slopes = tl.zeros([BLOCK_M], tl.float32)
    if HAS_ALIBI:
        alibi_slopes = tl.load(alibi_ptr + b * stride_alibi_b + heads, mask=row_ok, other=0.0) * LOG2_E_C
    if HAS_BATCH_IDX:
        b_cache = tl.minimum(tl.maximum(tl.load(batch_idx_ptr + b), 0), num_blocks - 1).to(tl.int64)
    else:
        b_cache = b
    # Paged: K/V rows are addressed page by page from the KV head's base; the batch stride is the page's.
    bt_row = block_table_ptr
    if IS_PAGED:
        k_base = k_ptr + h_kv * stride_kh
        v_base = v_ptr + h_kv * stride_vh
        bt_row += b * stride_bt
    else:
        k_base = k_ptr + b_cache * stride_kb + h_kv * stride_kh
        v_base = v_ptr + b_cache * stride_vb + h_kv * stride_vh

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc, l_i, m_i = _attn_decode_steps(
        acc, l_i, m_i, q, k_base, v_base, bt_row, split_start, mid_start, leftpad, num_blocks, rows_i,
        alibi_slopes, qk_scale, lo_diag, hi_diag, diag_offset, softcap_qk, softcap_out,
        stride_kn, stride_vn, stride_kb, stride_vb, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
        IS_PAGED, PAGE_SIZE, TILE_IN_PAGE, PAGE_IN_REGISTER, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_FP32,
    )  # fmt: skip
    acc, l_i, m_i = _attn_decode_steps(
        acc, l_i, m_i, q, k_base, v_base, bt_row, mid_start, mid_end, leftpad, num_blocks, rows_i,
        alibi_slopes, qk_scale, lo_diag, hi_diag, diag_offset, softcap_qk, softcap_out,
        stride_kn, stride_vn, stride_kb, stride_vb, False, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
        IS_PAGED, PAGE_SIZE, TILE_IN_PAGE, PAGE_IN_REGISTER, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_FP32,
    )  # fmt: skip
    acc, l_i, m_i = _attn_decode_steps(
        acc, l_i, m_i, q, k_base, v_base, bt_row, mid_end, split_end, leftpad, num_blocks, rows_i,
        alibi_slopes, qk_scale, lo_diag, hi_diag, diag_offset, softcap_qk, softcap_out,
        stride_kn, stride_vn, stride_kb, stride_vb, True, IS_LOCAL, HAS_SOFTCAP, FAST_TANH, HAS_ALIBI,
        IS_PAGED, PAGE_SIZE, TILE_IN_PAGE, PAGE_IN_REGISTER, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_FP32,
    )  # fmt: skip

    # A row that saw no key in this split has ℓ = 0: its output is 0 and its log-sum-exp −inf.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = o_ptr + split * stride_os + b * stride_ob + rows_i * stride_on + heads * stride_oh
    tl.store(o_rows[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=q_ok)
    lse = (m_i + tl.math.log2(l_i)) * LN_2
    lse_rows = lse_ptr + split * stride_ls + b * stride_lb + heads * stride_lh + rows_i * stride_ln
    tl.store(lse_rows, lse, mask=row_ok)


def programs_per_sm(head_dim: int, device: torch.device) -> int:
    """How many split programs :func:`num_splits_heuristic` may put on one SM: ``PROGRAMS_PER_SM`` where
    that was measured (Hopper, head dims up to 128), else 1."""
    if device.type == "cuda" and configs.block_d(head_dim) <= 128 and configs._is_hopper(device):
        return PROGRAMS_PER_SM
    return 1


def num_splits_heuristic(
    programs: int, capacity: int, block_n: int, device: torch.device, per_sm: int = 1
) -> int:
    """Splits of the cache length for ``programs`` programs per split: 1 when the programs already fill
    every SM; for a batch that leaves more than half of the SMs idle, the most splits (of a tile or more)
    that keep to one wave of ``per_sm`` > 1 programs an SM (:func:`programs_per_sm`); else the fewest splits
    of ``MIN_TILES_PER_SPLIT`` tiles or more that give every SM the same number of programs to within
    ``SPLIT_EFFICIENCY`` of the best split count.

    Programs are spread evenly, since a memory-bound SM with two programs where its neighbours have one
    finishes last (H100, batch 1, 128k: 29 splits on 8 KV heads ran 1.3× slower than 16; 33, two on every
    SM, ran as fast as 16 at 64k and 128k and 1.09-1.11× faster at 4k and 16k)."""
    sms = configs.multiprocessor_count(device)
    if programs >= sms:
        return 1
    tiles = cdiv(capacity, block_n)
    if 2 * programs <= sms and per_sm > 1:
        return max(1, min(MAX_SPLITS, tiles, per_sm * sms // programs))
    most = max(1, min(MAX_SPLITS, tiles // MIN_TILES_PER_SPLIT))

    def efficiency(splits: int) -> float:
        work = programs * splits
        return work / (cdiv(work, sms) * sms)

    best = max(efficiency(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if efficiency(s) >= SPLIT_EFFICIENCY * best)


def decode_fwd(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    softmax_scale: float,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    config: configs.DecodeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over an already-updated KV cache, on validated inputs.

    q ``(B, N_q, H, D)`` (rotary already applied), ``1 ≤ N_q ≤ 16`` in practice (any N_q works). Caches with
    a unit last stride: contiguous ``(B_cache, S_max, H_KV, D)``, row ``cache_batch_idx[b]`` (default b) for
    sequence b; or paged ``(num_pages, page_size, H_KV, D)`` with ``block_table`` int32 ``(B, max_pages)``,
    page_size a multiple of 16 (``cache_batch_idx`` is then not read). ``cache_seqlens`` int32 ``(B,)``:
    the valid slots of each sequence, ``cache_leftpad`` int32 ``(B,)`` (default 0) its first valid slot;
    the keys are slots ``[leftpad, seqlen)``. ``window_size`` normalised, causal folded in as right = 0;
    windows and ALiBi are bottom-right aligned on the valid keys. ``alibi_slopes`` fp32 ``(H,)`` or
    ``(B, H)``. ``num_splits`` 0 picks a split count (``num_splits_heuristic``). On Hopper the Gluon TMA
    kernel (kernels/hopper/decode.py) runs the calls it takes (:func:`_runs_tma`), with its own tiling and
    programs an SM; this module's kernel runs the others.

    Returns ``out`` ``(B, N_q, H, D)`` in q's dtype and ``lse`` ``(B, H, N_q)`` fp32; a sequence with no
    visible key gives ``out = 0`` and ``lse = −inf``.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    group = heads // heads_kv
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 1
    capacity = _capacity(k_cache, block_table)
    if not _launches(q, k_cache, capacity):
        return out.zero_(), lse.fill_(-math.inf)

    q, softmax_scale = positive_scale(q, softmax_scale)
    if q.stride(-1) != 1:
        q = q.contiguous()
    tma = _runs_tma(q, k_cache, v_cache, block_table, cache_leftpad)
    if tma:
        from flashtile.kernels.hopper import decode as hopper_decode

        cfg = config or configs.decode_tma_config(head_dim)
    else:
        cfg = config or configs.decode_config(head_dim, q.device)
    packed_rows = group * seqlen_q
    block_m = min(max(16, triton.next_power_of_2(packed_rows)), cfg.MAX_BLOCK_M)
    num_m_blocks = cdiv(packed_rows, block_m)
    programs = batch * heads_kv * num_m_blocks
    if tma:
        sms = configs.multiprocessor_count(q.device)
        small_pages = paged and page_size < cfg.BLOCK_N
        per_sm = hopper_decode.programs_per_sm(head_dim, cfg, capacity, programs, sms, small_pages)
        if config is None:
            bandwidth = configs.peak_memory_bandwidth(q.device)
            stages = hopper_decode.ring_stages(head_dim, cfg, per_sm, bandwidth, programs, sms)
            # (A new config only where the ring deepens: most calls keep the tiling's.)
            if stages != cfg.num_stages:
                cfg = dataclasses.replace(cfg, num_stages=stages)
    else:
        per_sm = programs_per_sm(head_dim, q.device)
    splits = num_splits or num_splits_heuristic(programs, capacity, cfg.BLOCK_N, q.device, per_sm)
    # More splits than key tiles would only add programs that see nothing.
    splits = max(1, min(splits, cdiv(capacity, cfg.BLOCK_N)))
    # (The TMA kernel's rings are 2 or 3 tiles deep already.)
    if config is None and not tma and cdiv(cdiv(capacity, cfg.BLOCK_N), splits) <= SHALLOW_TILES_PER_SPLIT:
        cfg = dataclasses.replace(cfg, num_stages=min(cfg.num_stages, 2))
    if splits == 1:
        o_part, lse_part = out[None], lse[None]
    else:
        o_part = torch.empty((splits, *out.shape), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((splits, *lse.shape), dtype=torch.float32, device=q.device)

    left, right = window_size
    slopes = None if alibi_slopes is None else alibi_slopes.contiguous()
    early_combine = splits > 1 and _early_combine(q.device, tma)
    switches = dict(
        IS_PAGED=paged,
        HAS_BATCH_IDX=cache_batch_idx is not None and not paged,
        HAS_LEFTPAD=cache_leftpad is not None,
        IS_LOCAL=left >= 0 or right >= 0,
        HAS_WINDOW_LEFT=left >= 0,
        HAS_SOFTCAP=softcap > 0,
        HAS_ALIBI=slopes is not None,
        EARLY_COMBINE=early_combine,
    )
    scalars = dict(
        seqlen_q=seqlen_q, capacity=capacity, num_blocks=k_cache.shape[0], num_m_blocks=num_m_blocks,
        num_splits=splits, H_KV=heads_kv, qk_scale=softmax_scale * LOG2_E, window_left=max(left, 0),
        window_right=right if right >= 0 else capacity + seqlen_q,
        softcap_qk=softmax_scale / softcap if softcap > 0 else 0.0, softcap_out=softcap * LOG2_E,
    )  # fmt: skip
    tensors = (cache_seqlens, block_table, cache_batch_idx, cache_leftpad, slopes)
    if tma:
        hopper_decode.launch(
            q, k_cache, v_cache, o_part, lse_part, tensors, scalars, switches, block_m, cfg, programs * splits
        )
    else:
        launch(
            attn_decode_kernel, (programs * splits,), q.device,
            q, k_cache, v_cache, o_part, lse_part, *tensors,
            q.stride(0), q.stride(1), q.stride(2), *k_cache.stride()[:3], *v_cache.stride()[:3],
            *o_part.stride()[:4], *lse_part.stride(),
            block_table.stride(0) if paged else 0,
            0 if slopes is None or slopes.dim() == 1 else slopes.stride(0),
            **scalars,
            GROUP=group, HEAD_DIM=head_dim, BLOCK_D=configs.block_d(head_dim), BLOCK_M=block_m,
            BLOCK_N=cfg.BLOCK_N, PAGE_SIZE=page_size, **switches,
            # Inline asm does not run in the interpreter.
            FAST_TANH=not configs.is_interpreter(), PAGE_IN_REGISTER=not configs.is_interpreter(),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dot_options(q.dtype),
        )  # fmt: skip
    if splits > 1:
        attn_combine(o_part, lse_part, out=out, lse=lse, after_prior_grid=early_combine)
    return out, lse


def _capacity(k_cache: torch.Tensor, block_table: torch.Tensor | None) -> int:
    """Cache slots a sequence has: pages_per_sequence · page_size, or the contiguous cache's length."""
    return k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]


def _launches(q: torch.Tensor, k_cache: torch.Tensor, capacity: int) -> bool:
    """Whether :func:`decode_fwd` launches a kernel: a query row and a cache slot (else out 0, lse −inf)."""
    return q.numel() > 0 and capacity > 0 and k_cache.numel() > 0


def check_kernel_choice(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
) -> None:
    """The ValueError :func:`decode_fwd` would raise over FLASHTILE_DECODE_KERNEL (:func:`_runs_tma`),
    raised without launching: the KV-cache API checks before its append writes the cache. Unset or
    ``portable`` (the usual setting) costs one read."""
    if _KERNEL.get("").strip() in ("", "portable"):
        return
    if _launches(q, k_cache, _capacity(k_cache, block_table)):
        _runs_tma(q, k_cache, v_cache, block_table, cache_leftpad)


def _runs_tma(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
) -> bool:
    """Whether the Hopper TMA decode kernel (kernels/hopper/decode.py) runs this call: where it takes the
    call, unless ``FLASHTILE_DECODE_KERNEL=portable``; ``=tma`` makes a call it does not take an error."""
    choice = _KERNEL.get("").strip()
    if choice not in ("", "tma", "portable"):
        raise ValueError(f"{KERNEL_ENV} must be 'tma' or 'portable', not {choice!r}")
    if choice == "portable":
        return False
    if configs.is_interpreter() or q.device.type != "cuda":
        reason = "the TMA decode kernel runs on CUDA devices, not in the interpreter"
    else:
        from flashtile.kernels.hopper.decode import unsupported_reason

        reason = unsupported_reason(q, k_cache, v_cache, block_table, cache_leftpad)
    if reason is not None and choice == "tma":
        raise ValueError(f"{KERNEL_ENV}=tma, but the TMA decode kernel does not run this call: {reason}")
    return reason is None


def _early_combine(device: torch.device, tma: bool) -> bool:
    """Whether the combine launches while the split kernel runs (programmatic dependent launch, compute
    capability 9.0 or later): after the portable kernel unless ``FLASHTILE_DECODE_PDL=0``, after the TMA
    kernel only with ``FLASHTILE_DECODE_PDL=1`` (PDL_ENV's comment)."""
    choice = _PDL.get("")
    if choice == "0" or (tma and choice != "1") or device.type != "cuda" or configs.is_interpreter():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9
