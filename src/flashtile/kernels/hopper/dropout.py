"""Dropout's keep mask in the Gluon kernels: kernels/_dropout.py's ``keep_tile``, laid out as a wgmma
accumulator without moving data.

A thread of the m64 accumulator (``NVMMADistributedLayout`` v3, four warps along the rows) holds rows
{r, r + 8} and, of each 16 columns, {c, c + 1, c + 8, c + 9}. ``keep_tile`` draws on a grid of half the
rows and a quarter of the columns, one point per such block of eight, then joins the draws into registers;
that grid sliced by ``PAIRS`` below puts each point in the thread that owns its entries, so the join lands
in the accumulator's layout register for register (``assert_trivial``). The forward's S tile (queries ×
keys) takes one Philox call a point; the backward's Sᵀ tile (keys × queries) two, each for half of a call's
block.

Philox runs as one inline-asm block a call (:func:`_draw_bits`), which also compares the eight draws and
packs the decisions into one register: Triton lowers a tensor operation for every element of a thread
before the next operation, so ``tl.philox`` keeps all of a thread's calls in flight at once, and the
backward at D = 128 (dK and dV in registers) spilled 344 B of registers; one block a call keeps one call's
state live at a time.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashtile.kernels._dropout import keep_tile, kept, load_rng_state

__all__ = ["draw", "kept", "load_rng_state"]


def _draw_bits_ptx(one_half: bool, rounds: int = 10, key_schedule: bool = False) -> str:
    """kernels/_dropout.py's ``draw_bits`` in PTX: $0 the keep bits, $1–$4 the counter, $5, $6 the key (the
    seed's low and high halves), $7 the threshold, and with ``one_half`` $8 the half's shift (0 or 16); the
    rounds of Triton's ``tl.philox`` (flashtile/reference/dropout.py writes them out), each multiply's two
    halves from one ``mul.wide``, then the draws compared."""
    lines = [
        "{",
        ".reg .u32 pc0, pc1, pc2, pc3, pk0, pk1, ph0, ph1, pl0, pl1, pd, pr;",
        ".reg .u64 pw0, pw1;",
        ".reg .pred pq;",
        "mov.b32 pc0, $1;", "mov.b32 pc1, $2;", "mov.b32 pc2, $3;", "mov.b32 pc3, $4;",
        "mov.b32 pk0, $5;", "mov.b32 pk1, $6;",
    ]  # fmt: skip
    for r in range(rounds):
        # With key_schedule, round r's keys are operands $8 + 2r, $9 + 2r (a uniform schedule, once a kernel).
        k0, k1 = (f"${8 + 2 * r}", f"${9 + 2 * r}") if key_schedule else ("pk0", "pk1")
        lines += [
            "mul.wide.u32 pw0, pc0, 0xD2511F53;", "mov.b64 {pl0, ph0}, pw0;",
            "mul.wide.u32 pw1, pc2, 0xCD9E8D57;", "mov.b64 {pl1, ph1}, pw1;",
            "xor.b32 pc0, ph1, pc1;", f"xor.b32 pc0, pc0, {k0};",
            "xor.b32 pc2, ph0, pc3;", f"xor.b32 pc2, pc2, {k1};",
            "mov.b32 pc1, pl1;", "mov.b32 pc3, pl0;",
        ]  # fmt: skip
        if r < rounds - 1 and not key_schedule:
            lines += ["add.u32 pk0, pk0, 0x9E3779B9;", "add.u32 pk1, pk1, 0xBB67AE85;"]
    lines += ["mov.b32 pr, 0;"]
    for w in range(4):
        if one_half:
            draws = [(w, [f"shr.u32 pd, pc{w}, $8;", "and.b32 pd, pd, 0xFFFF;"])]
        else:
            draws = [(w, [f"and.b32 pd, pc{w}, 0xFFFF;"]), (w + 4, [f"shr.u32 pd, pc{w}, 16;"])]
        for bit, take in draws:
            lines += [
                *take,
                "setp.ge.s32 pq, pd, $7;",
                f"selp.b32 pd, {1 << bit}, 0, pq;",
                "or.b32 pr, pr, pd;",
            ]
    lines += ["mov.b32 $0, pr;", "}"]
    return "\n".join(lines)


DRAW_BITS_PTX = gl.constexpr(_draw_bits_ptx(False, key_schedule=True))
DRAW_HALF_BITS_PTX = gl.constexpr(_draw_bits_ptx(True))


# Philox's key increments (Weyl constants) for the key schedule.
KA = gl.constexpr(0x9E3779B9)
KB = gl.constexpr(0xBB67AE85)


@gluon.jit
def _key(k, r: gl.constexpr, step: gl.constexpr):
    """Round r's key: ``k + r·step`` modulo 2³² (int32 ``k``)."""
    return (k.to(gl.uint32) + (r * step) % 2**32).to(gl.int32, bitcast=True)


@gluon.jit
def _draw_bits(seed, c0, c1, c2, c3, threshold, high):
    """kernels/_dropout.py's ``draw_bits`` (int32 counters, an int64 seed), one asm block per call."""
    k0 = c0 * 0 + seed.to(gl.int32)
    k1 = c0 * 0 + (seed >> 32).to(gl.int32)
    if high is None:
        bits = gl.inline_asm_elementwise(
            DRAW_BITS_PTX, "=r" + ",r" * 27,
            [
                c0, c1, c2, c3, k0, k1, c0 * 0 + threshold,
                _key(k0, 0, KA), _key(k1, 0, KB), _key(k0, 1, KA), _key(k1, 1, KB),
                _key(k0, 2, KA), _key(k1, 2, KB), _key(k0, 3, KA), _key(k1, 3, KB),
                _key(k0, 4, KA), _key(k1, 4, KB), _key(k0, 5, KA), _key(k1, 5, KB),
                _key(k0, 6, KA), _key(k1, 6, KB), _key(k0, 7, KA), _key(k1, 7, KB),
                _key(k0, 8, KA), _key(k1, 8, KB), _key(k0, 9, KA), _key(k1, 9, KB),
            ],
            dtype=gl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        bits = gl.inline_asm_elementwise(
            DRAW_HALF_BITS_PTX, "=r,r,r,r,r,r,r,r,r", [c0, c1, c2, c3, k0, k1, c0 * 0 + threshold, high * 16],
            dtype=gl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    return bits


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
):
    """The keep bits of the 64 × COLS tile at (r0, c0) (multiples of 16), kernels/_dropout.py's ``(bits,
    shift)`` in ``layout`` (the m64 wgmma accumulator of that shape): :func:`kept` picks each entry's. Rows
    are queries and columns keys, or the other way round. Drawn before a wgmma is waited on, they cost a
    register per Philox call across the wait (eight entries in the forward, four in the backward)."""
    ROWS: gl.constexpr = 64
    row_pairs = r0 // 2 + gl.arange(0, ROWS // 2, layout=gl.SliceLayout(1, PAIRS))
    col_quads = c0 // 4 + gl.arange(0, COLS // 4, layout=gl.SliceLayout(0, PAIRS))
    bits, shift = keep_tile(seed, offset, threshold, bh, row_pairs, col_quads, ROWS_ARE_QUERIES, _draw_bits)
    return gl.convert_layout(bits, layout, assert_trivial=True), gl.convert_layout(
        shift, layout, assert_trivial=True
    )
