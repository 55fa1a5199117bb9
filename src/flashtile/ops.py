"""The custom ops ``torch.ops.flashtile.attn_fwd`` and ``attn_bwd``, their fake implementations, and the
plain functions ``run_attn_fwd`` and ``run_attn_bwd`` that implement them.

Each dispatches to the Triton launchers or to the tiled PyTorch reference by its ``backend`` argument
(``"triton"`` or ``"reference"``, see :mod:`flashtile.backend`). Inputs are assumed validated. The ops are
what torch.compile traces; eager autograd (:mod:`flashtile.autograd`) calls the plain functions, which
skips the op dispatcher's per-call cost.

Empty problems never reach a backend: with ``B = 0``, ``N_q = 0`` or ``H = 0`` the outputs are empty (and
``dk``, ``dv`` are zeros), and with ``N_k = 0`` every row is fully masked, so ``out = 0``, ``lse = −inf``
and ``dq = 0``.
"""

from __future__ import annotations

import torch

from flashtile.backend import BACKENDS


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def _no_queries(q: torch.Tensor) -> bool:
    return q.shape[0] == 0 or q.shape[1] == 0 or q.shape[2] == 0


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs (the reference path keeps full precision for gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def run_attn_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: ``out`` like ``q``, ``lse`` (B, H, N_q) in :func:`lse_dtype`, natural log."""
    _check_backend(backend)
    if _no_queries(q) or k.shape[1] == 0:
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.full(_lse_shape(q), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
        return out, lse
    if backend == "triton":
        from flashtile.kernels.fwd import attn_fwd as launch

        out, lse = launch(q, k, v, softmax_scale, causal)
    else:
        from flashtile.reference.tiled import attention_fwd

        out, lse = attention_fwd(q, k, v, softmax_scale, causal)
    return out.to(q.dtype).contiguous(), lse.to(lse_dtype(q.dtype)).contiguous()


attn_fwd = torch.library.custom_op("flashtile::attn_fwd", run_attn_fwd, mutates_args=())


@attn_fwd.register_fake
def _attn_fwd_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q), dtype=lse_dtype(q.dtype))
    return out, lse


def run_attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``, each contiguous with the shape and dtype of ``q``, ``k``, ``v``."""
    _check_backend(backend)
    if _no_queries(q) or k.shape[1] == 0:
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        return dq, dk, dv
    if backend == "triton":
        from flashtile.kernels.bwd import attn_bwd as launch

        dq, dk, dv = launch(dout, q, k, v, out, lse, softmax_scale, causal)
    else:
        from flashtile.reference.tiled import attention_bwd

        dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, softmax_scale, causal)
    return (
        dq.to(q.dtype).contiguous(),
        dk.to(k.dtype).contiguous(),
        dv.to(v.dtype).contiguous(),
    )


attn_bwd = torch.library.custom_op("flashtile::attn_bwd", run_attn_bwd, mutates_args=())


@attn_bwd.register_fake
def _attn_bwd_fake(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
