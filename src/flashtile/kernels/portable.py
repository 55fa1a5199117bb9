"""The portable Triton backend's entry points: the launchers of kernels/fwd.py and kernels/bwd.py.

Each looks its launcher up at call time, so the launcher modules stay the one place to replace or patch.
"""

from __future__ import annotations

import torch

from flashtile.kernels import bwd, fwd


def attn_fwd(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flashtile.kernels.fwd.attn_fwd`."""
    return fwd.attn_fwd(*args, **kwargs)


def attn_bwd(*args, deterministic: bool = False, **kwargs) -> tuple[torch.Tensor, ...]:
    """:func:`flashtile.kernels.bwd.attn_bwd`; deterministic either way (each program owns what it writes)."""
    return bwd.attn_bwd(*args, **kwargs)
