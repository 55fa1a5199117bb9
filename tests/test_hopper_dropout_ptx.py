"""The Gluon kernels' dropout asm (kernels/hopper/dropout.py) run on the CPU by a small PTX evaluator.

The asm blocks only execute on a Hopper GPU; here each of their instructions is evaluated on Python ints,
so a wrong word, byte, bit or selector is caught in CPU CI: the draw block's keep bits must be those the rule
of flashtile.reference.dropout gives for each point's eight entries (two partner lanes, the shuffle
between them included), and ``keep_pairs`` must round two entries as PyTorch does and zero the dropped ones.
"""

from __future__ import annotations

import random
import re
import struct

import pytest
import torch

from flashtile.kernels.hopper.dropout import _draw_pair_ptx, _keep_pairs_ptx
from flashtile.reference.dropout import DROPOUT_ROUNDS, dropout_keep, dropout_threshold

M32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85


def _value(token: str, regs: dict[str, int]) -> int:
    if token.startswith("0x") or token.isdigit():
        return int(token, 0)
    return regs[token]


def _bf16_bits(raw: int) -> int:
    """fp32 bits → bf16 bits, rounded to nearest even (finite values)."""
    return ((raw + 0x7FFF + ((raw >> 16) & 1)) >> 16) & 0xFFFF


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX ``prmt.b32`` in its default mode: byte k of the result is byte (nibble k & 7) of {b, a}, or with
    nibble bit 3 that byte's sign replicated."""
    source = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for k in range(4):
        nibble = (selector >> (4 * k)) & 0xF
        byte = source[nibble & 7]
        out |= (0xFF if (nibble & 8 and byte & 0x80) else 0 if nibble & 8 else byte) << (8 * k)
    return out


def run_ptx(text: str, lanes: list[list[int]], first: int = 2) -> list[dict[str, int]]:
    """Evaluates ``text`` (the instructions the asm blocks use, unsigned 32-bit registers) for one lane or
    two partner lanes in lockstep, lane l's operands $first, $first + 1, … bound to ``lanes[l]``;
    ``shfl.sync.bfly`` with lane mask 4 swaps the value between the two. Returns each lane's registers ($0
    … among them). Any other instruction fails the test."""
    regs = [{f"${first + i}": v for i, v in enumerate(operands)} for operands in lanes]
    for line in text.split("\n"):
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        if op == "mov.b64":
            lo, hi, src = re.fullmatch(r"\{(\w+), (\w+)\}, (\w+)", args).groups()
            for r in regs:
                r[lo], r[hi] = r[src] & M32, r[src] >> 32
            continue
        dst, *srcs = [a.strip() for a in args.split(",")]
        if op == "shfl.sync.bfly.b32":
            assert srcs[1:] == ["4", "0x1f", "0xffffffff"], line
            swapped = [r[srcs[0]] for r in reversed(regs)]
            for r, value in zip(regs, swapped, strict=True):
                r[dst] = value
            continue
        for r in regs:
            v = [_value(t, r) for t in srcs]
            if op == "mov.b32":
                result = v[0]
            elif op == "mul.wide.u32":
                result = v[0] * v[1]
            elif op in ("xor.b32", "and.b32", "or.b32"):
                result = {"xor.b32": v[0] ^ v[1], "and.b32": v[0] & v[1], "or.b32": v[0] | v[1]}[op]
            elif op == "not.b32":
                result = ~v[0] & M32
            elif op == "add.u32":
                result = (v[0] + v[1]) & M32
            elif op == "sub.u32":
                result = (v[0] - v[1]) & M32
            elif op == "shr.u32":
                result = v[0] >> v[1]
            elif op == "shl.b32":
                result = (v[0] << v[1]) & M32 if v[1] < 32 else 0
            elif op == "prmt.b32":
                result = _prmt(v[0], v[1], v[2])
            elif op == "cvt.rn.bf16x2.f32":
                # The first source to the upper half.
                result = (_bf16_bits(v[0]) << 16) | _bf16_bits(v[1])
            elif op == "setp.ne.s32":
                result = int(v[0] != v[1])
            elif op == "selp.b32":
                result = v[0] if v[2] else v[1]
            else:
                raise AssertionError(f"unexpected instruction {line!r}")
            r[dst] = result
    return regs


def _key_schedule(seed: int) -> list[int]:
    k0, k1 = seed & M32, (seed >> 32) & M32
    return [w for r in range(DROPOUT_ROUNDS) for w in (k0 + r * KEY_A & M32, k1 + r * KEY_B & M32)]


@pytest.mark.parametrize(
    ("rows_are_queries", "key_schedule"),
    [(True, True), (True, False), (False, False)],
    ids=["forward", "forward-lean", "backward"],
)
def test_asm_block_gives_the_rules_bits_for_two_lanes(
    rows_are_queries: bool, key_schedule: bool, seed: int
) -> None:
    """Two partner lanes (row pairs 2R and 2R + 1), each with two points (column quads 2C and 2C + 1): each
    point's eight decisions, read from the asm's bits where kernels/_dropout.keep_tile looks (bit 8·byte +
    7 − the word's place), equal the rule's, though each lane ran one Philox call."""
    rng = random.Random(seed)
    text = _draw_pair_ptx(rows_are_queries, key_schedule=key_schedule)
    for _ in range(16):
        philox_seed, offset = rng.getrandbits(64) - 2**63, rng.getrandbits(32)
        p = rng.choice([0.0, 0.1, 0.5, 0.9, 0.999, rng.random()])
        bh, nheads = rng.randrange(64), 64
        first_pair, first_quad = 2 * rng.randrange(2048), 2 * rng.randrange(2048)
        lanes, points = [], []
        for row_pair in (first_pair, first_pair + 1):
            args = [[] for _ in range(8)]
            for col_quad in (first_quad, first_quad + 1):
                row_quad = row_pair // 2
                key_quad, query_quad = (col_quad, row_quad) if rows_are_queries else (row_quad, col_quad)
                point = [key_quad, query_quad, bh, offset, philox_seed & M32, (philox_seed >> 32) & M32]
                point += [dropout_threshold(p) * 0x01010101, row_pair % 2]
                for i, value in enumerate(point):
                    args[i].append(value)
                points.append((row_pair, col_quad))
            if key_schedule:
                args += [[k, k] for k in _key_schedule(philox_seed)]
            lanes.append([v for pair in args for v in pair])
        results = [(r["$0"], r["$1"]) for r in run_ptx(text, lanes)]
        state = torch.tensor([philox_seed, offset])
        for (row_pair, col_quad), bits in zip(points, [b for lane in results for b in lane], strict=True):
            # The point's rows {16P + r, 16P + r + 8} and columns {16Q + 2s, +1, +8, +9}.
            rows = [16 * (row_pair // 8) + row_pair % 8 + 8 * a for a in (0, 1)]
            cols = [16 * (col_quad // 4) + 2 * (col_quad % 4) + z + 8 * x for x in (0, 1) for z in (0, 1)]
            for a, row in enumerate(rows):
                for col in cols:
                    x, z = (col // 8) % 2, col % 2
                    byte = 2 * a + x if rows_are_queries else 2 * x + a
                    picked = bool((bits >> (8 * byte + 7 - z)) & 1)
                    i, j = (row, col) if rows_are_queries else (col, row)
                    expected = bool(dropout_keep(state, p, bh // nheads, bh % nheads, nheads, i, j))
                    assert picked == expected, (rows_are_queries, row, col, p)


def _bf16(value: float) -> int:
    """fp32 → bf16 bits, by PyTorch (round to nearest even)."""
    return int(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).view(torch.int16)) & 0xFFFF


def test_keep_pairs_rounds_and_zeroes_the_dropped_halves(seed: int) -> None:
    """kernels/hopper/dropout.py's ``keep_pairs``: two fp32 entries, the point's keep bits and each entry's
    bit position (the forward's pairs, 8·y + 7 and 8·y + 6): each entry rounded to bf16 in its half (the
    second in the upper one), kept or zeroed as its bit says."""
    rng = random.Random(seed)
    text = _keep_pairs_ptx("bf16")
    for _ in range(200):
        bits = rng.getrandbits(32)
        entries = [rng.uniform(0.0, 1.0) for _ in range(2)]
        raw = [struct.unpack("<I", struct.pack("<f", e))[0] for e in entries]
        y = rng.randrange(4)
        shifts = (8 * y + 7, 8 * y + 6)
        out = run_ptx(text, [[*raw, bits, bits, *shifts]], first=1)[0]["$0"]
        for half, shift in enumerate(shifts):
            expected = _bf16(entries[half]) if (bits >> shift) & 1 else 0
            assert (out >> (16 * half)) & 0xFFFF == expected, (hex(bits), entries, shifts)
