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

from flashtile.kernels.hopper.dropout import _draw_bits_ptx
from flashtile.reference.dropout import dropout_keep, dropout_threshold

M32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85


def _value(token: str, regs: dict[str, int], operands: list[int]) -> int:
    if token.startswith("$"):
        return operands[int(token[1:]) - 1]
    if token.startswith("0x") or token.isdigit():
        return int(token, 0)
    return regs[token]


def run_ptx(text: str, operands: list[int]) -> int:
    """Evaluates ``text`` (the instructions the asm block uses, unsigned 32-bit registers) with $1, $2, …
    bound to ``operands``; returns $0. Any other instruction fails the test."""
    regs: dict[str, int] = {}
    out = None
    for line in text.split("\n"):
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        if op == "mov.b64":
            lo_hi, src = re.fullmatch(r"\{(\w+), (\w+)\}, (\w+)", args).groups()[:2], args.rsplit(", ", 1)[1]
            regs[lo_hi[0]], regs[lo_hi[1]] = regs[src] & M32, regs[src] >> 32
            continue
        dst, *srcs = [a.strip() for a in args.split(",")]
        v = [_value(s, regs, operands) for s in srcs]
        if op == "mov.b32":
            result = v[0]
        elif op == "mul.wide.u32":
            result = v[0] * v[1]
        elif op == "mul.lo.u32":
            result = (v[0] * v[1]) & M32
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
        if dst == "$0":
            out = result
        else:
            regs[dst] = result
    assert out is not None
    return out


def _key_schedule(seed: int) -> list[int]:
    k0, k1 = seed & M32, (seed >> 32) & M32
    return [w for r in range(10) for w in (k0 + r * KEY_A & M32, k1 + r * KEY_B & M32)]


@pytest.mark.parametrize(
    ("rows_are_queries", "key_schedule"),
    [(True, True), (True, False), (False, False)],
    ids=["forward", "forward-lean", "backward"],
)
def test_asm_block_gives_the_rules_bits_for_a_point(
    rows_are_queries: bool, key_schedule: bool, seed: int
) -> None:
    """A point (row pair, column quad) of a 64-row tile: its eight entries' decisions, read from the asm's
    bits where kernels/_dropout.keep_tile looks (bit 8·byte + 7 − the word's place), equal the rule's."""
    rng = random.Random(seed)
    text = _draw_bits_ptx(rows_are_queries, key_schedule=key_schedule)
    for _ in range(24):
        philox_seed, offset = rng.getrandbits(64) - 2**63, rng.getrandbits(32)
        p = rng.choice([0.0, 0.1, 0.5, 0.9, 0.999, rng.random()])
        bh, nheads = rng.randrange(64), 64
        row_pair, col_quad = rng.randrange(4096), rng.randrange(4096)
        row_quad, parity = row_pair // 2, row_pair % 2
        key_quad, query_quad = (col_quad, row_quad) if rows_are_queries else (row_quad, col_quad)
        operands = [key_quad, query_quad, bh, offset, philox_seed & M32, (philox_seed >> 32) & M32]
        operands += [dropout_threshold(p) * 0x01010101, parity]
        if key_schedule:
            operands += _key_schedule(philox_seed)
        bits = run_ptx(text, operands)
        state = torch.tensor([philox_seed, offset])
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
