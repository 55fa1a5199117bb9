"""Dropout's keep mask in the Gluon kernels: kernels/_dropout.py's ``keep_tile``, laid out as a wgmma
accumulator without moving data.

A thread of the m64 accumulator (``NVMMADistributedLayout`` v3, four warps along the rows) holds rows
{r, r + 8} and, of each 16 columns, {c, c + 1, c + 8, c + 9}. ``keep_tile`` draws on a grid of half the
rows and a quarter of the columns, one point per such block of eight, then joins the draws into registers;
that grid sliced by ``PAIRS`` below puts each point in the thread that owns its entries, so the join lands
in the accumulator's layout register for register (``assert_trivial``). A point is half of one Philox
call's sixteen draws, two of its four words, in the forward's S tile (queries × keys) and the backward's
Sᵀ tile (keys × queries) alike.

Philox runs as one inline-asm block a call (:func:`_draw_bits`) for two points of a thread: partner lanes
(rows r and r + 1) split the two calls their four points need, and swap the halves they do not keep by one
shuffle. The block also compares the draws with the threshold four at a time (SIMD within a register) and
packs each point's decisions into one register: Triton lowers a tensor operation for every element of a
thread before the next operation, so ``tl.philox`` keeps all of a thread's calls in flight at once, and the
backward at D = 128 (dK and dV in registers) spilled 344 B of registers; one block a call keeps one call's
state live at a time. :func:`keep_pairs` applies the decisions to P as it is rounded to the wgmma
operand's dtype, two entries a register.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashtile.kernels._dropout import keep_tile, kept, load_rng_state
from flashtile.reference.dropout import DROPOUT_ROUNDS

__all__ = ["draw", "keep_pairs", "kept", "load_rng_state"]

HIGH_BITS = 0x80808080


def _bytes_kept_ptx(word: str, out: str) -> list[str]:
    """``out`` = bit 8·y + 7 set where byte y of ``word`` is ≥ the threshold byte (pt, replicated four
    times; ptl = pt & 0x7f7f7f7f), other bits 0: the low seven bits compared by a subtraction that cannot
    borrow across bytes (``(x | 0x80…) − ptl``), the top bits decide where they differ (``x & ~pt`` is
    ``(x | pt) ^ pt``)."""
    return [
        f"or.b32 pd, {word}, {HIGH_BITS:#x};", "sub.u32 pd, pd, ptl;",
        f"xor.b32 pe, {word}, pt;", "not.b32 pe, pe;", "and.b32 pe, pe, pd;",
        f"or.b32 pd, {word}, pt;", "xor.b32 pd, pd, pt;", "or.b32 pe, pe, pd;",
        f"and.b32 {out}, pe, {HIGH_BITS:#x};",
    ]  # fmt: skip


def _draw_pair_ptx(rows_are_queries: bool, rounds: int = DROPOUT_ROUNDS, key_schedule: bool = False) -> str:
    """kernels/_dropout.py's ``draw_bits`` for two points of a thread at once (``pack=2``: columns Q and
    Q + 1 of one row pair), one Philox call between a thread and its partner lane (lane ^ 4, the other row
    parity, the same calls): a thread of row parity p runs the call of its point p, keeps the two words of
    its parity and hands the other two's decisions to the partner by a butterfly shuffle, which runs the
    other call. Operands: $0, $1 the two points' keep bits; argument i of point e is $(2 + 2i + e): the
    counter (0–3), the key (4, 5: the seed's low and high halves), the threshold byte in each of four (6),
    the row parity (7), with ``key_schedule`` round r's keys (8 + 2r, 9 + 2r). Philox runs the rounds of
    Triton's ``tl.philox`` (flashtile/reference/dropout.py writes them out), each multiply's two halves
    from one ``mul.wide``. Every lane of a warp runs the block (the shuffle needs all 32)."""

    def arg(i: int, point: int = 0) -> str:
        return f"${2 + 2 * i + point}"

    lines = [
        "{",
        ".reg .u32 pc0, pc1, pc2, pc3, pk0, pk1, ph0, ph1, pl0, pl1, pd, pe, pt, ptl, px, py, pown, pgive;",
        ".reg .u64 pw0, pw1;",
        ".reg .pred pq;",
        f"setp.ne.s32 pq, {arg(7)}, 0;",
        *[f"selp.b32 pc{i}, {arg(i, 1)}, {arg(i, 0)}, pq;" for i in range(4)],
        f"mov.b32 pk0, {arg(4)};", f"mov.b32 pk1, {arg(5)};",
    ]  # fmt: skip
    for r in range(rounds):
        k0, k1 = (arg(8 + 2 * r), arg(9 + 2 * r)) if key_schedule else ("pk0", "pk1")
        lines += [
            "mul.wide.u32 pw0, pc0, 0xD2511F53;", "mov.b64 {pl0, ph0}, pw0;",
            "mul.wide.u32 pw1, pc2, 0xCD9E8D57;", "mov.b64 {pl1, ph1}, pw1;",
            "xor.b32 pc0, ph1, pc1;", f"xor.b32 pc0, pc0, {k0};",
            "xor.b32 pc2, ph0, pc3;", f"xor.b32 pc2, pc2, {k1};",
            "mov.b32 pc1, pl1;", "mov.b32 pc3, pl0;",
        ]  # fmt: skip
        if r < rounds - 1 and not key_schedule:
            lines += ["add.u32 pk0, pk0, 0x9E3779B9;", "add.u32 pk1, pk1, 0xBB67AE85;"]
    # Row parity 0's words and parity 1's: (0, 1) and (2, 3) where rows are queries, (0, 2) and (1, 3) where
    # they are keys; each pair's decisions in bits 8·y + 7 (the first word) and 8·y + 6 (the second).
    halves = (("pc0", "pc1"), ("pc2", "pc3")) if rows_are_queries else (("pc0", "pc2"), ("pc1", "pc3"))
    lines += [f"mov.b32 pt, {arg(6)};", "and.b32 ptl, pt, 0x7F7F7F7F;"]
    for (first, second), out in zip(halves, ("px", "py"), strict=True):
        lines += [
            *_bytes_kept_ptx(first, out),
            *_bytes_kept_ptx(second, "pd"),
            "shr.u32 pd, pd, 1;", f"or.b32 {out}, {out}, pd;",
        ]  # fmt: skip
    lines += [
        "selp.b32 pown, py, px, pq;", "selp.b32 pgive, px, py, pq;",
        "shfl.sync.bfly.b32 pgive, pgive, 4, 0x1f, 0xffffffff;",
        "selp.b32 $0, pgive, pown, pq;", "selp.b32 $1, pown, pgive, pq;",
        "}",
    ]  # fmt: skip
    return "\n".join(lines)


DRAW_QUERY_ROWS_PTX = gl.constexpr(_draw_pair_ptx(True, key_schedule=True))
DRAW_QUERY_ROWS_LEAN_PTX = gl.constexpr(_draw_pair_ptx(True))
DRAW_KEY_ROWS_PTX = gl.constexpr(_draw_pair_ptx(False))


# Philox's key increments (Weyl constants) for the key schedule.
KA = gl.constexpr(0x9E3779B9)
KB = gl.constexpr(0xBB67AE85)
# _draw_bits passes one key pair a round, written out for this many rounds: two outputs, and for each of
# two points eight operands and the schedule's.
SCHEDULE_ROUNDS = 7
assert SCHEDULE_ROUNDS == DROPOUT_ROUNDS, "_draw_bits's key schedule is written for DROPOUT_ROUNDS rounds"
DRAW_QUERY_ROWS_CONSTRAINTS = gl.constexpr("=r,=r" + ",r" * (2 * (8 + 2 * SCHEDULE_ROUNDS)))


@gluon.jit
def _key(k, r: gl.constexpr, step: gl.constexpr):
    """Round r's key: ``k + r·step`` modulo 2³² (int32 ``k``)."""
    return (k.to(gl.uint32) + (r * step) % 2**32).to(gl.int32, bitcast=True)


@gluon.jit
def _replicated(threshold):
    """The threshold byte in each of an int32's four bytes, as the asm compares four draws at a time."""
    return (threshold.to(gl.uint32) * 0x01010101).to(gl.int32, bitcast=True)


@gluon.jit
def _draw_bits(seed, c0, c1, c2, c3, threshold, parity, ROWS_ARE_QUERIES: gl.constexpr):
    """kernels/_dropout.py's ``draw_bits`` (int32 counters, an int64 seed), one asm block per call; where
    rows are queries (the forward), Philox's key schedule comes in as two operands a round (a kernel's
    uniform values) instead of two additions a round."""
    k0 = c0 * 0 + seed.to(gl.int32)
    k1 = c0 * 0 + (seed >> 32).to(gl.int32)
    if ROWS_ARE_QUERIES:
        bits = gl.inline_asm_elementwise(
            DRAW_QUERY_ROWS_PTX, DRAW_QUERY_ROWS_CONSTRAINTS,
            [
                c0, c1, c2, c3, k0, k1, c0 * 0 + _replicated(threshold), parity,
                _key(k0, 0, KA), _key(k1, 0, KB), _key(k0, 1, KA), _key(k1, 1, KB),
                _key(k0, 2, KA), _key(k1, 2, KB), _key(k0, 3, KA), _key(k1, 3, KB),
                _key(k0, 4, KA), _key(k1, 4, KB), _key(k0, 5, KA), _key(k1, 5, KB),
                _key(k0, 6, KA), _key(k1, 6, KB),
            ],
            dtype=gl.int32, is_pure=True, pack=2,
        )  # fmt: skip
    else:
        bits = _draw_bits_lean(seed, c0, c1, c2, c3, threshold, parity, ROWS_ARE_QUERIES)
    return bits


@gluon.jit
def _draw_bits_lean(seed, c0, c1, c2, c3, threshold, parity, ROWS_ARE_QUERIES: gl.constexpr):
    """:func:`_draw_bits` with the key schedule computed in the asm block: two registers a round fewer across
    a key loop, for the kernels that hold the most (the backward, the forward at D = 256)."""
    k0 = c0 * 0 + seed.to(gl.int32)
    k1 = c0 * 0 + (seed >> 32).to(gl.int32)
    return gl.inline_asm_elementwise(
        DRAW_QUERY_ROWS_LEAN_PTX if ROWS_ARE_QUERIES else DRAW_KEY_ROWS_PTX, "=r,=r" + ",r" * 16,
        [c0, c1, c2, c3, k0, k1, c0 * 0 + _replicated(threshold), parity],
        dtype=gl.int32, is_pure=True, pack=2,
    )  # fmt: skip


# The draw grid of a 64-row tile: 8 lanes × 4 warps along its 32 row pairs, 4 lanes along the columns.
PAIRS = gl.constexpr(gl.BlockedLayout([1, 1], [8, 4], [4, 1], [1, 0]))


@gluon.jit
def draw(
    seed,
    offset,
    threshold,
    bh,
    r0,
    c0,
    COLS: gl.constexpr,
    layout: gl.constexpr,
    ROWS_ARE_QUERIES: gl.constexpr,
    KEY_SCHEDULE: gl.constexpr = True,
):
    """The keep bits of the 64 × COLS tile at (r0, c0) (multiples of 16), kernels/_dropout.py's ``(bits,
    shift)`` in ``layout`` (the m64 wgmma accumulator of that shape): :func:`kept` picks each entry's. Rows
    are queries and columns keys, or the other way round. Drawn before a wgmma is waited on, they cost a
    register per Philox call (eight entries) across the wait. Without ``KEY_SCHEDULE`` the asm computes
    Philox's round keys itself (:func:`_draw_bits_lean`); the backward always does."""
    ROWS: gl.constexpr = 64
    row_pairs = r0 // 2 + gl.arange(0, ROWS // 2, layout=gl.SliceLayout(1, PAIRS))
    col_quads = c0 // 4 + gl.arange(0, COLS // 4, layout=gl.SliceLayout(0, PAIRS))
    if KEY_SCHEDULE:
        bits, shift = keep_tile(
            seed, offset, threshold, bh, row_pairs, col_quads, ROWS_ARE_QUERIES, _draw_bits
        )
    else:
        bits, shift = keep_tile(
            seed, offset, threshold, bh, row_pairs, col_quads, ROWS_ARE_QUERIES, _draw_bits_lean
        )
    return gl.convert_layout(bits, layout, assert_trivial=True), gl.convert_layout(
        shift, layout, assert_trivial=True
    )


def _keep_pairs_ptx(dtype: str) -> str:
    """Two fp32 entries of P ($1, $2), their keep bits ($3, $4: the same point's) and bit positions ($5, $6,
    compile-time constants in the kernel): $0 = the two rounded to ``dtype`` (``bf16`` or ``f16``), one a
    half, each dropped entry's half zeroed. Each half's mask is its decision bit moved to the top of its
    byte, then that byte's sign replicated over the half by one ``prmt`` (ptxas folds the shifts and the
    selector, which depend on the constants only)."""
    return "\n".join([
        "{",
        ".reg .b32 pa, pb, py0, py1, psel, pm, pp;",
        # Each entry's decision to bit 7 of its byte: shift left by 7 − (position mod 8).
        "and.b32 py0, $5, 7;", "xor.b32 py0, py0, 7;", "shl.b32 pa, $3, py0;",
        "and.b32 py1, $6, 7;", "xor.b32 py1, py1, 7;", "shl.b32 pb, $4, py1;",
        # Selector nibbles 8 | byte (sign mode): bytes 0, 1 from pa's byte, bytes 2, 3 from pb's (4 + byte).
        "shr.u32 py0, $5, 3;", "or.b32 py0, py0, 8;",
        "shr.u32 py1, $6, 3;", "or.b32 py1, py1, 12;",
        "shl.b32 psel, py0, 4;", "or.b32 psel, psel, py0;",
        "shl.b32 pm, py1, 8;", "or.b32 psel, psel, pm;",
        "shl.b32 pm, py1, 12;", "or.b32 psel, psel, pm;",
        "prmt.b32 pm, pa, pb, psel;",
        # The second entry in the upper half.
        f"cvt.rn.{dtype}x2.f32 pp, $2, $1;",
        "and.b32 $0, pp, pm;",
        "}",
    ])  # fmt: skip


KEEP_PAIRS_BF16_PTX = gl.constexpr(_keep_pairs_ptx("bf16"))
KEEP_PAIRS_F16_PTX = gl.constexpr(_keep_pairs_ptx("f16"))


@gluon.jit
def keep_pairs(p, bits, shift, dtype: gl.constexpr):
    """``where(kept(bits, shift), p, 0).to(dtype)`` for fp32 ``p`` and a 16-bit ``dtype`` (the P·V wgmma
    operand's), two entries a register: a conversion, a ``prmt`` and an ``and`` a pair, where selecting each
    fp32 entry and converting after made ptxas split and re-pack the halves (a bit test, a select and a
    ``prmt`` and a half an entry)."""
    if dtype == gl.bfloat16:
        out = gl.inline_asm_elementwise(
            KEEP_PAIRS_BF16_PTX, "=r,r,r,r,r,r,r", [p, bits, shift], dtype=gl.bfloat16, is_pure=True, pack=2
        )
    else:
        out = gl.inline_asm_elementwise(
            KEEP_PAIRS_F16_PTX, "=r,r,r,r,r,r,r", [p, bits, shift], dtype=gl.float16, is_pure=True, pack=2
        )
    return out
