"""flash_attn_with_kvcache: incremental decoding over a contiguous or paged KV cache, flash_attn 2.8's API.

A call validates every argument (:mod:`flashtile.validation`, :mod:`flashtile.kvcache_validation`), then
runs three custom ops (:mod:`flashtile.ops_kvcache`): ``rotary`` on q, ``kvcache_append`` (the new keys,
rotated, and values written into the caches in place; the op declares that it mutates ``k_cache`` and
``v_cache``) and ``kvcache_attn`` (the split-KV decode kernel for up to 16 queries per sequence, the
paged gather and the varlen kernel beyond, the PyTorch reference on the CPU). Semantics:
docs/design/kvcache.md and :mod:`flashtile.reference.kvcache`.
"""

from __future__ import annotations

import torch

from flashtile import backend as _backend
from flashtile import kvcache_validation as checks
from flashtile import ops_kvcache as _ops
from flashtile import validation
from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.rotary import check_cos_sin

KVCacheResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _unit_last_stride(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _check_caches(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: object,
    cache_batch_idx: object,
) -> int:
    """Shapes of q and the caches; returns the page size (0 for a contiguous cache)."""
    batch = q.shape[0]
    validation.check_rank("q", q, "(batch_size, seqlen, nheads, headdim)")
    if block_table is not None:
        if cache_batch_idx is not None:
            raise FlashtileValueError(
                "cache_batch_idx indexes a contiguous cache and cannot be used with block_table (a paged "
                f"cache); got cache_batch_idx {validation.describe(cache_batch_idx)}"
            )
        page_size = checks.check_paged_cache(("k_cache", "v_cache"), k_cache, v_cache, block_table, batch)
    else:
        layout = "(batch_size_cache, seqlen_cache, nheads_k, headdim)"
        validation.check_rank("k_cache", k_cache, layout)
        validation.check_rank("v_cache", v_cache, layout)
        if k_cache.shape != v_cache.shape:
            raise FlashtileValueError(
                f"k_cache and v_cache must have the same shape {layout}; got {tuple(k_cache.shape)} and "
                f"{tuple(v_cache.shape)}"
            )
        if cache_batch_idx is None and k_cache.shape[0] < batch:
            raise FlashtileValueError(
                f"k_cache must hold a row per sequence (batch_size_cache ≥ batch_size = {batch}) unless "
                f"cache_batch_idx is given; got k_cache of shape {tuple(k_cache.shape)}"
            )
        page_size = 0
    nheads, nheads_k, head_dim = q.shape[2], k_cache.shape[2], q.shape[3]
    if k_cache.shape[3] != head_dim or not 1 <= head_dim <= validation.MAX_HEAD_DIM:
        raise FlashtileValueError(
            f"q and k_cache must have the same headdim (dim 3), in [1, {validation.MAX_HEAD_DIM}]; got q "
            f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}"
        )
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise FlashtileValueError(
            f"nheads of q ({nheads}) must be a multiple of nheads_k of k_cache ({nheads_k}) for MQA/GQA; "
            f"got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise FlashtileValueError(
                f"{name} must have a contiguous last dimension (stride 1): it is written in place; got "
                f"strides {t.stride()}"
            )
    return page_size


def _check_new(q: torch.Tensor, k_cache: torch.Tensor, k: object, v: object) -> int:
    """k and v are both None or both (batch_size, seqlen_new, nheads_k, headdim); returns seqlen_new."""
    if (k is None) != (v is None):
        raise FlashtileValueError(
            f"k and v must be given together; got k {validation.describe(k)} and v {validation.describe(v)}"
        )
    if k is None:
        return 0
    layout = "(batch_size, seqlen_new, nheads_k, headdim)"
    validation.check_rank("k", k, layout)
    validation.check_rank("v", v, layout)
    expected = (q.shape[0], k.shape[1], k_cache.shape[2], k_cache.shape[3])
    if tuple(k.shape) != expected or tuple(v.shape) != expected:
        raise FlashtileValueError(
            f"k and v must have shape {layout} = (batch_size of q, seqlen_new, nheads_k and headdim of "
            f"k_cache); got k {tuple(k.shape)}, v {tuple(v.shape)}, q {tuple(q.shape)}, "
            f"k_cache {tuple(k_cache.shape)}"
        )
    return k.shape[1]


def _check_cache_seqlens(
    cache_seqlens: object, has_new: bool, batch: int, capacity: int, seqlen_new: int, device: torch.device
) -> torch.Tensor:
    """``cache_seqlens`` as an int32 (batch_size,) tensor on ``device`` (the capacity when None); an int is
    checked against the capacity on the host."""
    if cache_seqlens is None:
        if has_new:
            raise FlashtileValueError(
                "cache_seqlens must be given with k and v: it says where the new keys go; got None"
            )
        return torch.full((batch,), capacity, dtype=torch.int32, device=device)
    if validation._is_int(cache_seqlens):
        if seqlen_new > capacity:
            # No cache_seqlens fits: "must be in [0, <negative>]" would blame the wrong argument.
            raise FlashtileValueError(
                f"the KV cache is too short: seqlen_new (k dim 1) is {seqlen_new} > the capacity {capacity}; "
                "nothing was written. Allocate a longer cache"
            )
        if not 0 <= cache_seqlens <= capacity - seqlen_new:
            raise FlashtileValueError(
                f"cache_seqlens must be in [0, {capacity - seqlen_new}] (capacity {capacity} − seqlen_new "
                f"{seqlen_new}); got {cache_seqlens}; nothing was written"
            )
        return torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=device)
    if not isinstance(cache_seqlens, torch.Tensor):
        # check_int_tensor's message would omit that an int is accepted too.
        raise FlashtileTypeError(
            f"cache_seqlens must be an int or a torch.int32 tensor of shape (batch_size,) on {device}, or "
            f"None; got {validation.describe(cache_seqlens)} ({type(cache_seqlens).__name__})"
        )
    checks.check_int_tensor("cache_seqlens", cache_seqlens, batch, device)
    return cache_seqlens.contiguous()


def _check_rotary(
    rotary_cos: object, rotary_sin: object, has_new: bool, head_dim: int, capacity: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if rotary_cos is None and rotary_sin is None:
        return None, None
    if rotary_cos is None or rotary_sin is None:
        raise FlashtileValueError(
            "rotary_cos and rotary_sin must be given together; got rotary_cos "
            f"{validation.describe(rotary_cos)} and rotary_sin {validation.describe(rotary_sin)}"
        )
    if not has_new:
        raise FlashtileValueError(
            "rotary_cos and rotary_sin need the new k and v (they rotate the keys being appended); got k=None"
        )
    check_cos_sin(rotary_cos, rotary_sin, head_dim, device, ("rotary_cos", "rotary_sin"))
    if rotary_cos.shape[0] < capacity:
        raise FlashtileValueError(
            "rotary_cos and rotary_sin must have at least as many rows as the cache's capacity "
            f"({capacity}); got shape {tuple(rotary_cos.shape)}"
        )
    return rotary_cos.contiguous(), rotary_sin.contiguous()


def _check_num_splits(num_splits: object) -> int:
    if not validation._is_int(num_splits) or num_splits < 0:
        raise FlashtileTypeError(
            f"num_splits must be an int ≥ 0 (0 = chosen by a heuristic); got {num_splits!r}"
        )
    return int(num_splits)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> KVCacheResult:
    """Attention of a few new query tokens over a KV cache, appending the new keys and values to the cache
    in place first (flash_attn 2.8's ``flash_attn_with_kvcache``).

    If k and v are given, they are written *in place* into k_cache and v_cache at positions
    ``cache_seqlens[b]``, ``cache_seqlens[b] + 1``, …; the attention then sees them. ``cache_seqlens``
    itself is not updated (as in flash_attn): advance it yourself. Appending past the cache's capacity
    is an error raised before anything is written. With rotary_cos and rotary_sin, the new keys are
    rotated to their positions ``cache_seqlens[b] + i``; the queries to ``cache_seqlens[b] + i`` if the
    attention is causal or local (a window), else all to ``cache_seqlens[b]``.

    Sequence ``b`` attends to the keys at positions ``[cache_leftpad[b], cache_seqlens[b] + seqlen_new)``
    of its cache: ``N_k`` keys, counted from cache_leftpad[b]. Causal and windows are bottom-right
    aligned (query ``i`` sits at key ``i + N_k − seqlen_q``; window ``[i + N_k − seqlen_q − left,
    i + N_k − seqlen_q + right]``), and ALiBi adds ``−slope · |i + N_k − seqlen_q − j|``, as in
    :func:`flashtile.flash_attn_func`. MQA/GQA: query head ``h`` reads KV head ``h // (nheads // nheads_k)``.
    Nothing outside those keys is read into the result: NaN or garbage in unused slots and pages is fine.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim). seqlen ≥ 1 (any length; up to 16 run in the split-KV
            decode kernel, longer ones gather the keys into a packed copy first).
        k_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim) without block_table, or
            (num_pages, page_size, nheads_k, headdim) with it; page_size a multiple of 16. Last dim
            contiguous (written in place).
        v_cache: like k_cache.
        k, v [optional]: (batch_size, seqlen_new, nheads_k, headdim), the new keys and values.
            q, k_cache, v_cache, k and v share one dtype and device: float16 or bfloat16 on CUDA
            (float32 too under Triton's CPU interpreter); float16, bfloat16, float32 or float64 on the CPU
            reference. headdim 1 to 576, the same in all five (v_cache has k_cache's shape, so V's head
            dim is Q's, unlike flash_attn_func's D_v). nheads % nheads_k == 0.
        rotary_cos, rotary_sin [optional]: (seqlen_ro, rotary_dim / 2), floating, on q's device;
            rotary_dim = 2 · rotary_cos.shape[1] ≤ headdim (any even value), seqlen_ro ≥ the capacity
            (seqlen_cache, or pages_per_sequence · page_size). Only with k and v.
        cache_seqlens: int, or (batch_size,) torch.int32 on q's device, ≥ 0: where each sequence's cached
            keys end (left padding included). None means full caches (then k and v must be None).
        cache_batch_idx [optional]: (batch_size,) torch.int32, values in [0, batch_size_cache): the cache
            row of each sequence (default b). Not with block_table. Duplicates with k and v given: which
            write wins is undefined, as in flash_attn.
        cache_leftpad [optional]: (batch_size,) torch.int32, 0 ≤ cache_leftpad ≤ cache_seqlens: where
            each sequence's keys start.
        block_table [optional]: (batch_size, pages_per_sequence) torch.int32: position t of sequence b is
            row t % page_size of page block_table[b, t // page_size]. The entries covering positions
            [0, cache_seqlens[b] + seqlen_new) must be in [0, num_pages); the rest are never read.
        softmax_scale: float or None (1 / sqrt(headdim)).
        causal: bool. Bottom-right aligned causal mask.
        window_size: (left, right), −1 = unlimited; a bound ≥ the capacity is unlimited; causal sets
            right = 0.
        softcap: float, > 0 enables softcapping (``softcap · tanh(s / softcap)``).
        rotary_interleaved: bool, default True. GPT-J pairs (0 & 1, 2 & 3, …) if True, else GPT-NeoX
            halves (0 & rotary_dim / 2, …).
        alibi_slopes [optional]: float32 (nheads,) or (batch_size, nheads).
        num_splits: int ≥ 0. Splits of the cache length for the decode kernel; 0 = a heuristic.
        return_softmax_lse: bool. Also return the log-sum-exp.

    Returns:
        out: (batch_size, seqlen, nheads, headdim), q's dtype.
        softmax_lse [if return_softmax_lse]: (batch_size, nheads, seqlen), float32 (float64 for float64
            inputs), natural log; −inf for a query that sees no key (out = 0 there).
        Neither requires grad: there is no backward, as in flash_attn.

    Checks and synchronisation: every shape, dtype and device is checked before any launch. The values
    (cache_seqlens + seqlen_new against the capacity, cache_leftpad, cache_batch_idx, the block_table
    entries used) are reduced on the device and read back once: one host synchronisation per call on
    CUDA tensors (none for an int cache_seqlens without cache_leftpad, cache_batch_idx or block_table;
    free on the CPU). Inside torch.compile or CUDA graph capture that read cannot happen and these value
    checks are skipped: the append kernel still never writes outside the slots it targets.

    Where flashtile differs from flash_attn 2.8: headdim up to 576 (flash_attn: 256); any page size that
    is a multiple of 16 (flash_attn: 256); any even rotary_dim (flash_attn: multiples of 16) and float32
    rotary tables; cache_leftpad with block_table is allowed (flash_attn refuses it); seqlen may exceed the
    cache's length; a query seeing no key has softmax_lse = −inf (flash_attn: +inf); the reference on the
    CPU also takes float32 and float64; errors are ValueError/TypeError that are also RuntimeError.

    Example::

        >>> k_cache = torch.zeros(2, 1024, 2, 64, dtype=torch.float16, device="cuda")
        >>> v_cache = torch.zeros_like(k_cache)
        >>> lengths = torch.tensor([10, 700], dtype=torch.int32, device="cuda")
        >>> q = torch.randn(2, 1, 8, 64, dtype=torch.float16, device="cuda")  # one new token, GQA 8/2
        >>> k_new, v_new = torch.randn(2, 2, 1, 2, 64, dtype=torch.float16, device="cuda").unbind(0)
        >>> out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lengths,
        ...                               causal=True)
        >>> lengths += 1  # the caller advances the lengths
        >>> out.shape
        torch.Size([2, 1, 8, 64])
    """
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    tensors.update({name: t for name, t in (("k", k), ("v", v)) if t is not None})
    validation.check_tensors(**tensors)
    validation.check_same_device(**tensors)
    backend = _backend.resolve(q.device)
    validation.check_dtypes(backend, **tensors)
    page_size = _check_caches(q, k_cache, v_cache, block_table, cache_batch_idx)
    seqlen_new = _check_new(q, k_cache, k, v)
    batch, _, nheads, head_dim = q.shape
    capacity = block_table.shape[1] * page_size if block_table is not None else k_cache.shape[1]
    host_seqlens = validation._is_int(cache_seqlens)
    cache_seqlens = _check_cache_seqlens(cache_seqlens, k is not None, batch, capacity, seqlen_new, q.device)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            checks.check_int_tensor(name, t, batch, q.device)
    rotary_cos, rotary_sin = _check_rotary(
        rotary_cos, rotary_sin, k is not None, head_dim, capacity, q.device
    )
    options = validation.check_options(
        0.0, window_size, softcap, alibi_slopes, causal, False, False, capacity, batch, nheads, q.device
    )
    interleaved = validation.check_flag("rotary_interleaved", rotary_interleaved)
    return_lse = validation.check_flag("return_softmax_lse", return_softmax_lse)
    num_splits = _check_num_splits(num_splits)
    scale = validation.check_softmax_scale(softmax_scale, head_dim)
    needs_device_values = not host_seqlens or any(
        t is not None for t in (cache_leftpad, cache_batch_idx, block_table)
    )
    if needs_device_values and checks.values_checkable(q.device):
        checks.check_values(
            cache_seqlens, seqlen_new, capacity, cache_leftpad, cache_batch_idx, k_cache.shape[0],
            block_table, k_cache.shape[0], page_size,
        )  # fmt: skip
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    block_table, cache_batch_idx, cache_leftpad = (
        None if t is None else t.contiguous() for t in (block_table, cache_batch_idx, cache_leftpad)
    )
    compiling = torch.compiler.is_compiling()
    if not compiling:
        try:
            _ops.check_kvcache_attn(q, k_cache, v_cache, block_table, cache_leftpad, backend)
        except ValueError as error:
            raise FlashtileValueError(f"{error}; nothing was written") from error
    with torch.no_grad():
        if rotary_cos is not None:
            q = _rotate_query(
                q, rotary_cos, rotary_sin, cache_seqlens, interleaved, options.window_size, backend
            )
        if k is not None:
            append = _ops.kvcache_append if compiling else _ops.run_kvcache_append
            append(
                k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, rotary_cos, rotary_sin,
                interleaved, backend,
            )  # fmt: skip
        attend = _ops.kvcache_attn if compiling else _ops.run_kvcache_attn
        # A decode step that appends nothing attends to cache_seqlens as given: no add kernel.
        seen = cache_seqlens + seqlen_new if seqlen_new else cache_seqlens
        out, lse = attend(
            q, k_cache, v_cache, seen, block_table, cache_batch_idx, cache_leftpad,
            scale, *options.window_size, options.softcap, options.alibi_slopes, num_splits, backend,
        )  # fmt: skip
    return (out, lse) if return_lse else out


def _rotate_query(
    q: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache_seqlens: torch.Tensor,
    interleaved: bool,
    window: tuple[int, int],
    backend: str,
) -> torch.Tensor:
    """q rotated to ``cache_seqlens[b] + i`` under causal or local attention, else all to
    ``cache_seqlens[b]`` (the queries of a sequence seen as the heads of one token)."""
    rotate = _ops.rotary if torch.compiler.is_compiling() else _ops.run_rotary
    if window != (-1, -1):
        return rotate(q, cos, sin, interleaved, 0, cache_seqlens, None, q.shape[1], False, backend)
    batch, seqlen_q, nheads, head_dim = q.shape
    flat = q.reshape(batch, 1, seqlen_q * nheads, head_dim)
    return rotate(flat, cos, sin, interleaved, 0, cache_seqlens, None, 1, False, backend).view(q.shape)
