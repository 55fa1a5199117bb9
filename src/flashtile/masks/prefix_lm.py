"""Prefix-LM: every query sees the first ``prefix`` keys (bidirectional prefix), and the rest causally."""

import triton
import triton.language as tl

from flashtile.mods import bind

PREFIX = tl.constexpr(0)


@triton.jit
def _prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < PREFIX) | (kv_idx <= q_idx)


def prefix_lm(prefix: int):
    """The prefix-LM mask with a bidirectional prefix of ``prefix`` tokens."""
    if prefix < 0:
        raise ValueError(f"prefix_lm prefix must be ≥ 0; got {prefix}")
    return bind(_prefix_lm, PREFIX=int(prefix))
