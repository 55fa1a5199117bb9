"""Block-sparse iteration and the programmable mods (``mask_mod``, ``score_mod``) inside the kernels.

A program reads its row of a :class:`flashtile.BlockMask` list (the key blocks of its query block, or the
query blocks of its key block in the dK/dV kernel) and walks the listed blocks as one virtual contiguous
axis: entry ``e`` covers ``[e·SPARSE_BLOCK, (e + 1)·SPARSE_BLOCK)`` of it, so the step loops of the dense
kernels run unchanged over ``[0, count·SPARSE_BLOCK)`` with :func:`listed_tile` mapping each step to the
real block (kernel tiles are at most the mask's block and divide it). Design: docs/design/block_sparse.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flashtile.mods import Mods, takes_aux

LN_2_C = tl.constexpr(0.6931471805599453)
LOG2_E_C = tl.constexpr(1.4426950408889634)


@triton.jit
def block_list(count_ptr, index_ptr, b, h, row, stride_b, stride_h, row_len):
    """(pointer to the listed block indices, how many) of list ``row`` for batch ``b``, head ``h``; a
    broadcast dimension has stride 0."""
    offset = b * stride_b + h * stride_h + row
    return index_ptr + offset * row_len, tl.load(count_ptr + offset)


@triton.jit
def listed_tile(it, blocks, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr):
    """The first position of the tile at step ``it`` of a loop: ``it`` itself when dense; in a listed
    loop, the matching offset inside the listed block ``blocks[it // SPARSE_BLOCK]``."""
    if SPARSE:
        return tl.load(blocks + it // SPARSE_BLOCK) * SPARSE_BLOCK + it % SPARSE_BLOCK
    else:
        return it


@triton.jit
def listed_below(blocks, count, bound):
    """How many leading entries of a sorted block list are below ``bound`` (they lead, the list being
    sorted). With ``cdiv(seqlen, block)``: the blocks starting inside the sequence; the lists cover the
    longest sequence of a packed batch, and a shorter one, or one with no rows at all, must not visit the
    blocks past its end (their rows belong to the next sequence, or lie past the tensor). With
    ``seqlen // block``: the blocks ending inside it; the rest cross or pass ``seqlen`` (the last one of a
    dense batch, any under varlen) and need a mask."""
    n = 0
    for e in range(0, count):
        n += (tl.load(blocks + e) < bound).to(tl.int32)
    return n


@triton.jit
def call_mod(
    args_first, b, h, rows, cols, seqlen_q, seqlen_k, aux, FN: tl.constexpr, TAKES_AUX: tl.constexpr
):
    """``FN(args_first, b, h, q_idx, kv_idx[, aux])`` (``args_first`` None for a mask_mod) with indices
    clamped into the sequence, so a mod that loads ``aux`` at them never reads past its tensors."""
    q_idx = tl.minimum(rows, seqlen_q - 1)
    kv_idx = tl.minimum(cols, seqlen_k - 1)
    if args_first is None:
        if TAKES_AUX:
            return FN(b, h, q_idx, kv_idx, aux)
        else:
            return FN(b, h, q_idx, kv_idx)
    else:
        if TAKES_AUX:
            return FN(args_first, b, h, q_idx, kv_idx, aux)
        else:
            return FN(args_first, b, h, q_idx, kv_idx)


@triton.jit
def modded_scores(s2, b, h, rows, cols, seqlen_q, seqlen_k, aux, FN: tl.constexpr, TAKES_AUX: tl.constexpr):
    """``(score_mod(s)·log2(e), s)`` of base-2 scores ``s2 = s·log2(e)``: mods see natural-log scores."""
    s = s2 * LN_2_C
    return call_mod(s, b, h, rows, cols, seqlen_q, seqlen_k, aux, FN, TAKES_AUX) * LOG2_E_C, s


@dataclass(frozen=True)
class KernelMods:
    """What a launcher passes the kernels for :class:`flashtile.mods.Mods`: the compile-time functions
    and switches, and the runtime block lists."""

    switches: dict[str, object]
    aux: tuple[torch.Tensor, ...] | None
    block_mask: object | None

    @functools.cached_property
    def launch_key(self) -> tuple[tuple[tuple[str, object], ...], tuple[int, int, int], tuple[int, int, int]]:
        """What the launches take from the mods but the tensors: the switches (jit functions hash by
        their source), and the ("kv", "q") list strides."""
        return tuple(self.switches.items()), self.strides("kv"), self.strides("q")

    def list_args(self, side: str, full: bool) -> tuple[object, ...]:
        """(count, indices) of the block mask's ``side`` lists ("kv": per query block, "q": per key
        block), partial or full; (None, None) without a block mask."""
        bm = self.block_mask
        if bm is None:
            return None, None
        prefix = "full_" if full else ""
        return getattr(bm, f"{prefix}{side}_num_blocks"), getattr(bm, f"{prefix}{side}_indices")

    def strides(self, side: str) -> tuple[int, int, int]:
        """(batch stride, head stride, row length) of the ``side`` lists; 0 where broadcast."""
        bm = self.block_mask
        if bm is None:
            return 0, 0, 0
        counts = getattr(bm, f"{side}_num_blocks")
        batch, heads, rows = counts.shape
        return (
            (0 if batch == 1 else heads * rows),
            (0 if heads == 1 else rows),
            getattr(bm, f"{side}_indices").shape[-1],
        )


def fwd_switches(switches: dict[str, object]) -> dict[str, object]:
    """The forward kernel's switches (it has no score_mod_bwd)."""
    return {k: v for k, v in switches.items() if not k.startswith("SCORE_MOD_BWD")}


def mask_tile(block: int, switches: dict[str, object], dim: int) -> int:
    """A kernel tile along ``dim`` (0 queries, 1 keys) under the mods' ``switches``: at most the block
    mask's block there, which it then divides (both are powers of two)."""
    if not switches["HAS_BLOCK_MASK"]:
        return block
    return min(block, switches["SPARSE_BLOCK_N" if dim else "SPARSE_BLOCK_M"])


def kernel_mods(mods: Mods | None) -> KernelMods:
    """The kernels' view of ``mods`` (None: every switch off, so the kernels compile as without mods)."""
    mods = mods or Mods()
    bm = mods.block_mask
    mask_mod = mods.mask_mod or (bm.mask_mod if bm is not None else None)
    switches = dict(
        HAS_BLOCK_MASK=bm is not None,
        SPARSE_BLOCK_M=bm.block_size[0] if bm is not None else 1,
        SPARSE_BLOCK_N=bm.block_size[1] if bm is not None else 1,
        MASK_MOD=mask_mod,
        MASK_MOD_AUX=mask_mod is not None and takes_aux(mask_mod, "mask_mod", 4),
        SCORE_MOD=mods.score_mod,
        SCORE_MOD_BWD=mods.score_mod_bwd,
        SCORE_MOD_AUX=mods.score_mod is not None and takes_aux(mods.score_mod, "score_mod", 5),
        SCORE_MOD_BWD_AUX=mods.score_mod_bwd is not None
        and takes_aux(mods.score_mod_bwd, "score_mod_bwd", 5),
    )
    return KernelMods(switches, mods.aux_tensors, bm)


# The view of no mods, built once: most calls have none.
NO_MODS = kernel_mods(None)
