"""Checks of the programmable options (``block_mask``, ``mask_mod``, ``score_mod``, ``score_mod_bwd``,
``aux_tensors``) at the API boundary, before any launch; the rest of the arguments are
:mod:`flashtile.validation`'s."""

from __future__ import annotations

import functools

import torch

from flashtile.block_mask import PARTIAL, BlockMask
from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.mods import Mods, check_is_jit, takes_aux
from flashtile.validation import describe

_AUX_DTYPES = (torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64)
# The block size of the block mask made for a mask_mod given without one.
DEFAULT_BLOCK = 128


@functools.lru_cache(maxsize=32)
def _every_tile_partial(seqlen_q: int, seqlen_k: int, device: torch.device) -> BlockMask:
    """One (1, 1) block mask whose tiles are all partial: mask_mod runs everywhere, nothing is skipped."""
    nq, nk = -(-seqlen_q // DEFAULT_BLOCK), -(-seqlen_k // DEFAULT_BLOCK)
    states = torch.full((1, 1, nq, nk), PARTIAL, dtype=torch.int8, device=device)
    return BlockMask.from_states(states, seqlen_q, seqlen_k, DEFAULT_BLOCK)


def _check_aux(aux_tensors: object, device: torch.device) -> tuple[torch.Tensor, ...] | None:
    if aux_tensors is None:
        return None
    if not isinstance(aux_tensors, tuple | list) or not all(isinstance(t, torch.Tensor) for t in aux_tensors):
        raise FlashtileTypeError(
            f"aux_tensors must be a tuple or list of tensors, or None; got {describe(aux_tensors)}"
        )
    for i, t in enumerate(aux_tensors):
        if t.device != device:
            raise FlashtileValueError(
                f"aux_tensors[{i}] is on {t.device}; it must be on q's device, {device}"
            )
        if t.dtype not in _AUX_DTYPES:
            raise FlashtileTypeError(
                f"aux_tensors[{i}] is {t.dtype}; accepted: {', '.join(str(d) for d in _AUX_DTYPES)}"
            )
    # The kernels address each tensor from its first element, row-major.
    return tuple(t.contiguous() for t in aux_tensors)


def _check_block_mask(
    block_mask: object, batch: int, nheads: int, seqlen_q: int, seqlen_k: int, varlen: bool, device
) -> None:
    if not isinstance(block_mask, BlockMask):
        raise FlashtileTypeError(
            "block_mask must be a flashtile.BlockMask (flashtile.create_block_mask or BlockMask.from_tiles), "
            f"or None; got {describe(block_mask)}"
        )
    if block_mask.tile_states.device != device:
        raise FlashtileValueError(
            f"block_mask is on {block_mask.tile_states.device}; it must be on q's device, {device} "
            "(block_mask.to(device))"
        )
    mask_batch, mask_heads = block_mask.tile_states.shape[:2]
    if mask_batch not in (1, batch) or mask_heads not in (1, nheads):
        raise FlashtileValueError(
            f"block_mask has (B, H) = ({mask_batch}, {mask_heads}); it must be 1 or the batch size {batch}, "
            f"and 1 or the number of query heads {nheads}"
        )
    if varlen:
        fits = block_mask.seqlen_q >= seqlen_q and block_mask.seqlen_k >= seqlen_k
        expected = f"at least (max_seqlen_q, max_seqlen_k) = ({seqlen_q}, {seqlen_k})"
    else:
        fits = (block_mask.seqlen_q, block_mask.seqlen_k) == (seqlen_q, seqlen_k)
        expected = f"(seqlen_q, seqlen_k) = ({seqlen_q}, {seqlen_k})"
    if not fits:
        raise FlashtileValueError(
            f"block_mask covers (seqlen_q, seqlen_k) = ({block_mask.seqlen_q}, {block_mask.seqlen_k}); "
            f"expected {expected}"
        )


def check_mods(
    block_mask: object = None,
    mask_mod: object = None,
    score_mod: object = None,
    score_mod_bwd: object = None,
    aux_tensors: object = None,
    *,
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    varlen: bool,
    device: torch.device,
    needs_grad: bool,
) -> Mods | None:
    """The programmable options checked, as the layers below take them, or None when none is given.

    A ``mask_mod`` without ``block_mask`` gets a block mask whose tiles are all partial (the function
    runs on every tile); ``create_block_mask`` once is what skips empty tiles and unmasks full ones.
    """
    if all(x is None for x in (block_mask, mask_mod, score_mod, score_mod_bwd, aux_tensors)):
        return None
    for name, fn in (("mask_mod", mask_mod), ("score_mod", score_mod), ("score_mod_bwd", score_mod_bwd)):
        check_is_jit(name, fn)
    aux = _check_aux(aux_tensors, device)
    if block_mask is not None:
        _check_block_mask(block_mask, batch, nheads, seqlen_q, seqlen_k, varlen, device)
        if mask_mod is None:
            mask_mod = block_mask.mask_mod
    elif mask_mod is not None:
        block_mask = _every_tile_partial(seqlen_q, seqlen_k, device)
    if score_mod_bwd is not None and score_mod is None:
        raise FlashtileValueError("score_mod_bwd was given without score_mod; pass both or neither")
    if score_mod is not None and score_mod_bwd is None and needs_grad:
        raise FlashtileValueError(
            "score_mod needs score_mod_bwd (d score_mod / d score, same arguments) for the backward: q, k, "
            "v or learnable_sink requires grad. For a bias added to the score it returns 1.0"
        )
    for name, fn, arity in (
        ("mask_mod", mask_mod, 4),
        ("score_mod", score_mod, 5),
        ("score_mod_bwd", score_mod_bwd, 5),
    ):
        if fn is not None and takes_aux(fn, name, arity) and aux is None:
            raise FlashtileValueError(f"{name} {fn.fn.__name__} takes aux, but aux_tensors is None")
    return Mods(block_mask, mask_mod, score_mod, score_mod_bwd, aux)
