"""Paged and indexed KV caches read through one gather into packed (varlen) K/V.

``flash_attn_varlen_func(..., block_table=...)`` and ``flash_attn_with_kvcache`` with more than
``DECODE_MAX_SEQLEN_Q`` queries per sequence run this way: the keys every sequence attends to are copied
once into a packed ``(rows, H_KV, D)`` tensor laid out as varlen's ``cu_seqlens_k`` says, then the
portable varlen kernel runs on it. The cost is one read and one write of those keys (the packed tensor is
as large as the keys attended to, or the upper bound ``rows`` when the total is not known on the host)
on top of the attention's own read. Every index is computed on the device (no host synchronisation) and
clamped into the cache, so rows past the last sequence and unvalidated values never read out of bounds.
"""

from __future__ import annotations

import torch


def packed_positions(
    cu_seqlens: torch.Tensor, starts: torch.Tensor | None, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed row ``r < rows``: its sequence ``b`` (``cu_seqlens[b] ≤ r < cu_seqlens[b + 1]``;
    rows past the end are given to the last sequence) and its logical position in that sequence's cache,
    ``starts[b] + r − cu_seqlens[b]`` (``starts`` None = 0). Both int64 ``(rows,)``."""
    cu = cu_seqlens.long()
    r = torch.arange(rows, device=cu.device)
    seq = torch.searchsorted(cu[1:], r, right=True).clamp(max=max(cu.shape[0] - 2, 0))
    pos = r - cu[seq]
    if starts is not None:
        pos = pos + starts.long()[seq]
    return seq, pos


def gather_rows(
    cache: torch.Tensor,
    seq: torch.Tensor,
    pos: torch.Tensor,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """``cache`` rows at logical positions ``pos`` of sequences ``seq``: ``(rows, H_KV, D)``.

    Contiguous caches ``(B_c, S, H_KV, D)`` are read at row ``cache_batch_idx[seq]`` (default ``seq``);
    paged ones ``(num_pages, page_size, H_KV, D)`` at page ``block_table[seq, pos // page_size]``.
    Differentiable with respect to ``cache`` (an index, not a kernel).
    """
    length = cache.shape[1]
    if block_table is None:
        rows = seq if cache_batch_idx is None else cache_batch_idx.long()[seq]
        return cache[rows.clamp(0, cache.shape[0] - 1), pos.clamp(0, length - 1)]
    slot = (pos // length).clamp(0, block_table.shape[1] - 1)
    pages = block_table.long()[seq, slot].clamp(0, cache.shape[0] - 1)
    return cache[pages, pos.clamp(min=0) % length]


def attention_gathered(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    *,
    softmax_scale: float,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The KV-cache attention of ``flashtile.ops_kvcache.run_kvcache_attn`` through the portable varlen
    kernel: keys ``[cache_leftpad[b], seqlens_k[b])`` of each sequence gathered into packed K/V of
    ``B · capacity`` rows. Returns ``out`` ``(B, N_q, H, D)`` and ``lse`` ``(B, H, N_q)`` float32."""
    from flashtile.kernels.fwd import attn_fwd

    batch, seqlen_q, nheads, head_dim = q.shape
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
    starts = cache_leftpad
    lengths = seqlens_k.long() - (0 if starts is None else starts.long())
    cu_k = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    seq, pos = packed_positions(cu_k, starts, batch * capacity)
    k = gather_rows(k_cache, seq, pos, block_table, cache_batch_idx)
    v = gather_rows(v_cache, seq, pos, block_table, cache_batch_idx)
    cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=q.device)
    out, lse = attn_fwd(
        q.reshape(batch * seqlen_q, nheads, head_dim), k, v, softmax_scale, window_size[1] == 0,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k, max_seqlen_q=seqlen_q, max_seqlen_k=capacity,
    )  # fmt: skip
    return out.view(q.shape), lse.view(nheads, batch, seqlen_q).transpose(0, 1)


def gather_varlen(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed ``(rows, H_KV, D)`` K and V of a paged varlen batch: key ``t`` of sequence ``b`` (row
    ``cu_seqlens_k[b] + t``) from page ``block_table[b, t // page_size]``. Differentiable."""
    seq, pos = packed_positions(cu_seqlens_k, None, rows)
    return gather_rows(k_cache, seq, pos, block_table), gather_rows(v_cache, seq, pos, block_table)
