"""Which keys a query sees, and the loop bounds that skip invisible tiles.

Query i sees key j iff ``i + lo_diag ≤ j ≤ i + hi_diag`` with ``lo_diag = off − left``,
``hi_diag = off + right`` and ``off = seqlen_k − seqlen_q`` (bottom-right aligned); causal is the window
(left, 0). An unlimited left side arrives as ``lo_diag = None`` (a compile-time constant, so causal
compiles to the causal code of old); the launchers turn an unlimited right side into one as wide as the
packed tensor. Derivation: docs/design/online_softmax.md, "Window tiles".
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def visible_span(x0, x_len, y_len, lo_diag, hi_diag, BLOCK_X: tl.constexpr, BLOCK_Y: tl.constexpr):
    """Tiles of BLOCK_Y along y for the rows x in [x0, x0 + BLOCK_X), where x sees y iff
    ``x + lo_diag ≤ y ≤ x + hi_diag``: ``(start, unmasked_start, unmasked_end, end)`` with tiles in
    [start, unmasked_start) and [unmasked_end, end) needing a mask, those in between seen whole by every
    row, and nothing outside [start, end) seen by any row. The dK/dV kernel calls it with keys as x and
    queries as y (the mirror diagonals −hi_diag, −lo_diag). A diagonal of None is no bound on that side."""
    # Rows past x_len are never stored: they neither widen the span nor force a mask.
    x1 = tl.minimum(x0 + BLOCK_X, x_len)
    if lo_diag is None:
        start = 0
        unmasked_start = 0
    else:
        start = tl.maximum(x0 + lo_diag, 0) // BLOCK_Y * BLOCK_Y
        # Every row sees y from x1 − 1 + lo_diag on.
        full_start = tl.maximum(x1 - 1 + lo_diag, 0)
        unmasked_start = start + tl.cdiv(tl.maximum(full_start - start, 0), BLOCK_Y) * BLOCK_Y
    if hi_diag is None:
        end = y_len
        full_end = y_len
    else:
        end = tl.minimum(x1 + hi_diag, y_len)
        # Every row sees y up to x0 + hi_diag.
        full_end = tl.minimum(x0 + hi_diag + 1, y_len)
    unmasked_start = tl.minimum(unmasked_start, tl.maximum(end, start))
    unmasked_end = start + tl.maximum(full_end - start, 0) // BLOCK_Y * BLOCK_Y
    unmasked_end = tl.maximum(unmasked_end, unmasked_start)
    return start, unmasked_start, unmasked_end, end


@triton.jit
def visible(rows, cols, seqlen_k, lo_diag, hi_diag, IS_LOCAL: tl.constexpr):
    """Which (query, key) pairs of a tile exist and are visible; ``rows`` and ``cols`` broadcast to the
    tile ([BLOCK_M, 1] and [1, BLOCK_N], or transposed in the dK/dV kernel)."""
    keep = cols < seqlen_k
    if IS_LOCAL:
        if lo_diag is not None:
            keep = keep & (cols >= rows + lo_diag)
        keep = keep & (cols <= rows + hi_diag)
    return keep
