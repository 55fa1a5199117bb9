"""The portable Triton backend's entry points: the launchers of kernels/fwd.py and kernels/bwd.py."""

from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd

__all__ = ["attn_bwd", "attn_fwd"]
