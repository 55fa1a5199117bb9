"""The inference custom ops ``torch.ops.flashtile.rotary``, ``kvcache_append`` and ``kvcache_attn``, their
fake implementations, and the plain ``run_*`` functions that implement them.

Each dispatches on its ``backend`` argument (``"triton"`` or ``"reference"``, :mod:`flashtile.backend`) and
takes validated inputs (:mod:`flashtile.kvcache_validation`). ``kvcache_append`` declares that it mutates
``k_cache`` and ``v_cache`` (``mutates_args``), so torch.compile orders the attention after the append and
functionalises the in-place write; the others are functional. Eagerly the callers use the ``run_*``
functions, which skip the dispatcher's per-call cost; under torch.compile they call the ops.

``kvcache_attn`` takes the caches as they are after the append, ``seqlens_k`` the end of each sequence's
keys (``cache_seqlens + seqlen_new``), the window normalised with causal folded into ``right = 0``, and q
already rotated: docs/design/kvcache.md.
"""

from __future__ import annotations

import torch

from flashtile.backend import BACKENDS
from flashtile.ops import lse_dtype

# Query lengths the split-KV decode kernel takes; longer ones run through the paged gather and the
# portable varlen kernel (docs/design/kvcache.md).
DECODE_MAX_SEQLEN_Q = 16


def _kernel_family(backend: str) -> str:
    """``"reference"`` or ``"triton"``: rotary, the append and decoding have no Gluon kernels, so the hopper
    backend runs them with the portable Triton kernels."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    return "reference" if backend == "reference" else "triton"


def run_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    offset: int,
    offsets: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    max_seqlen: int,
    conjugate: bool,
    backend: str,
) -> torch.Tensor:
    """``x`` rotated (a new tensor, x's dtype and shape); positions start at ``offsets[b]`` when given,
    else at ``offset``."""
    backend = _kernel_family(backend)
    seqlen_offsets = offset if offsets is None else offsets
    if backend == "triton":
        from flashtile.kernels.rotary import apply_rotary

        return apply_rotary(
            x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen, conjugate=conjugate,
        )  # fmt: skip
    from flashtile.reference.rotary import apply_rotary

    return apply_rotary(
        x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
        conjugate=conjugate,
    ).contiguous()  # fmt: skip


rotary = torch.library.custom_op("flashtile::rotary", run_rotary, mutates_args=())


@rotary.register_fake
def _rotary_fake(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    offset: int,
    offsets: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    max_seqlen: int,
    conjugate: bool,
    backend: str,
) -> torch.Tensor:
    return torch.empty_like(x)


def run_kvcache_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    rotary_interleaved: bool,
    backend: str,
) -> None:
    """Write ``k`` (rotated at positions ``cache_seqlens[b] + i`` when ``rotary_cos`` is given) and ``v``
    into the caches at slots ``cache_seqlens[b] + i``, in place; no other element of the caches changes."""
    backend = _kernel_family(backend)
    if k.shape[0] == 0 or k.shape[1] == 0:
        return
    if backend == "triton":
        from flashtile.kernels.kvcache_append import kvcache_append as launch
    else:
        from flashtile.reference.kvcache import append as launch
    launch(
        k_cache, v_cache, k, v, cache_seqlens, block_table=block_table, cache_batch_idx=cache_batch_idx,
        rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
    )  # fmt: skip


kvcache_append = torch.library.custom_op(
    "flashtile::kvcache_append", run_kvcache_append, mutates_args=("k_cache", "v_cache")
)


@kvcache_append.register_fake
def _kvcache_append_fake(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    rotary_interleaved: bool,
    backend: str,
) -> None:
    return None


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


def _runs_decode_kernel(q: torch.Tensor, backend: str) -> bool:
    """:func:`run_kvcache_attn`'s route to the split-KV decode kernel: short queries, not the reference."""
    return _kernel_family(backend) == "triton" and q.shape[1] <= DECODE_MAX_SEQLEN_Q


def check_kvcache_attn(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    backend: str,
) -> None:
    """The errors :func:`run_kvcache_attn`'s kernel choice raises at launch (FLASHTILE_DECODE_KERNEL),
    raised now: flash_attn_with_kvcache calls this before its append writes the cache."""
    if _runs_decode_kernel(q, backend):
        from flashtile.kernels.decode import check_kernel_choice

        check_kernel_choice(q, k_cache, v_cache, block_table, cache_leftpad)


def run_kvcache_attn(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    num_splits: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of q ``(B, N_q, H, D)`` over keys ``[cache_leftpad[b], seqlens_k[b])`` of each
    sequence's cache: ``out`` like q (contiguous), ``lse`` ``(B, H, N_q)`` float32 (float64 for float64)."""
    backend = _kernel_family(backend)
    if 0 in q.shape:
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        return out, torch.full(_lse_shape(q), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    options = dict(
        block_table=block_table, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        window_size=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    if backend == "reference":
        from flashtile.reference.kvcache import attention

        out, lse = attention(q, k_cache, v_cache, seqlens_k, softmax_scale=softmax_scale, **options)
    elif _runs_decode_kernel(q, backend):
        # Imported on first use: the split-KV decode kernel lives in its own module.
        from flashtile.kernels.decode import decode_fwd

        out, lse = decode_fwd(
            q, k_cache, v_cache, seqlens_k, softmax_scale=softmax_scale, num_splits=num_splits, **options
        )
    else:
        from flashtile.paged import attention_gathered

        out, lse = attention_gathered(q, k_cache, v_cache, seqlens_k, softmax_scale=softmax_scale, **options)
    return out.to(q.dtype).contiguous(), lse.to(lse_dtype(q.dtype)).contiguous()


kvcache_attn = torch.library.custom_op("flashtile::kvcache_attn", run_kvcache_attn, mutates_args=())


@kvcache_attn.register_fake
def _kvcache_attn_fake(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    num_splits: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=lse_dtype(q.dtype))
