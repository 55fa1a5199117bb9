"""The Hopper backend: Gluon kernels for compute capability 9.x, with the launchers' entry points.

``attn_fwd`` / ``attn_bwd`` take the portable launchers' arguments (docs/design/options.md) for calls that
:func:`unsupported_reason` accepts; :mod:`flashtile.backend` sends the others to the portable kernels.
The Gluon modules are imported on first launch, so this package imports wherever Triton does.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from flashtile.kernels.hopper.support import (
    bwd_unsupported_reason,
    device_unsupported_reason,
    fwd_unsupported_reason,
)

__all__ = [
    "attn_bwd", "attn_fwd", "bwd_window", "device_unsupported_reason", "prepare", "unsupported_reason",
]  # fmt: skip

_CHECKS = {"attn_fwd": fwd_unsupported_reason, "attn_bwd": bwd_unsupported_reason}


def unsupported_reason(
    entry: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Mapping[str, object]
) -> str | None:
    """Why ``entry`` (``"attn_fwd"`` or ``"attn_bwd"``) of this backend does not run the call, or None."""
    return _CHECKS[entry](q, k, v, options)


def attn_fwd(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flashtile.kernels.hopper.fwd.attn_fwd`, the Gluon forward."""
    from flashtile.kernels.hopper.fwd import attn_fwd as launch

    return launch(*args, **kwargs)


def prepare(
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
    """A plain call's forward and backward prepared for its call signature
    (:class:`flashtile.kernels.hopper.prepared.PlainAttention`), or None where the Gluon forward does not
    run it (or its problem is empty, or its scale not positive): the backend's general path takes those."""
    if softmax_scale <= 0 or 0 in q.shape or k.shape[1] == 0:
        return None
    options = {
        "window_size": window_size, "softcap": softcap, "alibi_slopes": alibi_slopes, "dropout_p": dropout_p,
        "learnable_sink": learnable_sink,
    }  # fmt: skip
    if fwd_unsupported_reason(q, k, v, options) is not None:
        return None
    from flashtile.kernels.hopper.prepared import PlainAttention

    return PlainAttention(
        q, k, v, softmax_scale, causal, window_size, softcap, deterministic, alibi_slopes, dropout_p,
        learnable_sink,
    )  # fmt: skip


def bwd_window(causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
    """The window a backward call has: causal bounds the right side at 0 and keeps the left side (a causal
    sliding window is not plain causal attention, which the Gluon backward would otherwise take it for)."""
    left, right = window_size
    return (left, 0) if causal else (left, right)


def attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    **options,
) -> tuple[torch.Tensor, ...]:
    """The Gluon backward (:mod:`flashtile.kernels.hopper.bwd`) for the calls it covers, the portable Triton
    backward for the others; both take the ``(out, lse)`` of either forward unchanged. Returns what the
    portable launcher returns: ``(dq, dk, dv)``, and the sink's gradient with a ``learnable_sink``."""
    from flashtile.kernels.hopper import bwd as gluon_bwd

    window = bwd_window(causal, options.get("window_size", (-1, -1)))
    reason = gluon_bwd.bwd_unsupported_reason(q, k, v, dout, {**options, "window_size": window})
    if reason is None and gluon_bwd.routed_by_default(q.shape[-1]):
        rest = {
            name: value for name, value in options.items()
            if name not in ("window_size", "deterministic", "softcap", "alibi_slopes")
        }  # fmt: skip
        return gluon_bwd.launch_supported(
            dout, q, k, v, out, lse, softmax_scale, window, options.get("deterministic", False),
            options.get("softcap", 0.0), options.get("alibi_slopes"), rest,
        )  # fmt: skip
    from flashtile.kernels.bwd import attn_bwd as portable_bwd

    options.pop("deterministic", None)  # the portable backward has no atomics: always deterministic
    return portable_bwd(dout, q, k, v, out, lse, softmax_scale, causal, **options)
