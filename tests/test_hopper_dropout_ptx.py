"""The Gluon kernels' dropout asm (kernels/hopper/dropout.py) run on the CPU by a small PTX evaluator.

The asm block only executes on a Hopper GPU; here each of its instructions is evaluated on Python ints, so a
wrong word, byte or bit is caught in CPU CI: the block's keep bits must be those the rule of
flashtile.reference.dropout gives for the point's eight entries.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from flashtile.kernels.hopper.dropout import _draw_pair_ptx
from flashtile.reference.dropout import dropout_keep, dropout_threshold

M32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85


def _value(token: str, regs: dict[str, int]) -> int:
    if token.startswith("0x") or token.isdigit():
        return int(token, 0)
    return regs[token]


def run_ptx(text: str, lanes: list[list[int]]) -> list[tuple[int, int]]:
    """Evaluates ``text`` (the instructions the asm block uses, unsigned 32-bit registers) for two partner
    lanes in lockstep, lane l's operands $2, $3, … bound to ``lanes[l]``; ``shfl.sync.bfly`` with lane mask
    4 swaps the value between the two. Returns each lane's ($0, $1). Any other instruction fails the test."""
    regs = [{f"${2 + i}": v for i, v in enumerate(operands)} for operands in lanes]
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
            elif op == "setp.ne.s32":
                result = int(v[0] != v[1])
            elif op == "selp.b32":
                result = v[0] if v[2] else v[1]
            else:
                raise AssertionError(f"unexpected instruction {line!r}")
            r[dst] = result
    return [(r["$0"], r["$1"]) for r in regs]


def _key_schedule(seed: int) -> list[int]:
    k0, k1 = seed & M32, (seed >> 32) & M32
    return [w for r in range(10) for w in (k0 + r * KEY_A & M32, k1 + r * KEY_B & M32)]


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
        results = run_ptx(text, lanes)
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
