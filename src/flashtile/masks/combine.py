"""The intersection and union of two masks (each with or without ``aux``)."""

import triton
import triton.language as tl  # noqa: F401 (Triton's interpreter needs it in a jit function's module)

from flashtile.mods import bind, takes_aux

FIRST = None
SECOND = None


@triton.jit
def _and(b, h, q_idx, kv_idx):
    return FIRST(b, h, q_idx, kv_idx) & SECOND(b, h, q_idx, kv_idx)


@triton.jit
def _and_aux(b, h, q_idx, kv_idx, aux):
    return FIRST(b, h, q_idx, kv_idx, aux) & SECOND(b, h, q_idx, kv_idx, aux)


@triton.jit
def _or(b, h, q_idx, kv_idx):
    return FIRST(b, h, q_idx, kv_idx) | SECOND(b, h, q_idx, kv_idx)


@triton.jit
def _or_aux(b, h, q_idx, kv_idx, aux):
    return FIRST(b, h, q_idx, kv_idx, aux) | SECOND(b, h, q_idx, kv_idx, aux)


@triton.jit
def _with_aux(b, h, q_idx, kv_idx, aux):
    return FIRST(b, h, q_idx, kv_idx)


def _aux_form(mask_mod):
    return mask_mod if takes_aux(mask_mod, "mask_mod", 4) else bind(_with_aux, FIRST=mask_mod)


def _combine(plain, with_aux, first, second):
    if takes_aux(first, "mask_mod", 4) or takes_aux(second, "mask_mod", 4):
        return bind(with_aux, FIRST=_aux_form(first), SECOND=_aux_form(second))
    return bind(plain, FIRST=first, SECOND=second)


def and_masks(first, second):
    """``first & second``: e.g. ``and_masks(causal, document())`` for causal document masking."""
    return _combine(_and, _and_aux, first, second)


def or_masks(first, second):
    """``first | second``."""
    return _combine(_or, _or_aux, first, second)
