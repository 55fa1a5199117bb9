"""KV-cache append kernel: writes new keys (rotated) and values into a contiguous or paged cache, in place.

One program per (BLOCK_M new tokens, sequence, KV head). New token ``i`` of sequence ``b`` goes to logical
position ``p = cache_seqlens[b] + i``: row ``cache_batch_idx[b]`` (default ``b``), position ``p`` of a
contiguous cache, or page ``block_table[b, p // PAGE_SIZE]``, row ``p % PAGE_SIZE`` of a paged one. The
key is rotated to position ``p`` (flashtile.kernels._rotary) when rotary tables are given. Stores are
masked to the target slots: a position past the capacity or on a page number outside ``[0, num_pages)``
is skipped, so even an unvalidated call (inside a CUDA graph or torch.compile, where the API's value
checks cannot run) never writes outside the slots it was given. Semantics: flashtile.reference.kvcache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashtile.kernels import configs
from flashtile.kernels._layout import cdiv, launch
from flashtile.kernels._rotary import rotate_rows


@triton.jit
def kvcache_append_kernel(
    K_CACHE, V_CACHE, K, V, CACHE_SEQLENS, BLOCK_TABLE, BATCH_IDX, COS, SIN,
    stride_kcb, stride_kcm, stride_kch, stride_vcb, stride_vcm, stride_vch,
    stride_kb, stride_km, stride_kh, stride_vb, stride_vm, stride_vh, stride_bt,
    seqlen_new, capacity, num_pages, seqlen_ro,
    HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    PAGE_SIZE: tl.constexpr, INTERLEAVED: tl.constexpr, IS_PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    pos = tl.load(CACHE_SEQLENS + b).to(tl.int64) + offs_m  # [BLOCK_M]
    in_new = offs_m < seqlen_new
    inside = in_new & (pos >= 0) & (pos < capacity)
    if IS_PAGED:
        slot = tl.minimum(tl.maximum(pos // PAGE_SIZE, 0), capacity // PAGE_SIZE - 1)
        page = tl.load(BLOCK_TABLE + b * stride_bt + slot, mask=inside, other=-1).to(tl.int64)
        inside = inside & (page >= 0) & (page < num_pages)
        cache_row = page
        cache_pos = pos % PAGE_SIZE
    else:
        cache_row = b
        if HAS_BATCH_IDX:
            cache_row = tl.load(BATCH_IDX + b).to(tl.int64)
        cache_pos = pos
    store_mask = inside[:, None] & (offs_d < HEAD_DIM)
    k_rows = K + b * stride_kb + h * stride_kh + offs_m.to(tl.int64)[:, None] * stride_km
    k = rotate_rows(
        k_rows,
        offs_d,
        pos[:, None],
        in_new[:, None],
        COS,
        SIN,
        seqlen_ro,
        HEAD_DIM,
        ROTARY_DIM,
        INTERLEAVED,
        False,
    )  # [BLOCK_M, BLOCK_D]
    kc = K_CACHE + cache_row * stride_kcb + h * stride_kch + cache_pos * stride_kcm
    tl.store(kc[:, None] + offs_d, k.to(K_CACHE.dtype.element_ty), mask=store_mask)
    v_rows = V + b * stride_vb + h * stride_vh + offs_m.to(tl.int64)[:, None] * stride_vm
    v = tl.load(v_rows + offs_d, mask=in_new[:, None] & (offs_d < HEAD_DIM), other=0.0)  # [BLOCK_M, BLOCK_D]
    vc = V_CACHE + cache_row * stride_vcb + h * stride_vch + cache_pos * stride_vcm
    tl.store(vc[:, None] + offs_d, v.to(V_CACHE.dtype.element_ty), mask=store_mask)


def kvcache_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    rotary_interleaved: bool = False,
) -> None:
    """Launch the append on validated inputs: caches ``(B_c, S, H_KV, D)`` or paged
    ``(num_pages, page_size, H_KV, D)`` with unit last stride, k/v ``(B, N_new, H_KV, D)`` with unit last
    stride, ``cache_seqlens`` int32 ``(B,)``, ``block_table`` int32 ``(B, pages_per_seq)`` with unit last
    stride, ``cache_batch_idx`` int32 ``(B,)``, rotary tables contiguous ``(seqlen_ro, rotary_dim / 2)``."""
    batch, seqlen_new, heads_kv, head_dim = k.shape
    if batch == 0 or seqlen_new == 0:
        return
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if capacity == 0:
        return
    cfg = configs.rows_config(head_dim, k.device)
    grid = (cdiv(seqlen_new, cfg.BLOCK_M), batch, heads_kv)
    rotary_dim = 0 if rotary_cos is None else 2 * rotary_cos.shape[-1]
    launch(
        kvcache_append_kernel, grid, k.device,
        k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, rotary_cos, rotary_sin,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        block_table.stride(0) if paged else 0,
        seqlen_new, capacity, k_cache.shape[0], 0 if rotary_cos is None else rotary_cos.shape[0],
        HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=cfg.BLOCK_M, PAGE_SIZE=k_cache.shape[1] if paged else 1, INTERLEAVED=rotary_interleaved,
        IS_PAGED=paged, HAS_BATCH_IDX=cache_batch_idx is not None, num_warps=cfg.num_warps,
    )  # fmt: skip
