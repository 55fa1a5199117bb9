"""Block-diagonal attention: positions attend within consecutive groups of ``size`` tokens."""

import triton
import triton.language as tl

from flashtile.mods import bind

SIZE = tl.constexpr(1)


@triton.jit
def _block_diagonal(b, h, q_idx, kv_idx):
    return q_idx // SIZE == kv_idx // SIZE


def block_diagonal(size: int):
    """The mask of diagonal blocks of ``size`` × ``size`` positions."""
    if size < 1:
        raise ValueError(f"block_diagonal size must be ≥ 1; got {size}")
    return bind(_block_diagonal, SIZE=int(size))
