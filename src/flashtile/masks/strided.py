"""Strided (dilated) attention: query ``q_idx`` sees the keys at distances multiple of ``stride``."""

import triton
import triton.language as tl

from flashtile.mods import bind

STRIDE = tl.constexpr(1)


@triton.jit
def _strided(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx) % STRIDE == 0


def strided(stride: int):
    """The dilated mask ``(q_idx − kv_idx) mod stride = 0`` (compose with ``causal`` for causal LMs)."""
    if stride < 1:
        raise ValueError(f"strided stride must be ≥ 1; got {stride}")
    return bind(_strided, STRIDE=int(stride))
