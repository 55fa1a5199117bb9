"""Making tensors fit the tensor descriptors (TMA) the kernels load through, and the scratch they need."""

from __future__ import annotations

import contextlib

import torch
import triton

_TMA_ALIGN_BYTES = 16


def padded_head_dim(head_dim: int) -> int:
    """Head dims are padded to a multiple of 8 elements so every row stride is 16-byte aligned."""
    return (head_dim + 7) // 8 * 8


def _fits_descriptor(t: torch.Tensor) -> bool:
    es = t.element_size()
    return (
        t.stride(-1) == 1
        and t.data_ptr() % _TMA_ALIGN_BYTES == 0
        and all((s * es) % _TMA_ALIGN_BYTES == 0 for s in t.stride()[:-1])
    )


def as_descriptor_operand(t: torch.Tensor, head_dim_padded: int) -> torch.Tensor:
    """Return ``t`` (B, N, H, D) itself when a descriptor can read it, else a padded contiguous copy."""
    if t.shape[-1] == head_dim_padded and _fits_descriptor(t):
        return t
    return torch.nn.functional.pad(t, (0, head_dim_padded - t.shape[-1])).contiguous()


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensors' (CPU tensors: the interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def install_scratch_allocator(device: torch.device) -> None:
    """Device-side tensor descriptors live in a small global-memory scratch that Triton asks us for."""

    def alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)
