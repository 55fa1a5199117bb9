"""Programmable attention: ``mask_mod`` and ``score_mod`` functions written once as ``@triton.jit``
functions, run inside the kernels (as compile-time arguments) and on PyTorch tensors (the reference, the
CPU backend and :func:`flashtile.create_block_mask`).

A ``mask_mod(b, h, q_idx, kv_idx)`` returns True where query ``q_idx`` may see key ``kv_idx`` of batch
element ``b`` (the sequence under varlen) and query head ``h``; a ``score_mod(score, b, h, q_idx, kv_idx)``
returns the new score, ``score`` being the scaled score ``softmax_scale · q·k`` (after softcap and ALiBi,
natural-log units); ``score_mod_bwd`` has ``score_mod``'s signature and returns ``d score_mod / d score``.
A function that takes one more argument, ``aux``, receives the call's ``aux_tensors`` tuple: in a kernel
each element is a pointer to the first element of a contiguous tensor (``tl.load(aux[0] + q_idx)``), on
tensors the same expression gathers. Indices are int32 tensors in the kernels, int64 on the host.

Functions must reach Triton through a module-level name bound to ``triton.language`` (``tl``), and may use
``tl.load``, ``tl.where``, ``tl.minimum``, ``tl.maximum``, ``tl.abs``, ``tl.exp``, ``tl.exp2``, ``tl.log``,
``tl.sqrt``, ``tl.math.*`` of those, ``.to(tl.<dtype>)``, arithmetic and comparisons. :func:`bind` gives a
function constants (``tl.constexpr`` globals) or other functions (combinators) without a closure, which
Triton's interpreter cannot see.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass

import torch

from flashtile.errors import FlashtileTypeError, FlashtileValueError

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    # The classes a @triton.jit function can be: compiled, or under TRITON_INTERPRET=1.
    _JIT_TYPES: tuple[type, ...] = (JITFunction, InterpretedFunction)
except ImportError:
    # Without Triton (it ships for Linux only) there are no jit functions to check or run.
    triton = tl = None
    _JIT_TYPES = ()


def is_jit_function(fn: object) -> bool:
    """Whether ``fn`` is a ``@triton.jit`` function (compiled or interpreted)."""
    return isinstance(fn, _JIT_TYPES)


def bind(jit_fn, **values: object):
    """A copy of ``jit_fn`` whose globals ``values`` replace (ints, floats and bools become
    ``tl.constexpr``; jit functions stay functions). Triton keys its cache on the bound constants, so each
    distinct binding compiles once."""
    fn = jit_fn.fn
    scope = dict(fn.__globals__)
    for name, value in values.items():
        scope[name] = tl.constexpr(value) if isinstance(value, bool | int | float) else value
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    return triton.jit(copy)


def takes_aux(fn, name: str, base_arity: int) -> bool:
    """Whether ``fn`` (a jit function) takes the ``aux`` argument after its ``base_arity`` positional ones;
    raises a clear error for any other arity."""
    params = list(inspect.signature(fn.fn).parameters.values())
    if len(params) not in (base_arity, base_arity + 1):
        raise FlashtileValueError(
            f"{name} must take {base_arity} arguments, or {base_arity + 1} with aux last; "
            f"{fn.fn.__name__} takes {len(params)}: ({', '.join(p.name for p in params)})"
        )
    return len(params) == base_arity + 1


class _Pointer:
    """``aux[i] + offsets`` on the host: the tensor (flattened) and the element offsets."""

    def __init__(self, tensor: torch.Tensor, offsets: torch.Tensor | int = 0) -> None:
        self.tensor, self.offsets = tensor, offsets

    def __add__(self, offsets: torch.Tensor | int) -> _Pointer:
        return _Pointer(self.tensor, self.offsets + offsets)

    __radd__ = __add__


def _load(pointer: _Pointer, mask: torch.Tensor | None = None, other: float = 0, **_: object) -> torch.Tensor:
    offsets = torch.as_tensor(pointer.offsets, device=pointer.tensor.device)
    flat = pointer.tensor.reshape(-1)
    values = flat[offsets.clamp(0, flat.numel() - 1)]
    if mask is not None:
        values = torch.where(mask, values, torch.as_tensor(other, dtype=values.dtype, device=values.device))
    return values


def _exp2(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(x)


_MATH = types.SimpleNamespace(
    exp=torch.exp, exp2=_exp2, log=torch.log, log2=torch.log2, sqrt=torch.sqrt, abs=torch.abs,
    tanh=torch.tanh, floor=torch.floor, ceil=torch.ceil,
)  # fmt: skip
# triton.language as the host evaluation of a mod sees it.
TL_ON_TENSORS = types.SimpleNamespace(
    **vars(_MATH),
    math=_MATH,
    load=_load,
    where=torch.where,
    minimum=torch.minimum,
    maximum=torch.maximum,
    constexpr=lambda value: value,
    int1=torch.bool, int8=torch.int8, int16=torch.int16, int32=torch.int32, int64=torch.int64,
    float16=torch.float16, bfloat16=torch.bfloat16, float32=torch.float32, float64=torch.float64,
)  # fmt: skip

_ON_TENSORS: dict[int, tuple[object, types.FunctionType]] = {}


def on_tensors(jit_fn) -> types.FunctionType:
    """``jit_fn``'s Python source as a function of PyTorch tensors: ``triton.language`` is replaced by
    :data:`TL_ON_TENSORS`, constexpr globals by their values and called jit functions by their own
    host versions."""
    cached = _ON_TENSORS.get(id(jit_fn))
    if cached is not None and cached[0] is jit_fn:
        return cached[1]
    fn = jit_fn.fn
    scope = {}
    for name, value in fn.__globals__.items():
        if value is tl:
            value = TL_ON_TENSORS
        elif isinstance(value, tl.constexpr):
            value = value.value
        elif is_jit_function(value) and name in fn.__code__.co_names:
            value = on_tensors(value)
        scope[name] = value
    host = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
    _ON_TENSORS[id(jit_fn)] = (jit_fn, host)
    return host


def aux_pointers(aux_tensors: tuple[torch.Tensor, ...] | None) -> tuple[_Pointer, ...] | None:
    """The host stand-ins for ``aux_tensors`` (what ``aux`` is when a mod runs on tensors)."""
    return None if aux_tensors is None else tuple(_Pointer(t.contiguous()) for t in aux_tensors)


@dataclass(frozen=True)
class Mods:
    """The programmable options of one call, validated (:func:`flashtile.validation.check_mods`).

    ``block_mask`` a :class:`flashtile.BlockMask` or None; ``mask_mod`` the function applied in its
    partial blocks (the block mask's own when not given); ``score_mod``/``score_mod_bwd`` jit functions or
    None; ``aux_tensors`` a tuple of contiguous tensors on q's device, or None."""

    block_mask: object | None = None
    mask_mod: object | None = None
    score_mod: object | None = None
    score_mod_bwd: object | None = None
    aux_tensors: tuple[torch.Tensor, ...] | None = None

    def call(self, fn, *args: torch.Tensor) -> torch.Tensor:
        """``fn(*args[, aux])`` on tensors, with the aux stand-ins when ``fn`` takes them."""
        host = on_tensors(fn)
        if len(inspect.signature(host).parameters) > len(args):
            return host(*args, aux_pointers(self.aux_tensors))
        return host(*args)


def check_is_jit(name: str, fn: object) -> None:
    """TypeError unless ``fn`` is None or a ``@triton.jit`` function."""
    if fn is not None and not is_jit_function(fn):
        raise FlashtileTypeError(
            f"{name} must be a @triton.jit function (its Python source runs on tensors as .fn); got "
            f"{type(fn).__name__} {fn!r}. Decorate it with @triton.jit, e.g. flashtile.masks.causal"
        )
    if fn is not None and not any(value is tl for value in fn.fn.__globals__.values()):
        raise FlashtileValueError(
            f"{name} {fn.fn.__name__} must be defined in a module that imports triton.language (as tl): "
            "Triton's interpreter and the host evaluation look it up there"
        )
