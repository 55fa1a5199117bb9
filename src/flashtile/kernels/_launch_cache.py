"""A kernel launch prepared once per call signature, and relaunched without Triton's binding.

A launcher builds a :class:`KernelLaunch` in a function of the call's shapes, strides, dtype, device and
options alone, under ``functools.lru_cache``: the grid, every argument that is not a per-call tensor
(strides, sizes, scales, constexpr switches and jit functions) already in the kernel's parameter order, and
the launch options (``num_warps``, ...). A call then only fills in its tensors. ``kernel[grid](...)`` in
Triton 3.6 binds and specialises every argument on each call before it finds the compiled kernel: ~10 µs
for the attention kernels' ~60 parameters on a fast host, three times per backward (measured on an H100
host: ``bwd.attn_bwd`` 599 µs through Triton, 247 µs direct).

So a launch's first call with a given pointer signature goes through Triton, which compiles (or finds)
the kernel and returns it; later calls call that kernel's launcher directly, as ``JITFunction.run`` does
after its cache lookup (current stream, enter/exit hooks, and the launch metadata when an enter hook, a
profiler's, is set). Triton's check that the kernel's globals have not changed since it compiled is skipped:
flashtile's kernels read only constants. ``FLASHTILE_CACHED_LAUNCH=0`` sends every launch through
``kernel[grid]`` (tests/test_launch_cache.py's GPU test checks both give the same bits).

Triton 3.6 specialises a compiled kernel on the type of every argument, the value of every integer, each
tensor's dtype and whether its address is 16-byte aligned (inside tuples too), the constexprs and launch
options, the device, and the TRITON_DEBUG and instrumentation knobs (floats are never specialised). A
KernelLaunch fixes everything but the tensors, so it keeps one compiled kernel per (pointer dtypes and
alignment, knobs). tests/test_launch_cache.py checks that against Triton's own binder for sm_90. Every call
goes through ``kernel[grid]`` under another Triton version, under the interpreter (which compiles nothing),
for a launch with a fixed argument other than an int, float, bool, str or None (a ``mask_mod``/``score_mod``
jit function, whose globals Triton checks at each launch), and for a kernel with pre-run hooks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
import triton
from packaging.version import Version
from triton import knobs

from flashtile._environ import Knob
from flashtile.kernels._layout import run_on_device
from flashtile.kernels._tensor_maps import tensor_map_launcher

ENV_VAR = "FLASHTILE_CACHED_LAUNCH"
# The direct launch mirrors Triton 3.6's JITFunction.run; under another version every launch goes through it.
ENABLED = Version(triton.__version__).release[:2] == (3, 6)
_SCALARS = (int, float, bool, str, type(None))


_KNOB = Knob(ENV_VAR)


def direct_launch_requested() -> bool:
    """Whether the direct relaunch is on: unless ``FLASHTILE_CACHED_LAUNCH=0`` (read at each launch)."""
    return _KNOB.get() != "0"


def current_stream(device_index: int | None) -> int:
    """The current stream of the device, as JITFunction.run gets it."""
    return triton.runtime.driver.active.get_current_stream(device_index)


def _pointer_signature(p: object) -> Hashable:
    """What Triton specialises on for a per-call argument: None, a tensor's dtype and 16-byte alignment
    (element-wise for a tuple of tensors), or a TMA descriptor's dtype and box (Triton also specialises on
    its shared layout, which kernels/hopper/descriptors.py derives from these two)."""
    if p is None:
        return None
    if type(p) is tuple:
        return tuple([_pointer_signature(t) for t in p])
    box = getattr(p, "block_shape", None)
    if box is not None:
        return p.base.dtype, tuple(box)
    return p.dtype, p.data_ptr() % 16 == 0


class _Compiled:
    """A compiled kernel and how to call its launcher."""

    __slots__ = ("compiled", "flags", "needs_scratch", "tensor_maps")

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        # Triton's launcher asks the scratch allocator (a context variable run_on_device sets) only for a
        # kernel with a global or profiling scratch size; without one no allocator, and no context, is needed.
        metadata = getattr(compiled, "metadata", None)
        sizes = (getattr(metadata, name, 1) for name in ("global_scratch_size", "profile_scratch_size"))
        self.needs_scratch = any(size != 0 for size in sizes)
        # A Gluon kernel's TMA descriptors: their tensor maps from a cache (kernels/_tensor_maps.py), through
        # Triton's C launcher with the flags its CudaLauncher would pass and no scratch.
        run = getattr(compiled, "run", None)
        flags = tuple(getattr(run, name, None) for name in ("launch_cooperative_grid", "launch_pdl"))
        maps = None if self.needs_scratch or None in flags else tensor_map_launcher(run)
        self.tensor_maps, self.flags = maps, flags

    def __call__(self, grid: tuple[int, ...], device: torch.device, args: tuple) -> None:
        compiled = self.compiled
        stream = current_stream(device.index)
        size = len(grid)
        enter_hook = knobs.runtime.launch_enter_hook
        # Only an enter hook reads the launch metadata (a profiler's); building it costs ~1.5 µs.
        metadata = compiled.launch_metadata(grid, stream, *args) if enter_hook.calls else None
        grid_xyz = (grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1)
        hooks = (metadata, enter_hook, knobs.runtime.launch_exit_hook)
        if self.tensor_maps is not None:
            # CudaLauncher's leading arguments: its two launch flags, then no global or profiling scratch.
            base = (*grid_xyz, stream, compiled.function, *self.flags, None, None, compiled.packed_metadata)
            self.tensor_maps((*base, *hooks), args)
            return
        compiled.run(*grid_xyz, stream, compiled.function, compiled.packed_metadata, *hooks, *args)


class KernelLaunch:
    """``kernel[grid](**values, **per-call tensors, **options)`` with all but the tensors fixed.

    ``pointers`` names the kernel parameters a call passes (tensors, TMA descriptors, None, or a tuple of
    tensors, in that order); ``values`` gives every other parameter; ``options`` are Triton's launch
    options. Calling the launch with the pointers launches it on ``device``, with the scratch allocator.
    """

    __slots__ = ("_compiled", "_pieces", "device", "grid", "kernel", "options")

    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        device: torch.device,
        pointers: Sequence[str],
        values: dict[str, Any],
        options: dict[str, Any],
    ) -> None:
        self.kernel, self.grid, self.device, self.options = kernel, grid, device, options
        names = list(kernel.arg_names)
        slots = [names.index(name) for name in pointers]
        missing = set(names) - set(pointers) - set(values)
        extra = set(values) - set(names)
        if missing or extra or slots != sorted(slots):
            raise ValueError(
                f"{kernel.fn.__name__}: pointers {list(pointers)} and values must name each parameter once, "
                f"pointers in parameter order; missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        # The arguments are (fixed values, pointers[a:b]) pieces and the fixed values after the last pointer.
        pieces, start = [], 0
        for i, slot in enumerate(slots):
            if i == 0 or slot != slots[i - 1] + 1:
                pieces.append([tuple(values[n] for n in names[start:slot]), i, i + 1])
            else:
                pieces[-1][2] = i + 1
            start = slot + 1
        self._pieces = tuple(map(tuple, pieces)), tuple(values[n] for n in names[start:])
        cacheable = ENABLED and all(type(v) in _SCALARS for v in values.values())
        self._compiled: dict[Hashable, _Compiled] | None = {} if cacheable else None

    def arguments(self, pointers: tuple) -> tuple:
        """Every argument of the kernel, in parameter order, for these pointers."""
        pieces, tail = self._pieces
        args: tuple = ()
        for fixed, a, b in pieces:
            args += fixed + pointers[a:b]
        return args + tail

    def __call__(self, *pointers: torch.Tensor | tuple | None) -> None:
        self.launch(pointers)

    def launch(self, pointers: tuple, pointer_signatures: tuple | None = None) -> None:
        """Launch with these pointers; ``pointer_signatures``: :meth:`pointer_signatures` of them, where the
        caller knows it without looking (a prepared call: kernels/hopper/prepared.py)."""
        cache = self._compiled
        if cache is None or not direct_launch_requested():
            run_on_device(self.device, self._launch, pointers, None, None)
            return
        # Looked up once a call: the launch below takes the entry (or, without one, the signature to keep it).
        if pointer_signatures is None:
            pointer_signatures = self.pointer_signatures(pointers)
        signature = pointer_signatures, knobs.runtime.debug, knobs.compilation.instrumentation_mode
        entry = cache.get(signature)
        if self.kernel.pre_run_hooks:
            entry = None
        # A kernel without scratch on the current device: its launcher straight away, without the context
        # copy and allocator run_on_device installs (a few µs a launch on a GPU's host).
        if entry is not None and not entry.needs_scratch:
            device = self.device
            if device.type != "cuda" or torch.cuda.current_device() == device.index:
                entry(self.grid, device, self.arguments(pointers))
                return
        run_on_device(self.device, self._launch, pointers, signature, entry)

    @staticmethod
    def pointer_signatures(pointers: tuple) -> tuple:
        """What Triton specialises on in the pointers (with Triton's two knobs that key a compiled kernel,
        what picks one)."""
        # A plain tensor's signature inline: the common case, ~25 pointers a backward.
        return tuple(
            [
                (p.dtype, p.data_ptr() % 16 == 0) if type(p) is torch.Tensor else _pointer_signature(p)
                for p in pointers
            ]
        )

    def _launch(self, pointers: tuple, signature: Hashable | None, entry: _Compiled | None) -> None:
        """Inside run_on_device: ``entry``'s launcher, or Triton's launch, whose compiled kernel is kept
        under ``signature`` (None: the cache is off, keep nothing)."""
        args = self.arguments(pointers)
        if entry is not None:
            entry(self.grid, self.device, args)
            return
        compiled = self.kernel[self.grid](*args, **self.options)
        keep = signature is not None and not self.kernel.pre_run_hooks
        if keep and getattr(compiled, "function", None) is not None:
            self._compiled[signature] = _Compiled(compiled)
