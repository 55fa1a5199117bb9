"""Ready-made ``mask_mod`` functions, one per file, each a ``@triton.jit`` function of
``(b, h, q_idx, kv_idx[, aux])`` that runs in the kernels and on PyTorch tensors alike.

Positions are top-left aligned, as in FlexAttention: ``masks.causal`` is ``q_idx >= kv_idx``. For the
bottom-right alignment of flash_attn's ``causal=True`` with ``seqlen_q != seqlen_k``, pass ``causal=True``
to the attention call instead. Functions with parameters are factories (``sliding_window(256, 0)``)
returning a new function per distinct parameter, which Triton compiles once and caches on disk.
"""

from flashtile.masks.block_diagonal import block_diagonal
from flashtile.masks.causal import causal
from flashtile.masks.combine import and_masks, or_masks
from flashtile.masks.document import document, document_ids
from flashtile.masks.prefix_lm import prefix_lm
from flashtile.masks.sliding_window import sliding_window
from flashtile.masks.strided import strided

__all__ = [
    "and_masks",
    "block_diagonal",
    "causal",
    "document",
    "document_ids",
    "or_masks",
    "prefix_lm",
    "sliding_window",
    "strided",
]
