"""flash_attn_with_kvcache by definition: the cache append, rotary and attention over a contiguous or paged KV
cache, in PyTorch. The CPU backend decodes through it and it is the tests' oracle (float64 capable).

Per sequence ``b`` of a batch (docs/design/kvcache.md has the whole contract):

- the cache row is ``cache_batch_idx[b]`` (default ``b``) of a contiguous cache ``(B_c, S, H_KV, D)``;
  a paged cache ``(num_pages, page_size, H_KV, D)`` holds logical position ``t`` of sequence ``b`` at
  page ``block_table[b, t // page_size]``, row ``t % page_size``;
- ``cache_seqlens[b]`` is the end of the cached keys (an absolute position: left padding included) and
  the ``N_new`` new keys/values go to positions ``cache_seqlens[b] + i``; with rotary, new key ``i`` is
  rotated to that same position;
- attention then runs over the keys at positions ``[cache_leftpad[b], cache_seqlens[b] + N_new)``, of
  which there are ``N_k``; the masks and ALiBi count key ``j`` from ``cache_leftpad[b]`` and are
  bottom-right aligned as in flash_attn_func (query ``i`` sits at key ``i + N_k − N_q``);
- with rotary, query ``i`` is rotated to position ``cache_seqlens[b] + i`` when the attention is causal
  or local, else every query to ``cache_seqlens[b]``.

Nothing here imports the kernels.
"""

from __future__ import annotations

import torch

from flashtile.reference import naive
from flashtile.reference.rotary import apply_rotary


def capacity(k_cache: torch.Tensor, block_table: torch.Tensor | None) -> int:
    """Positions a sequence can hold: the cache's length, or pages per sequence × page size."""
    if block_table is None:
        return k_cache.shape[1]
    return block_table.shape[1] * k_cache.shape[1]


def _locate(
    positions: torch.Tensor,
    batch_rows: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index0, index1, inside)``: where logical ``positions`` of sequences ``batch_rows`` (broadcast
    together) live in the cache, and which of them are inside it (capacity, page numbers)."""
    positions, batch_rows = torch.broadcast_tensors(positions.long(), batch_rows.long())
    inside = (positions >= 0) & (positions < capacity(k_cache, block_table))
    if block_table is None:
        rows = batch_rows if cache_batch_idx is None else cache_batch_idx.long()[batch_rows]
        return rows, positions.clamp(0, k_cache.shape[1] - 1), inside
    page_size = k_cache.shape[1]
    slot = (positions // page_size).clamp(0, block_table.shape[1] - 1)
    pages = block_table.long()[batch_rows, slot]
    inside &= (pages >= 0) & (pages < k_cache.shape[0])
    return pages.clamp(0, k_cache.shape[0] - 1), positions % page_size, inside


def append(
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
    """Write ``k`` (rotated to positions ``cache_seqlens[b] + i`` when ``rotary_cos`` is given) and ``v``,
    ``(B, N_new, H_KV, D)``, into the caches at those positions, in place. A position outside the cache
    (past its capacity, on a page number out of range) is not written: validated calls have none.

    >>> k_cache = torch.zeros(1, 4, 1, 2)
    >>> append(k_cache, torch.zeros(1, 4, 1, 2), torch.ones(1, 2, 1, 2), torch.ones(1, 2, 1, 2),
    ...        torch.tensor([1], dtype=torch.int32))
    >>> k_cache[0, :, 0, 0].tolist()
    [0.0, 1.0, 1.0, 0.0]
    """
    batch, seqlen_new = k.shape[:2]
    positions = cache_seqlens.long()[:, None] + torch.arange(seqlen_new, device=k.device)
    if rotary_cos is not None:
        k = apply_rotary(
            k, rotary_cos, rotary_sin, interleaved=rotary_interleaved, seqlen_offsets=cache_seqlens
        )
    batch_rows = torch.arange(batch, device=k.device)[:, None]
    index0, index1, inside = _locate(positions, batch_rows, k_cache, block_table, cache_batch_idx)
    for cache, new in ((k_cache, k), (v_cache, v)):
        cache[index0[inside], index1[inside]] = new[inside].to(cache.dtype)


def rotate_query(
    q: torch.Tensor,
    rotary_cos: torch.Tensor,
    rotary_sin: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    interleaved: bool,
    consecutive: bool,
) -> torch.Tensor:
    """q ``(B, N_q, H, D)`` rotated: query ``i`` to position ``cache_seqlens[b] + i`` when
    ``consecutive`` (causal or local attention), else every query to ``cache_seqlens[b]``."""
    if consecutive:
        return apply_rotary(q, rotary_cos, rotary_sin, interleaved=interleaved, seqlen_offsets=cache_seqlens)
    batch, seqlen_q, nheads, head_dim = q.shape
    # All the queries of a sequence as the heads of one token: one position for all.
    flat = q.reshape(batch, 1, seqlen_q * nheads, head_dim)
    rotated = apply_rotary(
        flat, rotary_cos, rotary_sin, interleaved=interleaved, seqlen_offsets=cache_seqlens
    )
    return rotated.reshape(q.shape)


def gather(
    cache: torch.Tensor,
    b: int,
    start: int,
    stop: int,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positions ``[start, stop)`` of sequence ``b``: ``(stop − start, H_KV, D)``."""
    positions = torch.arange(start, stop, device=cache.device)
    index0, index1, _ = _locate(
        positions, torch.tensor(b, device=cache.device), cache, block_table, cache_batch_idx
    )
    return cache[index0, index1]


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q ``(B, N_q, H, D)`` over the keys at positions ``[cache_leftpad[b], seqlens_k[b])``
    of each sequence (:func:`naive.attention` per sequence, so every option means what it means there;
    ``window_size`` literal, causal being ``right = 0``).

    Returns ``out`` ``(B, N_q, H, D)`` in q's dtype and ``lse`` ``(B, H, N_q)`` float32 (float64 for
    float64); a sequence with no key gives ``out = 0``, ``lse = −∞``.
    """
    ends = seqlens_k.tolist()
    starts = [0] * len(ends) if cache_leftpad is None else cache_leftpad.tolist()
    outs, lses = [], []
    for b, (start, stop) in enumerate(zip(starts, ends, strict=True)):
        k = gather(k_cache, b, start, stop, block_table, cache_batch_idx)
        v = gather(v_cache, b, start, stop, block_table, cache_batch_idx)
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        out, lse = naive.attention(
            q[b : b + 1], k[None], v[None], softmax_scale=softmax_scale, window_size=window_size,
            softcap=softcap, alibi_slopes=slopes,
        )  # fmt: skip
        outs.append(out.to(q.dtype))
        lses.append(lse)
    if not outs:
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return q.new_zeros(q.shape), q.new_zeros((0, q.shape[2], q.shape[1]), dtype=lse_dtype)
    return torch.cat(outs), torch.cat(lses)


def with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_with_kvcache's whole semantics on valid inputs: appends to the caches in place and
    returns ``(out, lse)``. ``cache_seqlens`` is an int tensor ``(B,)``, or None for full caches.

    As flash_attn does, a window bound ≥ the capacity is unlimited and causal sets ``right = 0``.

    >>> k_cache = v_cache = torch.ones(1, 8, 1, 4, dtype=torch.float64)
    >>> q = torch.ones(1, 1, 1, 4, dtype=torch.float64)
    >>> out, lse = with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([3]))
    >>> round(lse.item(), 6)  # three keys with score 1: log(3e)
    2.098612
    """
    cap = capacity(k_cache, block_table)
    if cache_seqlens is None:
        cache_seqlens = torch.full((q.shape[0],), cap, dtype=torch.int32, device=q.device)
    left, right = (-1 if w < 0 or w >= cap else int(w) for w in window_size)
    if causal:
        right = 0
    if k is not None:
        append(
            k_cache, v_cache, k, v, cache_seqlens, block_table=block_table, cache_batch_idx=cache_batch_idx,
            rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
        )  # fmt: skip
        if rotary_cos is not None:
            q = rotate_query(
                q, rotary_cos, rotary_sin, cache_seqlens, interleaved=rotary_interleaved,
                consecutive=(left, right) != (-1, -1),
            )  # fmt: skip
    seqlens_k = cache_seqlens + (0 if k is None else k.shape[1])
    return attention(
        q, k_cache, v_cache, seqlens_k, softmax_scale=softmax_scale, block_table=block_table,
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, window_size=(left, right),
        softcap=softcap, alibi_slopes=alibi_slopes,
    )  # fmt: skip
