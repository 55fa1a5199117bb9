"""Which implementation runs attention for a device: the Triton kernels or the pure-PyTorch reference.

``FLASHTILE_BACKEND`` chooses: ``auto`` (the default) picks Triton on CUDA (when Triton is installed) and the
reference everywhere else;
``triton`` forces the kernels (on a CPU tensor only under ``TRITON_INTERPRET=1``, Triton's interpreter);
``reference`` forces the tiled PyTorch implementation on any device. The variable is read at every call.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from flashtile.errors import FlashtileValueError

ENV_VAR = "FLASHTILE_BACKEND"
BACKENDS = ("triton", "reference")
CHOICES = ("auto", *BACKENDS)


def _interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Looked up once at import: torch.compile cannot trace importlib inside a compiled region.
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def _triton_installed() -> bool:
    return _TRITON_INSTALLED


def requested() -> str:
    """The normalised value of ``FLASHTILE_BACKEND`` (``auto`` when unset); raises on an unknown value."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
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


def resolve(device: torch.device) -> str:
    """The backend, ``"triton"`` or ``"reference"``, that runs attention on tensors on ``device``.

    Raises FlashtileValueError (a ValueError and a RuntimeError) for an unknown ``FLASHTILE_BACKEND``
    or for ``triton`` where it cannot run.
    """
    device = torch.device(device)
    choice = requested()
    if choice == "reference":
        return "reference"
    if choice == "triton":
        reason = triton_unavailable_reason(device)
        if reason is not None:
            raise FlashtileValueError(f"{ENV_VAR}=triton was asked for but {reason}")
        return "triton"
    return "triton" if device.type == "cuda" and _triton_installed() else "reference"


def available_backends(device: torch.device) -> list[str]:
    """Every backend that can run on ``device`` in this process, whatever ``FLASHTILE_BACKEND`` says."""
    device = torch.device(device)
    found = []
    if triton_unavailable_reason(device) is None:
        found.append("triton")
    found.append("reference")
    return found
