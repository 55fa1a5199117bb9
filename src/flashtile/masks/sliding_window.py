"""Sliding-window attention: query ``q_idx`` sees keys in ``[q_idx − left, q_idx + right]``."""

import triton
import triton.language as tl

from flashtile.mods import bind

LEFT = tl.constexpr(0)
RIGHT = tl.constexpr(0)


@triton.jit
def _sliding_window(b, h, q_idx, kv_idx):
    return (kv_idx >= q_idx - LEFT) & (kv_idx <= q_idx + RIGHT)


def sliding_window(left: int, right: int = 0):
    """The mask of the window ``[q_idx − left, q_idx + right]`` (``right = 0``: causal local attention).

    >>> from flashtile.mods import on_tensors
    >>> import torch
    >>> on_tensors(sliding_window(1))(0, 0, torch.tensor(3), torch.arange(5)).tolist()
    [False, False, True, True, False]
    """
    if left < 0 or right < 0:
        raise ValueError(f"sliding_window bounds must be ≥ 0; got left={left}, right={right}")
    return bind(_sliding_window, LEFT=int(left), RIGHT=int(right))
