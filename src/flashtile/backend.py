"""Which implementation runs attention: the Hopper fast path, the portable Triton kernels or the reference.

Each backend is a module offering ``attn_fwd`` and ``attn_bwd`` with the launchers' contract
(docs/design/options.md), and optionally ``prepare`` (a plain call's launches worked out once for its call
signature: :func:`prepare`), listed in :data:`MODULES`:

- ``hopper``: the Gluon kernels for compute capability 9.x (``flashtile.kernels.hopper``);
- ``triton``: the portable Triton kernels (``flashtile.kernels.portable``);
- ``reference``: the tiled PyTorch implementation (``flashtile.reference``).

``FLASHTILE_BACKEND`` chooses, and is read at every call:

- ``auto`` (the default), one rule: ``hopper`` when the tensors are on a CUDA device of compute capability
  9.x, Gluon imports and the call is one the fast path supports
  (:func:`flashtile.kernels.hopper.support.fwd_unsupported_reason`); else ``triton`` on CUDA (when Triton is
  installed); else ``reference``. The device part is decided per call by :func:`resolve`, the call part by
  :func:`launcher`, which hands an unsupported call of the hopper backend to ``triton``;
- ``hopper`` forces the fast path, and raises an error naming the reason where it cannot run the call;
- ``triton`` forces the portable kernels (on a CPU tensor only under ``TRITON_INTERPRET=1``, Triton's
  interpreter);
- ``reference`` forces the tiled PyTorch implementation on any device.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from types import ModuleType

import torch

from flashtile._environ import Knob
from flashtile.errors import FlashtileValueError

ENV_VAR = "FLASHTILE_BACKEND"
BACKENDS = ("hopper", "triton", "reference")
CHOICES = ("auto", *BACKENDS)
MODULES = {
    "hopper": "flashtile.kernels.hopper",
    "triton": "flashtile.kernels.portable",
    "reference": "flashtile.reference",
}


_INTERPRET = Knob("TRITON_INTERPRET")
_REQUESTED = Knob(ENV_VAR)


def _interpreter_enabled() -> bool:
    return _INTERPRET.get("0") == "1"


# Looked up once at import: torch.compile cannot trace importlib inside a compiled region.
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def _triton_installed() -> bool:
    return _TRITON_INSTALLED


def requested() -> str:
    """The normalised value of ``FLASHTILE_BACKEND`` (``auto`` when unset); raises on an unknown value."""
    value = _REQUESTED.get("auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise FlashtileValueError(
            f"{ENV_VAR}={os.environ.get(ENV_VAR)!r} is not a backend; accepted values: {', '.join(CHOICES)}"
        )
    return value


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device``, or None when they can."""
    if not _triton_installed():
        return "the triton package is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if _interpreter_enabled():
            return None
        return (
            "the tensors are on the CPU and TRITON_INTERPRET is not 1; set TRITON_INTERPRET=1 before "
            "importing triton to run the kernels in Triton's interpreter, or use FLASHTILE_BACKEND=reference"
        )
    return f"Triton runs on CUDA devices (or on the CPU under TRITON_INTERPRET=1), not on {device.type!r}"


# Evaluated once at trace time under torch.compile, so the capability query and the imports stay eager.
@torch.compiler.assume_constant_result
def hopper_unavailable_reason(device: torch.device) -> str | None:
    """Why the Hopper fast path cannot run on ``device`` at all (whatever the call), or None when it can."""
    if device.type != "cuda":
        return f"the Hopper fast path runs on CUDA devices of compute capability 9.x, not on {device.type!r}"
    if not _triton_installed():
        return "the triton package is not installed"
    return module("hopper").device_unsupported_reason(device)


def resolve(device: torch.device) -> str:
    """The backend, ``"hopper"``, ``"triton"`` or ``"reference"``, for tensors on ``device``.

    ``hopper`` still hands the calls its kernels do not support to ``triton`` under ``auto``
    (:func:`launcher`). Raises FlashtileValueError (a ValueError and a RuntimeError) for an unknown
    ``FLASHTILE_BACKEND`` or for a forced backend that cannot run on ``device``.
    """
    device = torch.device(device)
    choice = requested()
    if choice == "reference":
        return "reference"
    if choice != "auto":
        check = hopper_unavailable_reason if choice == "hopper" else triton_unavailable_reason
        reason = check(device)
        if reason is not None:
            raise FlashtileValueError(f"{ENV_VAR}={choice} was asked for but {reason}")
        return choice
    if hopper_unavailable_reason(device) is None:
        return "hopper"
    return "triton" if device.type == "cuda" and _triton_installed() else "reference"


def available_backends(device: torch.device) -> list[str]:
    """Every backend that can run on ``device`` in this process, whatever ``FLASHTILE_BACKEND`` says."""
    device = torch.device(device)
    found = []
    if hopper_unavailable_reason(device) is None:
        found.append("hopper")
    if triton_unavailable_reason(device) is None:
        found.append("triton")
    found.append("reference")
    return found


def module(backend: str) -> ModuleType:
    """The module implementing ``backend`` (imported on first use)."""
    return importlib.import_module(MODULES[backend])


def launcher(
    backend: str, entry: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Mapping[str, object]
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The function that runs ``entry`` (``"attn_fwd"`` or ``"attn_bwd"``) of ``backend`` for this call.

    ``options`` are the launcher keywords. The hopper backend hands a call its kernels do not support to
    ``triton`` under ``auto`` and raises FlashtileValueError, naming the reason, under
    ``FLASHTILE_BACKEND=hopper``; the check runs before anything launches.
    """
    implementation = module(backend)
    if backend == "hopper":
        reason = implementation.unsupported_reason(entry, q, k, v, options)
        if reason is not None:
            if requested() == "hopper":
                raise FlashtileValueError(f"{ENV_VAR}=hopper was asked for but {reason}")
            implementation = module("triton")
    return getattr(implementation, entry)


def prepare(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    deterministic: bool,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
) -> object | None:
    """``backend``'s plain call prepared for its call signature, or None where it has none for it: an object
    whose ``forward(q, k, v, alibi_slopes, rng_state, learnable_sink)`` and ``backward(dout, q, k, v, out,
    lse, alibi_slopes, rng_state, learnable_sink)`` return what ``attn_fwd`` and ``attn_bwd`` would, or
    None to send a call down the general path (flashtile.plain_calls). ``alibi_slopes`` and
    ``learnable_sink`` (fp32 (H,)): this call's, standing for every call of the signature (their shape,
    dtype and device)."""
    prepare_call = getattr(module(backend), "prepare", None)
    if prepare_call is None:
        return None
    return prepare_call(
        q, k, v, softmax_scale, causal, window_size, softcap, deterministic, alibi_slopes, dropout_p,
        learnable_sink,
    )  # fmt: skip
