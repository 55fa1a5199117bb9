"""The CUDA tensor maps of a compiled Gluon kernel's TMA descriptors, encoded once per address and shape.

Triton 3.6's CUDA launcher wraps the compiled C launcher in ``wrap_handle_tensordesc``: at every launch it
turns each host-side TensorDescriptor argument into ``[tensor map, *shape, *strides]``, encoding the map
with ``fill_tma_descriptor`` (``cuTensorMapEncodeTiled``) from the base address, shape, strides and padding
and the compiled kernel's per-argument metadata (swizzle, element type, box). A Gluon forward passes four
descriptors, a backward nine over three launches; on a GPU's host each encoding is a few microseconds of
Python and driver call (docs/design/host_path.md). The map depends on nothing else, and the launch copies
it into the kernel's parameters, so a map encoded once for (address, shape, strides, padding) is the same
map at every later launch with those values, whatever tensor now lives at the address.

:func:`tensor_map_launcher` finds the C launcher and the descriptors' metadata inside Triton's wrapper (its
closure: the wrapper keeps no other handle) and returns a :class:`TensorMapLauncher` that expands the
descriptors from a small cache, or None where the wrapper is not Triton 3.6's (then the launch goes through
Triton's wrapper as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triton.backends.nvidia import driver as nvidia_driver

# Distinct (address, shape, strides) per descriptor argument kept at once: a training step's layers reuse a
# few addresses from the caching allocator; past this the cache starts over (a miss only re-encodes).
MAX_MAPS = 64


class TensorMapLauncher:
    """Triton's C launcher called with every descriptor argument expanded as Triton's wrapper does, the
    tensor map taken from a cache."""

    __slots__ = ("_launch", "_maps", "_meta", "_order")

    def __init__(self, launch: Callable[..., Any], meta: dict[int, dict]) -> None:
        self._launch, self._meta = launch, meta
        self._order = tuple(sorted(meta))
        self._maps: dict[tuple, list] = {}

    def __call__(self, base: tuple, args: tuple) -> None:
        """``base``: the C launcher's leading arguments (grid, stream, function, launch flags, scratch,
        metadata and hooks); ``args``: the kernel's arguments, descriptors among them."""
        # Slices between the few descriptors, not a Python step per argument (~60 in the attention kernels).
        parts, start = list(base), 0
        for index in self._order:
            parts += args[start:index]
            parts += self._expanded(index, args[index])
            start = index + 1
        parts += args[start:]
        self._launch(*parts)

    def _expanded(self, index: int, desc: Any) -> list:
        """``[tensor map, *shape, *strides]`` for descriptor argument ``index``, as Triton's wrapper gives."""
        key = (index, desc.base.data_ptr(), desc.padding, *desc.shape, *desc.strides)
        maps = self._maps
        found = maps.get(key)
        if found is None:
            if len(maps) >= MAX_MAPS:
                maps.clear()
            found = maps[key] = nvidia_driver.make_tensordesc_arg(desc, self._meta[index])
        return found


def tensor_map_launcher(run: Any) -> TensorMapLauncher | None:
    """A :class:`TensorMapLauncher` for a compiled kernel's ``run`` (Triton's CudaLauncher) whose launch
    encodes descriptors through ``wrap_handle_tensordesc`` with metadata for each, else None."""
    launch = getattr(run, "launch", None)
    code = getattr(launch, "__code__", None)
    if code is None or code.co_name != "inner" or not launch.__closure__:
        return None
    cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in launch.__closure__), strict=True))
    names = ("launcher", "tensordesc_indices", "tensordesc_meta")
    c_launch, indices, metas = (cells.get(name) for name in names)
    if c_launch is None or not indices or not metas or len(indices) != len(metas) or None in metas:
        return None
    # Triton's wrapper numbers the descriptors in argument order (its metadata list follows them).
    return TensorMapLauncher(c_launch, dict(zip(sorted(indices), metas, strict=True)))
