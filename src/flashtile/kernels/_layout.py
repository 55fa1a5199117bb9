"""Making tensors fit the tensor descriptors (TMA) the kernels load through, and launching with the scratch
they need."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable

import torch
import triton

_TMA_ALIGN_BYTES = 16


def padded_head_dim(head_dim: int) -> int:
    """Head dims are padded to a multiple of 8 elements so every row stride is 16-byte aligned."""
    return (head_dim + 7) // 8 * 8


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` on the host: ``triton.cdiv`` is a constexpr function, ~3 µs a call outside a kernel."""
    return -(-a // b)


# The grid of a packed batch is cut from max_seqlen rounded up to one of 2**3 = 8 steps per power of two.
_GRID_STEPS_LOG2 = 3
# The largest row block the kernels take: no rounding step is finer than one block.
_GRID_SEQLEN_QUANTUM = 128


def grid_seqlen(max_seqlen: int) -> int:
    """``max_seqlen`` of a packed batch rounded up for the grid (0 stays 0): at most 1/8 more, so that the
    few sizes a training run's packed rows take share one prepared launch instead of building one per step.
    The extra programs find no rows in their sequence and return at once, as those of shorter sequences do.
    """
    step = max(_GRID_SEQLEN_QUANTUM, 1 << max(0, max_seqlen.bit_length() - 1 - _GRID_STEPS_LOG2))
    return cdiv(max_seqlen, step) * step


def _fits_descriptor(t: torch.Tensor) -> bool:
    # One OR of the address and the byte strides: each must be a multiple of 16 (a power of two).
    es = t.element_size()
    strides = t.stride()
    bits = t.data_ptr()
    for s in strides[:-1]:
        bits |= s * es
    return strides[-1] == 1 and bits % _TMA_ALIGN_BYTES == 0


def as_descriptor_operand(t: torch.Tensor, head_dim_padded: int) -> torch.Tensor:
    """Return ``t`` (B, N, H, D) itself when a descriptor can read it, else a padded contiguous copy."""
    if t.shape[-1] == head_dim_padded and _fits_descriptor(t):
        return t
    return torch.nn.functional.pad(t, (0, head_dim_padded - t.shape[-1])).contiguous()


def launch(kernel, grid: tuple[int, ...], device: torch.device, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` on ``device`` with the scratch allocator (:func:`run_on_device`).
    The attention launchers use :class:`flashtile.kernels._launch_cache.KernelLaunch` instead."""
    run_on_device(device, _launch, kernel, grid, args, kwargs)


def _launch(kernel, grid, args, kwargs) -> None:
    kernel[grid](*args, **kwargs)


def run_on_device(device: torch.device, fn: Callable[..., None], *args) -> None:
    """``fn(*args)`` with ``device`` current (Triton launches on the current CUDA device) and the scratch
    allocator device-side descriptors need installed for this call only: Triton keeps the allocator in a
    context variable, so setting it in a copy of the context leaves the caller's in place."""
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        with torch.cuda.device(device):
            contextvars.copy_context().run(_with_scratch, device, fn, args)
    else:
        contextvars.copy_context().run(_with_scratch, device, fn, args)


def _with_scratch(device: torch.device, fn: Callable[..., None], args: tuple) -> None:
    triton.set_allocator(_scratch_allocator(device))
    fn(*args)


@functools.cache
def _scratch_allocator(device: torch.device):
    def alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    return alloc
