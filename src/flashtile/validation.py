"""Argument checks for the public API, one function per group, run before anything launches.

Every error names the argument, what was received and what is accepted: FlashtileTypeError (a TypeError)
for wrong types and dtypes, FlashtileValueError (a ValueError) for wrong shapes and values, both also
RuntimeErrors as flash_attn's are (:mod:`flashtile.errors`). The KV-cache and paged-cache checks are in
:mod:`flashtile.kvcache_validation`.

Variable-length batches: the types, dtypes, shapes and devices of ``cu_seqlens_q/k`` are always checked;
their values (start at 0, non-decreasing, end at the token count, no sequence longer than ``max_seqlen``)
need them on the host, so they are checked for CPU tensors always and for CUDA tensors only under
``FLASHTILE_DEBUG=1``, which costs a device-to-host copy per call. Without it, bad values on CUDA give
wrong numbers for the sequences concerned, never an out-of-bounds access (the kernels clamp them).
"""

from __future__ import annotations

import itertools
import math
import numbers
import sys
from collections.abc import Sequence
from typing import NamedTuple

import torch

from flashtile._environ import Knob
from flashtile.errors import FlashtileTypeError, FlashtileValueError

# Q/K head dims up to 576 (DeepSeek's MLA with the latent absorbed: 512 + 64 rotary) and V head dims up to
# 512; docs/design/kernels.md, "Head dims past 256", says how the kernels tile them.
MAX_HEAD_DIM = 576
MAX_HEAD_DIM_V = 512
DEBUG_ENV_VAR = "FLASHTILE_DEBUG"
_DEBUG = Knob(DEBUG_ENV_VAR)

_REFERENCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_CUDA_DTYPES = (torch.float16, torch.bfloat16)
# The interpreter also runs fp32, which lets the CPU test suite check the kernels without rounding noise.
# Not bf16: Triton 3.6's interpreter mis-rounds it (gradients up to 4.7x the tiled reference's error).
_TRITON_INTERPRETER_DTYPES = (torch.float16, torch.float32)


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d) for d in dtypes)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def describe(value: object) -> str:
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


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """All tensors share one dtype."""
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        listed = ", ".join(f"{name} {t.dtype}" for name, t in tensors.items())
        raise FlashtileTypeError(f"{', '.join(tensors)} must have the same dtype; got {listed}")


def check_dtypes(backend: str, **tensors: torch.Tensor) -> None:
    """All tensors share one dtype, and ``backend`` supports it on their device."""
    check_same_dtype(**tensors)
    name, first = next(iter(tensors.items()))
    accepted = supported_dtypes(backend, first.device)
    if first.dtype not in accepted:
        hint = ""
        if backend != "reference":
            hint = f"; FLASHTILE_BACKEND=reference accepts {_names(_REFERENCE_DTYPES)}"
        if first.dtype == torch.float8_e4m3fn:
            hint = "; float8 inputs take flashtile.flash_attn_fp8_func (forward only, with descales)"
        raise FlashtileTypeError(
            f"{name}.dtype is {first.dtype}, which the {backend} backend on {first.device.type} does not "
            f"support; accepted: {_names(accepted)}{hint}"
        )


def check_qkv_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: tuple[str, torch.Tensor] | None = None,
    varlen: bool = False,
) -> None:
    """``q`` is (B, N_q, H, D); ``k`` is (B, N_k, H_KV, D) and ``v`` (B, N_k, H_KV, D_v) with
    ``H % H_KV == 0``, 1 ≤ D ≤ 576 and 1 ≤ D_v ≤ 512 (V's head dim may differ from Q's and K's).

    With ``varlen`` the batch and sequence dimensions are one: q (total_q, H, D), k and v
    (total_k, H_KV, D). ``packed`` names the packed tensor (``("qkv", qkv)`` or ``("kv", kv)``) that some
    of q, k, v are views of, so that the messages show what the caller passed.
    """
    if varlen:
        check_rank("q", q, "(total_q, nheads, headdim)")
        check_rank("k", k, "(total_k, nheads_k, headdim)")
        check_rank("v", v, "(total_k, nheads_k, headdim)")
    else:
        check_rank("q", q, "(batch_size, seqlen_q, nheads, headdim)")
        check_rank("k", k, "(batch_size, seqlen_k, nheads_k, headdim)")
        check_rank("v", v, "(batch_size, seqlen_k, nheads_k, headdim)")

    # Formatted only on failure: shapes may be symbolic under torch.compile.
    def fail(problem: str) -> FlashtileValueError:
        shapes = f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
        if packed is not None:
            shapes += f"; unpacked from {packed[0]} {_shape(packed[1])}"
        return FlashtileValueError(f"{problem}; got {shapes}")

    # Dimensions counted from the end, the same in both layouts. Each .shape builds a torch.Size: read once.
    qs, ks, vs = q.shape, k.shape, v.shape
    heads, dim = -2, -1
    if not varlen and not qs[0] == ks[0] == vs[0]:
        raise fail("q, k and v must have the same batch_size (dim 0)")
    if ks[-3] != vs[-3]:
        raise fail(f"k and v must have the same {'total_k (dim 0)' if varlen else 'seqlen_k (dim 1)'}")
    if qs[dim] != ks[dim]:
        raise fail(f"q and k must have the same headdim (dim {q.dim() - 1}); v's may differ")
    if ks[heads] != vs[heads]:
        raise fail(f"k and v must have the same nheads_k (dim {q.dim() - 2})")
    nheads, nheads_k, head_dim, head_dim_v = qs[heads], ks[heads], qs[dim], vs[dim]
    if nheads < 1 or nheads_k < 1:
        raise fail(f"nheads (q dim {q.dim() - 2}) and nheads_k (k, v dim {q.dim() - 2}) must be at least 1")
    if nheads % nheads_k != 0:
        raise fail(
            f"nheads of q ({nheads}) must be a multiple of nheads_k of k and v ({nheads_k}) for MQA/GQA"
        )
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise fail(f"headdim (dim {q.dim() - 1} of q and k) must be in [1, {MAX_HEAD_DIM}], not {head_dim}")
    if not 1 <= head_dim_v <= MAX_HEAD_DIM_V:
        raise fail(f"headdim of v (dim {q.dim() - 1}) must be in [1, {MAX_HEAD_DIM_V}], not {head_dim_v}")


# The packed tensors: how many of q, k, v each holds at the packing dim, and its layout (dense, varlen).
_PACKED = {
    "qkv": (3, "(batch_size, seqlen, 3, nheads, headdim)", "(total, 3, nheads, headdim)"),
    "kv": (2, "(batch_size, seqlen_k, 2, nheads_k, headdim)", "(total_k, 2, nheads_k, headdim)"),
}


def unpack_qkv(varlen: bool = False, **tensors: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v from the user's tensors by name (``q, k, v``, ``qkv`` or ``q, kv``), shapes checked.

    A packed tensor is unbound into views along its packing dim (2, or 1 with ``varlen``), never copied.
    """
    check_tensors(**tensors)
    views: dict[str, torch.Tensor] = {}
    packed = None
    pack_dim = 1 if varlen else 2
    for name, t in tensors.items():
        if name not in _PACKED:
            views[name] = t
            continue
        count, dense_layout, varlen_layout = _PACKED[name]
        layout = varlen_layout if varlen else dense_layout
        check_rank(name, t, layout)
        if t.shape[pack_dim] != count:
            raise FlashtileValueError(
                f"{name} must have shape {layout} with {count} at dim {pack_dim}; got {_shape(t)}"
            )
        # "qkv" unbinds into q, k, v and "kv" into k, v: the name spells the views.
        views.update(zip(name, t.unbind(dim=pack_dim), strict=True))
        packed = (name, t)
    check_qkv_shapes(views["q"], views["k"], views["v"], packed, varlen)
    return views["q"], views["k"], views["v"]


def _is_finite(x: float) -> bool:
    # Comparisons rather than math.isfinite, which torch.compile cannot trace on symbolic floats.
    return -math.inf < x < math.inf


def _is_real(x: object) -> bool:
    # Python floats and ints first: an isinstance check against an ABC costs ~0.5 µs a call.
    return type(x) is float or type(x) is int or (isinstance(x, numbers.Real) and not isinstance(x, bool))


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


def check_dropout_p(dropout_p: object) -> float:
    """``dropout_p`` as a float in [0, 1) (1 would drop everything and divide by 0)."""
    if not _is_real(dropout_p):
        raise FlashtileTypeError(f"dropout_p must be a float in [0, 1); got {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise FlashtileValueError(f"dropout_p must be in [0, 1); got {dropout_p!r}")
    return p


def _plain(x: object) -> object:
    """Python values for a torch tensor or NumPy array (a list, or a scalar when 0-d); else ``x``."""
    numpy = sys.modules.get("numpy")
    if isinstance(x, torch.Tensor) or (numpy is not None and isinstance(x, numpy.ndarray)):
        return x.tolist()
    return x


def _is_int(x: object) -> bool:
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def normalize_window(window_size: object, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """``(left, right)`` as the kernels take it: −1 = unlimited, ``causal`` folded into ``right = 0``.

    ``window_size`` is any pair of integers: a tuple or list, NumPy integers, 0-d integer tensors, a 1-D
    integer tensor or array of 2. As in flash_attn's C++, a negative bound and a bound ≥ ``seqlen_k`` both
    become −1, then ``causal`` sets ``right = 0``; ``(-1, 0)`` is plain causal attention.
    """
    bounds = window_size
    # The usual argument, a tuple of two ints, needs no conversion (Sequence is an ABC: a slow check).
    if not (type(bounds) is tuple and len(bounds) == 2 and type(bounds[0]) is int and type(bounds[1]) is int):
        pair = _plain(window_size)
        bounds = [_plain(w) for w in pair] if isinstance(pair, Sequence) and not isinstance(pair, str) else []
        if len(bounds) != 2 or not all(_is_int(w) for w in bounds):
            raise FlashtileTypeError(
                "window_size must be a pair of integers (left, right), -1 meaning unlimited; "
                f"got {describe(window_size)}"
            )
    left, right = bounds
    left = -1 if left < 0 or left >= seqlen_k else int(left)
    right = -1 if right < 0 or right >= seqlen_k else int(right)
    return left, 0 if causal else right


def check_softcap(softcap: object) -> float:
    """``softcap`` as a float: a finite real, ≤ 0 disabling it (as in flash_attn) and becoming 0.0."""
    if not _is_real(softcap):
        raise FlashtileTypeError(f"softcap must be a float (≤ 0 disables it); got {softcap!r}")
    cap = float(softcap)
    if not _is_finite(cap):
        raise FlashtileValueError(f"softcap must be finite (≤ 0 disables it); got {softcap!r}")
    return max(cap, 0.0)


def check_alibi_slopes(
    alibi_slopes: object, batch: int, nheads: int, device: torch.device
) -> torch.Tensor | None:
    """None, or the slopes as a contiguous float32 ``(nheads,)`` or ``(batch, nheads)`` tensor on ``device``
    (a non-contiguous tensor is copied)."""
    if alibi_slopes is None:
        return None
    accepted = f"a float32 tensor of shape ({nheads},) or ({batch}, {nheads}) on {device}, or None"
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.layout != torch.strided:
        raise FlashtileTypeError(f"alibi_slopes must be {accepted}; got {describe(alibi_slopes)}")
    if alibi_slopes.dtype != torch.float32:
        raise FlashtileTypeError(f"alibi_slopes must be {accepted}; got dtype {alibi_slopes.dtype}")
    if _shape(alibi_slopes) not in ((nheads,), (batch, nheads)):
        raise FlashtileValueError(f"alibi_slopes must be {accepted}; got shape {_shape(alibi_slopes)}")
    if alibi_slopes.device != torch.device(device):
        raise FlashtileValueError(f"alibi_slopes must be {accepted}; got a tensor on {alibi_slopes.device}")
    return alibi_slopes.contiguous()


_SINK_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_learnable_sink(
    learnable_sink: object, nheads: int, device: torch.device, lse_dtype: torch.dtype
) -> torch.Tensor | None:
    """None, or the sink logits as a contiguous ``(nheads,)`` tensor in ``lse_dtype`` (float32, float64 for
    float64 inputs) on ``device``. Any floating dtype is accepted (transformers hands the model's) and
    converted differentiably, so the gradient comes back in the caller's dtype."""
    if learnable_sink is None:
        return None
    accepted = f"a floating-point tensor of shape ({nheads},) (one logit per query head) on {device}, or None"
    if not isinstance(learnable_sink, torch.Tensor) or learnable_sink.layout != torch.strided:
        raise FlashtileTypeError(f"learnable_sink must be {accepted}; got {describe(learnable_sink)}")
    if learnable_sink.dtype not in _SINK_DTYPES:
        raise FlashtileTypeError(
            f"learnable_sink must be {accepted} ({_names(_SINK_DTYPES)}); got dtype {learnable_sink.dtype}"
        )
    if _shape(learnable_sink) != (nheads,):
        raise FlashtileValueError(f"learnable_sink must be {accepted}; got shape {_shape(learnable_sink)}")
    if learnable_sink.device != torch.device(device):
        raise FlashtileValueError(
            f"learnable_sink must be {accepted}; got a tensor on {learnable_sink.device}"
        )
    return sink_in_lse_dtype(learnable_sink, lse_dtype)


def sink_in_lse_dtype(learnable_sink: torch.Tensor, lse_dtype: torch.dtype) -> torch.Tensor:
    """A checked sink as the kernels take it: contiguous in ``lse_dtype``, converted differentiably (nothing
    to do for a contiguous one of that dtype). A remembered plain call (flashtile.plain_calls) redoes this."""
    return learnable_sink.to(lse_dtype).contiguous()


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
    received = describe(value) if isinstance(value, torch.Tensor) else f"{value!r} ({type(value).__name__})"
    raise FlashtileTypeError(f"{name} must be a bool (Python, NumPy or a 0-d bool tensor); got {received}")


class Options(NamedTuple):
    """The options as the layers below the API take them, normalised (docs/design/options.md)."""

    causal: bool
    window_size: tuple[int, int]
    softcap: float
    alibi_slopes: torch.Tensor | None
    dropout_p: float
    return_attn_probs: bool
    deterministic: bool


def check_options(
    dropout_p: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    causal: object,
    deterministic: object,
    return_attn_probs: object,
    seqlen_k: int,
    batch: int,
    nheads: int,
    device: torch.device,
) -> Options:
    """The non-tensor arguments shared by every flash_attn_* function, checked and normalised.

    ``seqlen_k`` is the keys' length (``max_seqlen_k`` for varlen), against which the window is
    normalised; ``batch`` and ``nheads`` size the ALiBi slopes. ``causal`` comes back true for every
    window whose right side is 0 (the causal constraint), ``window_size=(-1, 0)`` included.

    ``deterministic`` reaches the backward: the Hopper backward then makes dQ without atomics; the portable
    and reference backwards are deterministic either way.
    """
    causal = check_flag("causal", causal)
    deterministic = check_flag("deterministic", deterministic)
    return_attn_probs = check_flag("return_attn_probs", return_attn_probs)
    p = check_dropout_p(dropout_p)
    window = normalize_window(window_size, causal, seqlen_k)
    cap = check_softcap(softcap)
    slopes = check_alibi_slopes(alibi_slopes, batch, nheads, device)
    return Options(window[1] == 0, window, cap, slopes, p, return_attn_probs, deterministic)


def _debug() -> bool:
    return _DEBUG.get("0") == "1"


def check_max_seqlen(name: str, value: object) -> int:
    """``value`` as an int ≥ 0 (a Python or NumPy integer, or a 0-d integer tensor)."""
    plain = _plain(value)
    if not _is_int(plain) or plain < 0:
        raise FlashtileValueError(
            f"{name} must be an integer ≥ 0 (the longest sequence); got {describe(value)}"
        )
    return int(plain)


VMAP_OVER_CU_SEQLENS = "map over q, k and v, with the same boundaries for every sample"


def check_cu_seqlens(
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
    total_q: int,
    total_k: int,
    device: torch.device,
    names: tuple[str, str, str, str] = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
) -> tuple[int, int]:
    """A packed batch's boundaries: int32, 1-D, contiguous ``(batch_size + 1,)`` tensors on ``device``, the
    same length for q and k, and ``max_seqlen_q/k`` integers; returns the two maxima as ints.

    Values (start at 0, non-decreasing, last = ``total_q`` / ``total_k``, every length ≤ its max_seqlen;
    zero-length sequences are allowed) are checked for CPU tensors, and for CUDA tensors only under
    ``FLASHTILE_DEBUG=1`` (a host synchronisation); never inside a torch.compile'd graph. ``names`` are
    the user's argument names (the qkv-packed function has one ``cu_seqlens`` and one ``max_seqlen``).
    """
    name_q, name_k, name_max_q, name_max_k = names
    for name, cu in ((name_q, cu_seqlens_q), (name_k, cu_seqlens_k)):
        accepted = f"a contiguous 1-D torch.int32 tensor (batch_size + 1,) on {device}"
        if not isinstance(cu, torch.Tensor) or cu.layout != torch.strided:
            raise FlashtileTypeError(f"{name} must be {accepted}; got {describe(cu)}")
        if cu.dtype != torch.int32:
            raise FlashtileTypeError(f"{name} must be {accepted}; got dtype {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise FlashtileValueError(f"{name} must be {accepted}; got shape {_shape(cu)}")
        if not cu.is_contiguous():
            raise FlashtileValueError(f"{name} must be {accepted}; got strides {cu.stride()}")
        if cu.device != torch.device(device):
            raise FlashtileValueError(f"{name} must be {accepted}; got a tensor on {cu.device}")
        if torch._C._functorch.is_batchedtensor(cu):
            raise NotImplementedError(f"torch.vmap over {name} is not supported: {VMAP_OVER_CU_SEQLENS}")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise FlashtileValueError(
            f"{name_q} and {name_k} must have the same length (batch_size + 1); got "
            f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    max_q = check_max_seqlen(name_max_q, max_seqlen_q)
    max_k = check_max_seqlen(name_max_k, max_seqlen_k)
    # torch.compile cannot trace the host copy: a compiled graph skips the value checks.
    if not torch.compiler.is_compiling() and (torch.device(device).type == "cpu" or _debug()):
        _check_cu_seqlens_values(name_q, cu_seqlens_q, total_q, name_max_q, max_q, "q")
        _check_cu_seqlens_values(name_k, cu_seqlens_k, total_k, name_max_k, max_k, "k")
    return max_q, max_k


def _check_cu_seqlens_values(
    name: str, cu: torch.Tensor, total: int, name_max: str, max_seqlen: int, side: str
) -> None:
    bounds = cu.tolist()
    if bounds[0] != 0:
        raise FlashtileValueError(f"{name} must start at 0; got {name}[0] = {bounds[0]}")
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    if any(n < 0 for n in lengths):
        raise FlashtileValueError(f"{name} must be non-decreasing; got {bounds}")
    if bounds[-1] != total:
        raise FlashtileValueError(
            f"{name} must end at the number of tokens of {side} (dim 0), {total}; "
            f"got {name}[-1] = {bounds[-1]}"
        )
    if lengths and max(lengths) > max_seqlen:
        raise FlashtileValueError(
            f"{name_max} must be at least the longest sequence in {name}, {max(lengths)}; got {max_seqlen}"
        )
