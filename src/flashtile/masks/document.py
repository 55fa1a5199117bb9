"""Document masking for packed sequences: a query sees only keys of its own document, whose id per
position is the tensor ``aux[aux_index]`` (int32 ``(N,)``, shared by the batch)."""

import torch
import triton
import triton.language as tl

from flashtile.mods import bind

AUX_INDEX = tl.constexpr(0)


@triton.jit
def _document(b, h, q_idx, kv_idx, aux):
    ids = aux[AUX_INDEX]
    return tl.load(ids + q_idx) == tl.load(ids + kv_idx)


def document(aux_index: int = 0):
    """The document mask reading document ids from ``aux_tensors[aux_index]``; compose with
    ``masks.causal`` through :func:`flashtile.masks.and_masks` for causal documents."""
    return bind(_document, AUX_INDEX=int(aux_index))


def document_ids(cu_seqlens: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """int32 ``(total,)`` document id of each position, from cumulative lengths ``cu_seqlens`` (B + 1,).

    >>> document_ids(torch.tensor([0, 2, 5])).tolist()
    [0, 0, 1, 1, 1]
    """
    total = int(cu_seqlens[-1]) if total is None else total
    positions = torch.arange(total, device=cu_seqlens.device)
    return (torch.searchsorted(cu_seqlens[1:].to(torch.int64), positions, right=True)).to(torch.int32)
