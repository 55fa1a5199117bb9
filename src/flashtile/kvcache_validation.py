"""Argument checks of flash_attn_with_kvcache and of paged KV caches (``block_table``), run before anything
launches or writes.

Errors name the argument, what was received and what is accepted (:mod:`flashtile.errors`). Shapes, dtypes
and devices are checked on the host for free. The values (cache lengths against the capacity, left
padding, batch indices, the block_table entries a call uses) live on the device: :func:`check_values`
reduces them there and reads one small summary back, so a call on CUDA tensors costs one host
synchronisation, as flash_attn's own check of paged caches does; on CPU tensors and Python ints it is free.
Inside torch.compile or a CUDA graph capture a host read is impossible and the value checks are skipped;
the append kernel then still writes nothing outside the target slots (docs/design/kvcache.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashtile import validation
from flashtile.errors import FlashtileTypeError, FlashtileValueError

# The decode kernel loads whole 16-row tiles of a page.
PAGE_MULTIPLE = 16


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_int_tensor(
    name: str, t: object, batch: int, device: torch.device, dims: str = "(batch_size,)"
) -> None:
    """``t`` is an int32 tensor of shape ``dims`` (first dim ``batch``) on ``device``."""
    accepted = f"a torch.int32 tensor of shape {dims} on {device}"
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        raise FlashtileTypeError(f"{name} must be {accepted}; got {validation.describe(t)}")
    if t.dtype != torch.int32:
        raise FlashtileTypeError(f"{name} must be {accepted}; got dtype {t.dtype}")
    if t.dim() != dims.count(",") + (0 if dims.endswith(",)") else 1) or t.shape[0] != batch:
        raise FlashtileValueError(f"{name} must be {accepted} (batch_size = {batch}); got shape {_shape(t)}")
    if t.device != torch.device(device):
        raise FlashtileValueError(f"{name} must be {accepted}; got a tensor on {t.device}")


def check_paged_cache(
    names: tuple[str, str], k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: object, batch: int
) -> int:
    """A paged cache: ``(num_pages, page_size, nheads_k, headdim)`` k and v of one shape, ``page_size`` a
    multiple of 16, ``block_table`` int32 ``(batch_size, pages_per_sequence)`` on their device; returns
    page_size."""
    check_int_tensor("block_table", block_table, batch, k_cache.device, "(batch_size, pages_per_sequence)")
    layout = "(num_pages, page_size, nheads_k, headdim)"
    validation.check_rank(names[0], k_cache, layout)
    validation.check_rank(names[1], v_cache, layout)
    if k_cache.shape != v_cache.shape:
        raise FlashtileValueError(
            f"{names[0]} and {names[1]} must have the same shape {layout}; got {_shape(k_cache)} and "
            f"{_shape(v_cache)}"
        )
    page_size = k_cache.shape[1]
    if page_size == 0 or page_size % PAGE_MULTIPLE != 0:
        raise FlashtileValueError(
            f"the page size ({names[0]} dim 1) must be a positive multiple of {PAGE_MULTIPLE}; got "
            f"{names[0]} of shape {_shape(k_cache)}"
        )
    return page_size


class Summary(NamedTuple):
    """The device values a call depends on, reduced to what the checks need (Python ints)."""

    min_seqlen: int
    overflow: int
    min_leftpad: int
    leftpad_past_end: int
    min_batch_idx: int
    max_batch_idx: int
    bad_pages: int


def values_checkable(device: torch.device) -> bool:
    """Whether the host may read device values now: not inside torch.compile or a CUDA graph capture."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing())


def needed_pages_bad(
    block_table: torch.Tensor, ends: torch.Tensor, page_size: int, num_pages: int
) -> torch.Tensor:
    """How many of the entries a call uses (those covering positions ``[0, ends[b])`` of row ``b``) are
    outside ``[0, num_pages)``: an int64 0-d tensor, on the device."""
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size < ends[:, None]
    return (used & ((block_table < 0) | (block_table >= num_pages))).sum()


def check_values(
    cache_seqlens: torch.Tensor,
    seqlen_new: int,
    capacity: int,
    cache_leftpad: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    batch_cache: int,
    block_table: torch.Tensor | None,
    num_pages: int,
    page_size: int,
) -> None:
    """The value checks of flash_attn_with_kvcache, from one device-to-host read of a 7-int summary."""
    if cache_seqlens.numel() == 0:
        return  # An empty batch reads and writes nothing (and min() of nothing is an error).
    seqlens = cache_seqlens.long()
    ends = seqlens + seqlen_new
    zero = seqlens.new_zeros(())
    parts = [seqlens.min(), (ends - capacity).max()]
    if cache_leftpad is not None:
        parts += [cache_leftpad.long().min(), (cache_leftpad.long() - seqlens).max()]
    else:
        parts += [zero, zero - 1]
    if cache_batch_idx is not None:
        parts += [cache_batch_idx.long().min(), cache_batch_idx.long().max()]
    else:
        parts += [zero, zero]
    parts.append(zero if block_table is None else needed_pages_bad(block_table, ends, page_size, num_pages))
    summary = Summary(*torch.stack(parts).tolist())
    if summary.min_seqlen < 0:
        raise FlashtileValueError(f"cache_seqlens must be ≥ 0; got {cache_seqlens.tolist()}")
    if summary.overflow > 0:
        what = "cache_seqlens" + (f" + seqlen_new ({seqlen_new})" if seqlen_new else "")
        where = (
            "pages_per_sequence × page_size" if block_table is not None else "seqlen_cache (k_cache dim 1)"
        )
        raise FlashtileValueError(
            f"the KV cache is too short: {what} reaches {max(ends.tolist())} > the capacity {capacity} "
            f"({where}); nothing was written. Got cache_seqlens {cache_seqlens.tolist()}; allocate a longer "
            "cache" + (" or more block_table columns" if block_table is not None else "")
        )
    if summary.min_leftpad < 0 or summary.leftpad_past_end > 0:
        raise FlashtileValueError(
            "cache_leftpad must satisfy 0 ≤ cache_leftpad ≤ cache_seqlens; got cache_leftpad "
            f"{cache_leftpad.tolist()} and cache_seqlens {cache_seqlens.tolist()}"
        )
    # Without cache_batch_idx the summary holds 0s, which a cache of 0 rows (or pages) would fail.
    if cache_batch_idx is not None and (summary.min_batch_idx < 0 or summary.max_batch_idx >= batch_cache):
        raise FlashtileValueError(
            f"cache_batch_idx values must be in [0, {batch_cache}) (k_cache dim 0); got "
            f"{cache_batch_idx.tolist()}"
        )
    if summary.bad_pages > 0:
        raise FlashtileValueError(
            f"block_table entries must be page numbers in [0, {num_pages}) (k_cache dim 0) for every page a "
            f"sequence uses; got {summary.bad_pages} out of range among the first ceil((cache_seqlens + "
            f"seqlen_new) / {page_size}) of each row: {block_table.tolist()}"
        )


def check_paged_varlen(
    k: object, v: object, block_table: object, cu_seqlens_k: object, max_seqlen_k: object
) -> int:
    """flash_attn_varlen_func with ``block_table``: k and v a paged cache on one device, the table
    ``(batch_size, pages_per_sequence)`` with ``batch_size = len(cu_seqlens_k) − 1``; returns how many
    packed rows to gather.

    As for every varlen call, values are checked on CPU tensors and, on CUDA, under ``FLASHTILE_DEBUG=1``
    (:mod:`flashtile.validation`): then the rows are exactly ``cu_seqlens_k[-1]``, every sequence fits in
    its pages and the pages it uses are in range. Otherwise no host read happens and the rows are the
    bound ``batch_size · max_seqlen_k``.
    """
    validation.check_tensors(k=k, v=v)
    validation.check_same_device(k=k, v=v)
    if not isinstance(cu_seqlens_k, torch.Tensor) or cu_seqlens_k.dim() != 1 or cu_seqlens_k.shape[0] < 1:
        raise FlashtileValueError(
            "cu_seqlens_k must be a 1-D torch.int32 tensor (batch_size + 1,); got "
            f"{validation.describe(cu_seqlens_k)}"
        )
    batch = cu_seqlens_k.shape[0] - 1
    page_size = check_paged_cache(("k", "v"), k, v, block_table, batch)
    max_k = validation.check_max_seqlen("max_seqlen_k", max_seqlen_k)
    capacity = block_table.shape[1] * page_size
    checked = not torch.compiler.is_compiling() and (k.device.type == "cpu" or validation._debug())
    if not checked:
        return batch * max_k
    check_int_tensor("cu_seqlens_k", cu_seqlens_k, batch + 1, k.device, "(batch_size + 1,)")
    ends = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long()
    longest = int(ends.max()) if batch else 0
    if longest > capacity:
        raise FlashtileValueError(
            f"a sequence of {longest} keys (cu_seqlens_k) does not fit in block_table's "
            f"{block_table.shape[1]} pages of {page_size}: capacity {capacity}"
        )
    bad = int(needed_pages_bad(block_table, ends, page_size, k.shape[0])) if batch else 0
    if bad:
        raise FlashtileValueError(
            f"block_table entries must be page numbers in [0, {k.shape[0]}) (k dim 0) for every page a "
            f"sequence uses; got {bad} out of range: {block_table.tolist()}"
        )
    return int(cu_seqlens_k[-1])
