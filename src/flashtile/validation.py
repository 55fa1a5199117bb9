"""Argument checks for the public API, one function per group, run before anything launches.

Every error names the argument, what was received and what is accepted: FlashtileTypeError (a TypeError)
for wrong types and dtypes, FlashtileValueError (a ValueError) for wrong shapes and values, both also
RuntimeErrors as flash_attn's are (:mod:`flashtile.errors`), and NotImplementedError for flash_attn options
that flashtile does not implement yet.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Sequence
from typing import NamedTuple

import torch

from flashtile.errors import FlashtileTypeError, FlashtileValueError

MAX_HEAD_DIM = 256

_REFERENCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_CUDA_DTYPES = (torch.float16, torch.bfloat16)
# The interpreter also runs fp32, which lets the CPU test suite check the kernels without rounding noise.
# Not bf16: Triton 3.6's interpreter mis-rounds it (gradients up to 4.7x the tiled reference's error).
_TRITON_INTERPRETER_DTYPES = (torch.float16, torch.float32)


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d) for d in dtypes)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _received(value: object) -> str:
    """``value`` for an error message: a tensor by its dtype and shape, anything else by its repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {_shape(value)}"
    return repr(value)


def supported_dtypes(backend: str, device: torch.device) -> tuple[torch.dtype, ...]:
    """The dtypes ``backend`` accepts on ``device``."""
    if backend == "reference":
        return _REFERENCE_DTYPES
    if torch.device(device).type == "cpu":
        return _TRITON_INTERPRETER_DTYPES
    return _TRITON_CUDA_DTYPES


def check_tensors(**tensors: object) -> None:
    """Each argument is a strided (dense) torch.Tensor."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise FlashtileTypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.layout != torch.strided:
            raise FlashtileTypeError(f"{name} must be a dense (strided) tensor; got layout {t.layout}")


def check_rank(name: str, t: torch.Tensor, layout: str) -> None:
    """``t`` has as many dimensions as ``layout`` names, e.g. ``"(batch_size, seqlen, nheads, headdim)"``."""
    expected = layout.count(",") + 1
    if t.dim() != expected:
        raise FlashtileValueError(
            f"{name} must have {expected} dimensions {layout}; got shape {_shape(t)} ({t.dim()} dims)"
        )


def check_same_device(**tensors: torch.Tensor) -> None:
    """All tensors live on one device."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise FlashtileValueError(f"{', '.join(tensors)} must be on the same device; got {listed}")


def check_dtypes(backend: str, **tensors: torch.Tensor) -> None:
    """All tensors share one dtype, and ``backend`` supports it on their device."""
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        listed = ", ".join(f"{name} {t.dtype}" for name, t in tensors.items())
        raise FlashtileTypeError(f"{', '.join(tensors)} must have the same dtype; got {listed}")
    name, first = next(iter(tensors.items()))
    accepted = supported_dtypes(backend, first.device)
    if first.dtype not in accepted:
        hint = ""
        if backend == "triton":
            hint = f"; FLASHTILE_BACKEND=reference accepts {_names(_REFERENCE_DTYPES)}"
        raise FlashtileTypeError(
            f"{name}.dtype is {first.dtype}, which the {backend} backend on {first.device.type} does not "
            f"support; accepted: {_names(accepted)}{hint}"
        )


def check_qkv_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: tuple[str, torch.Tensor] | None = None
) -> None:
    """``q`` is (B, N_q, H, D); ``k`` and ``v`` are (B, N_k, H_KV, D) with ``H % H_KV == 0`` and 1 ≤ D ≤ 256.

    ``packed`` names the packed tensor (``("qkv", qkv)`` or ``("kv", kv)``) that some of q, k, v are views
    of, so that the messages show what the caller passed.
    """
    check_rank("q", q, "(batch_size, seqlen_q, nheads, headdim)")
    check_rank("k", k, "(batch_size, seqlen_k, nheads_k, headdim)")
    check_rank("v", v, "(batch_size, seqlen_k, nheads_k, headdim)")

    # Formatted only on failure: shapes may be symbolic under torch.compile.
    def fail(problem: str) -> FlashtileValueError:
        shapes = f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
        if packed is not None:
            shapes += f"; unpacked from {packed[0]} {_shape(packed[1])}"
        return FlashtileValueError(f"{problem}; got {shapes}")

    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise fail("q, k and v must have the same batch_size (dim 0)")
    if k.shape[1] != v.shape[1]:
        raise fail("k and v must have the same seqlen_k (dim 1)")
    if not q.shape[3] == k.shape[3] == v.shape[3]:
        raise fail("q, k and v must have the same headdim (dim 3)")
    if k.shape[2] != v.shape[2]:
        raise fail("k and v must have the same nheads_k (dim 2)")
    nheads, nheads_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    if nheads < 1 or nheads_k < 1:
        raise fail("nheads (q dim 2) and nheads_k (k, v dim 2) must be at least 1")
    if nheads % nheads_k != 0:
        raise fail(
            f"nheads of q ({nheads}) must be a multiple of nheads_k of k and v ({nheads_k}) for MQA/GQA"
        )
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise fail(f"headdim (dim 3 of q, k, v) must be in [1, {MAX_HEAD_DIM}], not {head_dim}")


# The packed tensors: how many of q, k, v each holds at dim 2, and its layout.
_PACKED = {
    "qkv": (3, "(batch_size, seqlen, 3, nheads, headdim)"),
    "kv": (2, "(batch_size, seqlen_k, 2, nheads_k, headdim)"),
}


def unpack_qkv(**tensors: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v from the user's tensors by name (``q, k, v``, ``qkv`` or ``q, kv``), shapes checked.

    A packed tensor is unbound into views along dim 2, never copied.
    """
    check_tensors(**tensors)
    views: dict[str, torch.Tensor] = {}
    packed = None
    for name, t in tensors.items():
        if name not in _PACKED:
            views[name] = t
            continue
        count, layout = _PACKED[name]
        check_rank(name, t, layout)
        if t.shape[2] != count:
            raise FlashtileValueError(
                f"{name} must have shape {layout} with {count} at dim 2; got {_shape(t)}"
            )
        # "qkv" unbinds into q, k, v and "kv" into k, v: the name spells the views.
        views.update(zip(name, t.unbind(dim=2), strict=True))
        packed = (name, t)
    check_qkv_shapes(views["q"], views["k"], views["v"], packed)
    return views["q"], views["k"], views["v"]


def _is_finite(x: float) -> bool:
    # Comparisons rather than math.isfinite, which torch.compile cannot trace on symbolic floats.
    return -math.inf < x < math.inf


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_softmax_scale(softmax_scale: object, head_dim: int) -> float:
    """The scale to use: ``1/√headdim`` for None, else a finite real number (0 and negative are allowed)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not _is_real(softmax_scale):
        raise FlashtileTypeError(f"softmax_scale must be a float or None; got {softmax_scale!r}")
    scale = float(softmax_scale)
    if not _is_finite(scale):
        raise FlashtileValueError(f"softmax_scale must be finite; got {softmax_scale!r}")
    return scale


def check_dropout_p(dropout_p: object) -> None:
    """``dropout_p`` lies in [0, 1); only 0 is implemented."""
    if not _is_real(dropout_p):
        raise FlashtileTypeError(f"dropout_p must be a float in [0, 1); got {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise FlashtileValueError(f"dropout_p must be in [0, 1); got {dropout_p!r}")
    if p > 0.0:
        raise NotImplementedError(
            f"dropout_p > 0 is not implemented yet in flashtile; got dropout_p={dropout_p!r}, accepted: 0.0"
        )


def _plain(x: object) -> object:
    """Python values for a torch tensor or NumPy array (a list, or a scalar when 0-d); else ``x``."""
    numpy = sys.modules.get("numpy")
    if isinstance(x, torch.Tensor) or (numpy is not None and isinstance(x, numpy.ndarray)):
        return x.tolist()
    return x


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def normalize_window(window_size: object, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """``(left, right)`` as the kernels take it: −1 = unlimited, ``causal`` folded into ``right = 0``.

    ``window_size`` is any pair of integers: a tuple or list, NumPy integers, 0-d integer tensors, a 1-D
    integer tensor or array of 2. As in flash_attn's C++, a negative bound and a bound ≥ ``seqlen_k`` both
    become −1, then ``causal`` sets ``right = 0``; ``(-1, 0)`` is plain causal attention.
    """
    pair = _plain(window_size)
    bounds = [_plain(w) for w in pair] if isinstance(pair, Sequence) and not isinstance(pair, str) else []
    if len(bounds) != 2 or not all(_is_int(w) for w in bounds):
        raise FlashtileTypeError(
            "window_size must be a pair of integers (left, right), -1 meaning unlimited; "
            f"got {_received(window_size)}"
        )
    left, right = (-1 if w < 0 or w >= seqlen_k else int(w) for w in bounds)
    return left, 0 if causal else right


def check_window_implemented(window_size: object, window: tuple[int, int]) -> None:
    """Only the unlimited window ``(-1, -1)`` and the causal one ``(-1, 0)`` are implemented."""
    if window not in ((-1, -1), (-1, 0)):
        raise NotImplementedError(
            f"sliding-window attention is not implemented yet in flashtile; got window_size={window_size!r} "
            f"(normalised to {window}), accepted: (-1, -1) or, causal, (-1, 0) once normalised"
        )


def check_softcap(softcap: object) -> None:
    """``softcap`` is a finite real; ≤ 0 disables it (as in flash_attn) and only that is implemented."""
    if not _is_real(softcap):
        raise FlashtileTypeError(f"softcap must be a float (≤ 0 disables it); got {softcap!r}")
    cap = float(softcap)
    if not _is_finite(cap):
        raise FlashtileValueError(f"softcap must be finite (≤ 0 disables it); got {softcap!r}")
    if cap > 0.0:
        raise NotImplementedError(
            f"softcapping is not implemented yet in flashtile; got softcap={softcap!r}, accepted: ≤ 0 (off)"
        )


def check_alibi_slopes(alibi_slopes: object) -> None:
    """Only ``alibi_slopes=None`` is implemented."""
    if alibi_slopes is not None:
        raise NotImplementedError(
            f"ALiBi is not implemented yet in flashtile; got alibi_slopes={_received(alibi_slopes)}, "
            "accepted: None"
        )


def _numpy_bool(value: object) -> bool:
    # A NumPy bool can only exist once NumPy is imported: no import of our own.
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


def check_flag(name: str, value: object) -> bool:
    """``value`` as a Python bool: a bool, a NumPy bool or a 0-d bool tensor (as flash_attn takes them)."""
    if isinstance(value, bool) or _numpy_bool(value):
        return bool(value)
    if isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.dim() == 0:
        return bool(value)
    received = _received(value) if isinstance(value, torch.Tensor) else f"{value!r} ({type(value).__name__})"
    raise FlashtileTypeError(f"{name} must be a bool (Python, NumPy or a 0-d bool tensor); got {received}")


class Options(NamedTuple):
    """The options as the layers below the API take them, normalised."""

    causal: bool
    window_size: tuple[int, int]
    return_attn_probs: bool


def check_options(
    dropout_p: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    causal: object,
    deterministic: object,
    return_attn_probs: object,
    seqlen_k: int,
) -> Options:
    """The non-tensor arguments shared by every flash_attn_* function, checked and normalised.

    ``causal`` comes back true for every window that is causal attention, ``window_size=(-1, 0)`` included.

    ``deterministic`` is accepted either way: the backward uses no atomics, so it is deterministic by
    construction.
    """
    causal = check_flag("causal", causal)
    check_flag("deterministic", deterministic)
    return_attn_probs = check_flag("return_attn_probs", return_attn_probs)
    check_dropout_p(dropout_p)
    window = normalize_window(window_size, causal, seqlen_k)
    check_window_implemented(window_size, window)
    check_softcap(softcap)
    check_alibi_slopes(alibi_slopes)
    return Options(window == (-1, 0), window, return_attn_probs)
