"""FLOPs and HBM bytes of attention: the standard algorithm against the tiled one.

Pure Python (no torch), so that the accounting can be checked by hand. Every count is exact for the
algorithm it models; the derivation, the conventions and a worked example are in
``docs/design/io_accounting.md``.

Three algorithms are counted, forward and backward:

- ``naive``: standard attention as analysed in the FlashAttention paper (Algorithms 0 and 3): every
  ``N_q × N_k`` matrix (S, P; dP, dS) is written to HBM and read back.
- ``tiled``: the FlashAttention-2 loop order that flashtile's kernels use. Forward: each program owns
  ``block_m`` query rows, reads them once, streams K and V in ``block_n`` steps and writes O and the LSE
  once, so K and V are read ``T_r = ⌈N_q / block_m⌉`` times. Backward: a preprocess pass
  (``delta = rowsum(O ∘ dO)``), a dK/dV pass that owns ``block_n`` keys and streams Q, dO, LSE, delta, and a
  dQ pass that owns ``block_m`` queries and streams K, V.
- ``minimum``: each input read once and each output written once, the floor no algorithm beats.

>>> acc = tiled_forward(AttentionShape(seqlen_q=2048, seqlen_k=2048, head_dim=64, dtype_bytes=4))
>>> acc.flops, acc.hbm_bytes
(1073741824, 34611200)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# The log-sum-exp and the backward's delta are float32 whatever the input dtype.
STAT_BYTES = 4

Algorithm = Literal["naive", "tiled", "minimum"]
Direction = Literal["forward", "backward"]
ALGORITHMS: tuple[Algorithm, ...] = ("naive", "tiled", "minimum")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class AttentionShape:
    """One attention problem and the tiling that the ``tiled`` count assumes.

    ``block_m`` is the paper's B_r (query rows per program), ``block_n`` its B_c (keys per step).
    ``dtype_bytes`` is the element size of Q, K, V, O and their gradients (and of S, P in ``naive``).
    """

    batch: int = 1
    heads: int = 1
    seqlen_q: int = 2048
    seqlen_k: int = 2048
    head_dim: int = 64
    dtype_bytes: int = 4
    block_m: int = 64
    block_n: int = 64
    causal: bool = False

    def __post_init__(self) -> None:
        for name in (
            "batch",
            "heads",
            "seqlen_q",
            "seqlen_k",
            "head_dim",
            "dtype_bytes",
            "block_m",
            "block_n",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AttentionShape.{name} must be a positive int, got {value!r}")

    @property
    def heads_total(self) -> int:
        """B · H: every count below is per (batch, head) times this."""
        return self.batch * self.heads

    @property
    def row_blocks(self) -> int:
        """T_r = ⌈N_q / B_r⌉: how many query-row programs, hence how many passes over K and V."""
        return _ceil_div(self.seqlen_q, self.block_m)

    @property
    def col_blocks(self) -> int:
        """T_c = ⌈N_k / B_c⌉: how many key-block programs in the backward's dK/dV pass."""
        return _ceil_div(self.seqlen_k, self.block_n)


@dataclass(frozen=True)
class Term:
    """One line of the account: what moves, how many elements in all (B · H included), of what size."""

    what: str
    elements: int
    element_bytes: int

    @property
    def nbytes(self) -> int:
        return self.elements * self.element_bytes


@dataclass(frozen=True)
class Traffic:
    """FLOPs and HBM bytes of one algorithm in one direction, with the terms that add up to the bytes."""

    algorithm: Algorithm
    direction: Direction
    flops: int
    terms: tuple[Term, ...] = field(default_factory=tuple)

    @property
    def hbm_bytes(self) -> int:
        return sum(t.nbytes for t in self.terms)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per HBM byte."""
        return self.flops / self.hbm_bytes


def _last_visible_key(shape: AttentionShape, row_stop: int) -> int:
    """How many keys the rows before ``row_stop`` can see (bottom-right causal: j ≤ i + N_k − N_q)."""
    if not shape.causal:
        return shape.seqlen_k
    return min(shape.seqlen_k, max(0, row_stop + shape.seqlen_k - shape.seqlen_q))


def visible_pairs(shape: AttentionShape) -> int:
    """Number of (query, key) pairs that are not masked, per (batch, head)."""
    if not shape.causal:
        return shape.seqlen_q * shape.seqlen_k
    return sum(_last_visible_key(shape, i + 1) for i in range(shape.seqlen_q))


def forward_flops(shape: AttentionShape) -> int:
    """4 · B · H · N_q · N_k · D (two matmuls, 2 FLOPs per multiply-add); halved when causal and N_q = N_k.

    The halving is the FlashAttention papers' convention (it ignores the diagonal's N/2 extra pairs). For
    causal with N_q ≠ N_k the visible pairs are counted exactly.
    """
    per_pair = 4 * shape.head_dim * shape.heads_total
    if not shape.causal:
        return per_pair * shape.seqlen_q * shape.seqlen_k
    if shape.seqlen_q == shape.seqlen_k:
        return per_pair * shape.seqlen_q * shape.seqlen_k // 2
    return per_pair * visible_pairs(shape)


def backward_flops(shape: AttentionShape) -> int:
    """2.5 × the forward (five matmuls against two), the papers' convention."""
    return 5 * forward_flops(shape) // 2


def tiled_kv_rows(shape: AttentionShape) -> int:
    """Rows of K (and of V) that the tiled forward and dQ pass load, per (batch, head), summed over the
    ``T_r`` query-row programs. Causal programs stop after the block holding their last visible key."""
    rows = 0
    for row_start in range(0, shape.seqlen_q, shape.block_m):
        row_stop = min(row_start + shape.block_m, shape.seqlen_q)
        last = _last_visible_key(shape, row_stop)
        rows += min(shape.seqlen_k, _ceil_div(last, shape.block_n) * shape.block_n)
    return rows


def tiled_q_rows(shape: AttentionShape) -> int:
    """Rows of Q (and dO, LSE, delta) that the tiled dK/dV pass loads, per (batch, head), summed over the
    ``T_c`` key-block programs. Causal programs start at the query block holding the first row that sees
    their first key."""
    offset = shape.seqlen_k - shape.seqlen_q
    rows = 0
    for col_start in range(0, shape.seqlen_k, shape.block_n):
        first_row = max(0, col_start - offset) if shape.causal else 0
        if first_row >= shape.seqlen_q:
            continue
        rows += shape.seqlen_q - first_row // shape.block_m * shape.block_m
    return rows


def naive_forward(shape: AttentionShape) -> Traffic:
    """Standard attention (FlashAttention paper, Algorithm 0): S = QKᵀ to HBM, P = softmax(S) to HBM, O = PV.

    The causal mask is applied inside the softmax pass, so S and P are still ``N_q × N_k``.
    """
    bh, s = shape.heads_total, shape.dtype_bytes
    q, kv, sq = (
        bh * shape.seqlen_q * shape.head_dim,
        bh * shape.seqlen_k * shape.head_dim,
        bh * shape.seqlen_q,
    )
    scores = sq * shape.seqlen_k
    terms = (
        Term("read Q", q, s),
        Term("read K", kv, s),
        Term("write S", scores, s),
        Term("read S", scores, s),
        Term("write P", scores, s),
        Term("read P", scores, s),
        Term("read V", kv, s),
        Term("write O", q, s),
    )
    return Traffic("naive", "forward", forward_flops(shape), terms)


def tiled_forward(shape: AttentionShape) -> Traffic:
    """FlashAttention-2 forward: Q read once, K and V once per query-row program, O and LSE written once."""
    bh, s = shape.heads_total, shape.dtype_bytes
    q = bh * shape.seqlen_q * shape.head_dim
    kv = bh * tiled_kv_rows(shape) * shape.head_dim
    passes = f"{shape.row_blocks} programs" + (", causal" if shape.causal else "")
    terms = (
        Term("read Q", q, s),
        Term(f"read K ({passes})", kv, s),
        Term(f"read V ({passes})", kv, s),
        Term("write O", q, s),
        Term("write LSE (fp32)", bh * shape.seqlen_q, STAT_BYTES),
    )
    return Traffic("tiled", "forward", forward_flops(shape), terms)


def minimum_forward(shape: AttentionShape) -> Traffic:
    """Q, K, V read once; O and the LSE written once."""
    bh, s = shape.heads_total, shape.dtype_bytes
    q, kv = bh * shape.seqlen_q * shape.head_dim, bh * shape.seqlen_k * shape.head_dim
    terms = (
        Term("read Q", q, s),
        Term("read K", kv, s),
        Term("read V", kv, s),
        Term("write O", q, s),
        Term("write LSE (fp32)", bh * shape.seqlen_q, STAT_BYTES),
    )
    return Traffic("minimum", "forward", forward_flops(shape), terms)


def naive_backward(shape: AttentionShape) -> Traffic:
    """Standard attention backward (FlashAttention paper, Algorithm 3), P kept from the forward:
    dV = PᵀdO; dP = dO Vᵀ; dS = P ∘ (dP − rowsum(P ∘ dP)); dQ = dS K; dK = dSᵀQ, each matrix through HBM."""
    bh, s = shape.heads_total, shape.dtype_bytes
    q, kv = bh * shape.seqlen_q * shape.head_dim, bh * shape.seqlen_k * shape.head_dim
    scores = bh * shape.seqlen_q * shape.seqlen_k
    terms = (
        Term("read P (dV)", scores, s),
        Term("read dO (dV)", q, s),
        Term("write dV", kv, s),
        Term("read dO (dP)", q, s),
        Term("read V (dP)", kv, s),
        Term("write dP", scores, s),
        Term("read P (dS)", scores, s),
        Term("read dP (dS)", scores, s),
        Term("write dS", scores, s),
        Term("read dS (dQ)", scores, s),
        Term("read K (dQ)", kv, s),
        Term("write dQ", q, s),
        Term("read dS (dK)", scores, s),
        Term("read Q (dK)", q, s),
        Term("write dK", kv, s),
    )
    return Traffic("naive", "backward", backward_flops(shape), terms)


def tiled_backward(shape: AttentionShape) -> Traffic:
    """FlashAttention-2 backward in three passes (delta preprocess; dK/dV owning keys; dQ owning queries).

    The dK/dV pass re-reads Q, dO, LSE and delta once per key block (``T_c`` programs), the dQ pass re-reads
    K and V once per query block (``T_r`` programs); P and dS are recomputed in registers.
    """
    bh, s = shape.heads_total, shape.dtype_bytes
    q, kv = bh * shape.seqlen_q * shape.head_dim, bh * shape.seqlen_k * shape.head_dim
    stats = bh * shape.seqlen_q
    q_rows, kv_rows = bh * tiled_q_rows(shape), bh * tiled_kv_rows(shape)
    d = shape.head_dim
    causal = ", causal" if shape.causal else ""
    by_key, by_query = f"{shape.col_blocks} programs{causal}", f"{shape.row_blocks} programs{causal}"
    terms = (
        Term("preprocess: read O", q, s),
        Term("preprocess: read dO", q, s),
        Term("preprocess: write delta (fp32)", stats, STAT_BYTES),
        Term("dK/dV: read K", kv, s),
        Term("dK/dV: read V", kv, s),
        Term(f"dK/dV: read Q ({by_key})", q_rows * d, s),
        Term(f"dK/dV: read dO ({by_key})", q_rows * d, s),
        Term(f"dK/dV: read LSE, delta ({by_key})", 2 * q_rows, STAT_BYTES),
        Term("dK/dV: write dK", kv, s),
        Term("dK/dV: write dV", kv, s),
        Term("dQ: read Q", q, s),
        Term("dQ: read dO", q, s),
        Term("dQ: read LSE, delta", 2 * stats, STAT_BYTES),
        Term(f"dQ: read K ({by_query})", kv_rows * d, s),
        Term(f"dQ: read V ({by_query})", kv_rows * d, s),
        Term("dQ: write dQ", q, s),
    )
    return Traffic("tiled", "backward", backward_flops(shape), terms)


def minimum_backward(shape: AttentionShape) -> Traffic:
    """Q, K, V, O, dO and the LSE read once; dQ, dK, dV written once."""
    bh, s = shape.heads_total, shape.dtype_bytes
    q, kv = bh * shape.seqlen_q * shape.head_dim, bh * shape.seqlen_k * shape.head_dim
    terms = (
        Term("read Q", q, s),
        Term("read K", kv, s),
        Term("read V", kv, s),
        Term("read O", q, s),
        Term("read dO", q, s),
        Term("read LSE (fp32)", bh * shape.seqlen_q, STAT_BYTES),
        Term("write dQ", q, s),
        Term("write dK", kv, s),
        Term("write dV", kv, s),
    )
    return Traffic("minimum", "backward", backward_flops(shape), terms)


def account(shape: AttentionShape) -> tuple[Traffic, ...]:
    """Every algorithm, forward then backward: naive, tiled, minimum."""
    return (
        naive_forward(shape),
        tiled_forward(shape),
        minimum_forward(shape),
        naive_backward(shape),
        tiled_backward(shape),
        minimum_backward(shape),
    )


def extra_memory(shape: AttentionShape, algorithm: Algorithm) -> int:
    """Peak bytes a forward + backward allocates beyond its inputs Q, K, V and dO, by the algorithm alone.

    ``tiled`` (and ``minimum``) keep O, the LSE, delta and the three gradients: linear in N. ``naive`` keeps
    O and the gradients plus the three ``N_q × N_k`` matrices that step 3 of the paper's Algorithm 3 holds at
    once (P, dP and dS): quadratic in N. Framework temporaries (autograd's saved tensors, workspaces) come
    on top, which is why the measured numbers are higher.
    """
    bh, s = shape.heads_total, shape.dtype_bytes
    q, kv = bh * shape.seqlen_q * shape.head_dim, bh * shape.seqlen_k * shape.head_dim
    linear = s * (2 * q + 2 * kv)
    if algorithm == "naive":
        return linear + 3 * s * bh * shape.seqlen_q * shape.seqlen_k
    if algorithm in ("tiled", "minimum"):
        return linear + 2 * STAT_BYTES * bh * shape.seqlen_q
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
