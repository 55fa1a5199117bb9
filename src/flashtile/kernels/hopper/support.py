"""Which calls the Hopper (Gluon) kernels run: each check returns None, or the reason a call goes elsewhere.

The backend rule (:mod:`flashtile.backend`) hands a call with a reason to the portable Triton kernels, or
raises with the reason under ``FLASHTILE_BACKEND=hopper``. The checks read shapes, strides and options only:
they cost microseconds and never synchronise.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

import torch

from flashtile.kernels.configs import HOPPER_FWD_HEAD_DIMS

DTYPES = (torch.float16, torch.bfloat16)
# TMA reads from 16-byte aligned addresses with 16-byte aligned strides and a unit last stride.
_TMA_ALIGN_BYTES = 16
# The Gluon forward's variable-length path (docs/design/hopper.md, "Variable length"): test_gpu_hopper.py
# passed on an H100 with it (168 cases, 28 of them varlen; sixth session of 2026-11-23). Where this is off,
# FLASHTILE_HOPPER_FWD_VARLEN=1 routes packed batches there.
GPU_CHECKED_VARLEN = True
VARLEN_ENV = "FLASHTILE_HOPPER_FWD_VARLEN"


# Block sizes of a block mask the Gluon kernels take: the forward's programs own 128 query rows, the
# backward's key blocks are 128 rows, and each must lie inside one of the mask's blocks.
SPARSE_BLOCKS = (128, 256)
# A block mask's mask_mod runs inside the Gluon kernels (a @triton.jit function compiles in Gluon when it
# uses elementwise operations and tl.load only); FLASHTILE_HOPPER_MASK_MOD=0 sends them to the portable ones.
MASK_MOD_ENV = "FLASHTILE_HOPPER_MASK_MOD"


def block_mask_unsupported_reason(mods: object, varlen: bool) -> str | None:
    """Why the Gluon kernels do not take these mods (:class:`flashtile.mods.Mods` or None), or None: they
    take a block mask of 128 or 256-row blocks on both sides, with its mask_mod in the partial blocks
    (unless ``FLASHTILE_HOPPER_MASK_MOD=0``), on dense batches; a mask_mod without a block mask (every tile
    partial), ``score_mod`` and packed batches with a block mask go to the portable kernels."""
    if mods is None:
        return None
    block_mask = mods.block_mask
    if mods.score_mod is not None or mods.score_mod_bwd is not None:
        return "score_mod is not in the Hopper kernels"
    if block_mask is None:
        return "a mask_mod without a block mask is not in the Hopper kernels (create_block_mask makes one)"
    has_mod = mods.mask_mod is not None or block_mask.mask_mod is not None
    if has_mod and os.environ.get(MASK_MOD_ENV, "").strip() == "0":
        return f"a mask_mod goes to the portable kernels under {MASK_MOD_ENV}=0"
    if varlen:
        return "a block mask on variable-length batches is not in the Hopper kernels"
    if any(size not in SPARSE_BLOCKS for size in block_mask.block_size):
        return f"the Hopper kernels take block masks of {SPARSE_BLOCKS} blocks, not {block_mask.block_size}"
    return None


def varlen_routed() -> bool:
    """Whether packed batches go to the Gluon forward: once GPU-checked, or when the knob asks for it."""
    return GPU_CHECKED_VARLEN or os.environ.get(VARLEN_ENV, "") == "1"


@functools.cache
def gluon_unavailable_reason() -> str | None:
    """Why Gluon's Hopper primitives do not import in this process, or None."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError as error:
        return f"Gluon (triton.experimental.gluon) does not import: {error}"
    missing = [name for name in ("warpgroup_mma", "warpgroup_mma_wait") if not hasattr(hopper, name)]
    missing += [] if hasattr(gl, "warp_specialize") else ["warp_specialize"]
    if missing:
        return f"this Triton's Gluon lacks {', '.join(missing)}"
    return None


@functools.cache
def device_unsupported_reason(device: torch.device) -> str | None:
    """Why the fast path cannot run on ``device`` whatever the call (not a 9.x CUDA device, no Gluon)."""
    if device.type != "cuda":
        return f"the Hopper fast path runs on CUDA devices of compute capability 9.x, not on {device.type!r}"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"the Hopper fast path needs compute capability 9.x; {device} has {major}.{minor}"
    return gluon_unavailable_reason()


def _tma_unreadable(name: str, t: torch.Tensor) -> str | None:
    es = t.element_size()
    strides_aligned = all(s * es % _TMA_ALIGN_BYTES == 0 for s in t.stride()[:-1])
    if t.stride(-1) != 1 or t.data_ptr() % _TMA_ALIGN_BYTES or not strides_aligned:
        return (
            f"{name} (strides {tuple(t.stride())}, address {t.data_ptr():#x}) is not readable by TMA, which "
            "needs a 16-byte aligned address, 16-byte aligned strides and a unit last stride"
        )
    return None


def fp8_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the Gluon forward does not run this float8 call (flashtile.fp8, its arguments checked there:
    dense, e4m3, head dims multiples of 16), or None when it does: head dims 64, 128 and 256 (V's the
    same), q and k readable by TMA in place (V is copied transposed, docs/design/fp8.md)."""
    reason = device_unsupported_reason(q.device)
    if reason is not None:
        return reason
    if q.shape[-1] not in HOPPER_FWD_HEAD_DIMS or v.shape[-1] != q.shape[-1]:
        dims = ", ".join(map(str, HOPPER_FWD_HEAD_DIMS))
        return f"the Hopper float8 forward is compiled for head dims {dims} (V's the same)"
    for name, t in (("q", q), ("k", k)):
        reason = _tma_unreadable(name, t)
        if reason is not None:
            return reason
    return None


def fwd_unsupported_reason(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Mapping[str, object]
) -> str | None:
    """Why the Gluon forward does not run this call, or None when it does; ``options`` are the launcher
    keywords (docs/design/options.md: the window normalised, causal as (−1, 0)). It runs dense batches of
    fp16/bf16 at head dims 64, 128 and 256 (V's the same) that TMA can read in place, causal or not, with
    any sliding window, softcap, ALiBi slopes and dropout, and packed (varlen) batches of the same when
    :func:`varlen_routed`, and the block masks :func:`block_mask_unsupported_reason` accepts (without
    dropout), each with a learnable sink; ``score_mod`` goes to the portable kernels."""
    reason = device_unsupported_reason(q.device)
    if reason is not None:
        return reason
    if q.dtype not in DTYPES:
        return f"the Hopper forward takes float16 and bfloat16, not {q.dtype}"
    if q.shape[-1] not in HOPPER_FWD_HEAD_DIMS:
        dims = ", ".join(map(str, HOPPER_FWD_HEAD_DIMS))
        return f"the Hopper forward is compiled for head dims {dims}, not {q.shape[-1]}"
    if v.shape[-1] != q.shape[-1]:
        return f"a V head dim ({v.shape[-1]}) other than Q/K's is not in the Hopper forward yet"
    if options.get("cu_seqlens_q") is not None and not varlen_routed():
        return (
            "variable-length batches (cu_seqlens_q/k) take the Hopper forward only under "
            f"{VARLEN_ENV}=1 until it has been checked on a GPU"
        )
    if options.get("dropout_p", 0.0) and options.get("mods") is not None:
        return "dropout with a block mask is not in the Hopper forward"
    reason = block_mask_unsupported_reason(options.get("mods"), options.get("cu_seqlens_q") is not None)
    if reason is not None:
        return reason
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _tma_unreadable(name, t)
        if reason is not None:
            return reason
    return None


def bwd_unsupported_reason(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Mapping[str, object]
) -> str | None:
    """The backend's backward runs every call on a device where the backend runs: the Gluon backward
    where it applies, the portable Triton one otherwise (flashtile.kernels.hopper.attn_bwd)."""
    return device_unsupported_reason(q.device)
