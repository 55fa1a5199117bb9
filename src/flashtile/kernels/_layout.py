"""Making tensors fit the tensor descriptors (TMA) the kernels load through, and launching with the scratch
they need."""

from __future__ import annotations

import contextlib
import contextvars
import functools

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


def launch(kernel, grid: tuple[int, ...], device: torch.device, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` under ``device`` (Triton launches on the current CUDA device), with
    the scratch allocator device-side descriptors need installed for this launch only: Triton keeps the
    allocator in a context variable, so setting it in a copy of the context leaves the caller's in place."""
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        contextvars.copy_context().run(_launch_with_scratch, kernel, grid, device, args, kwargs)


def _launch_with_scratch(kernel, grid, device, args, kwargs) -> None:
    triton.set_allocator(_scratch_allocator(device))
    kernel[grid](*args, **kwargs)


@functools.cache
def _scratch_allocator(device: torch.device):
    def alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    return alloc
