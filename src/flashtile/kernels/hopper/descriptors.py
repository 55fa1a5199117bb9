"""TMA descriptors for the Gluon kernels, built per call for the cost of a small object.

A launch passes the Gluon kernels four to nine host-side TensorDescriptors. Gluon's own class validates
its arguments in ``__post_init__`` (~2 µs each on a fast host) and the shared-memory layout that goes
with a box is a ``constexpr_function`` evaluated per call (~10 µs each): together most of a forward's
host time before this module (docs/design/host_path.md). Here the layout is cached per (dtype, box) and
the descriptor skips the checks, which the launchers have already made before anything launches (the
Hopper support checks: a 16-byte aligned base and strides, a unit last stride; positive sizes by the
launchers' contracts). Triton specialises a descriptor argument on its dtype, box and layout only
(tests/test_launch_cache.py checks it), and fills the CUDA tensor map from ``base``, ``shape``,
``strides`` and ``padding`` at each launch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

_GL_DTYPES = {
    torch.float16: gl.float16,
    torch.bfloat16: gl.bfloat16,
    torch.float32: gl.float32,
    torch.float8_e4m3fn: gl.float8e4nv,
}


class CheckedDescriptor(TensorDescriptor):
    """A TensorDescriptor whose arguments the launcher has checked already (module docstring)."""

    def __post_init__(self) -> None:
        """Nothing to check again: see the module docstring for who checks what."""


@functools.cache
def box_layout(dtype: torch.dtype, box: tuple[int, ...]) -> gl.NVMMASharedLayout:
    """The shared-memory layout a TMA box of ``dtype`` lands in (and wgmma reads)."""
    return gl.NVMMASharedLayout.get_default_for(list(box), _GL_DTYPES[dtype])


def descriptor(
    t: torch.Tensor, shape: Sequence[int], strides: Sequence[int], box: tuple[int, ...]
) -> CheckedDescriptor:
    """A descriptor over ``t`` seen as ``shape`` with ``strides`` (elements), moving ``box``-shaped
    blocks; blocks past an edge read as zeros and their stores are dropped."""
    return CheckedDescriptor(t, list(shape), list(strides), list(box), box_layout(t.dtype, box))
