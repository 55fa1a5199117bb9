"""Dropout's random numbers: Philox4x32 (10 rounds, dropout's 7) against Random123 and ``tl.philox``."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from flashtile.reference.dropout import DROPOUT_ROUNDS, dropout_keep, philox4x32

M32 = 0xFFFFFFFF

# Random123's kat_vectors for philox4x32 with 10 rounds: counter, key, expected output.
KNOWN_ANSWERS = {
    "zeros": ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    "ones": ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    "pi-digits": (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
}


@pytest.mark.parametrize("case", KNOWN_ANSWERS.values(), ids=KNOWN_ANSWERS.keys())
def test_philox_known_answers(case: tuple) -> None:
    counter, key, expected = case
    assert [int(w) for w in philox4x32(key, counter)] == list(expected)


def test_philox_broadcasts_tensors_like_scalars() -> None:
    counter = (torch.arange(5)[:, None], torch.arange(3), 7, 2**32 + 9)
    words = philox4x32((123, 456), counter)
    assert all(w.shape == (5, 3) for w in words)
    scalar = philox4x32((123, 456), (4, 2, 7, 9))
    assert [int(w[4, 2]) for w in words] == [int(w) for w in scalar]


@triton.jit
def _philox_grid_kernel(
    out_ptr, rng_state_ptr, NQ: tl.constexpr, NK: tl.constexpr, H: tl.constexpr, ROUNDS: tl.constexpr
):
    """Writes tl.philox's four words (ROUNDS rounds) for counter (j, i, b·H + h, offset) of one (b, h)
    program."""
    bh = tl.program_id(0)
    seed = tl.load(rng_state_ptr)
    offset = tl.load(rng_state_ptr + 1).to(tl.uint32)
    rows = tl.arange(0, NQ)[:, None] + tl.zeros([NQ, NK], dtype=tl.int32)
    cols = tl.arange(0, NK)[None, :] + tl.zeros([NQ, NK], dtype=tl.int32)
    head = bh + tl.zeros([NQ, NK], dtype=tl.int32)
    off = offset + tl.zeros([NQ, NK], dtype=tl.uint32)
    c0, c1, c2, c3 = tl.philox(seed, cols, rows, head, off, n_rounds=ROUNDS)
    tile = out_ptr + bh * 4 * NQ * NK + rows * NK + cols
    tl.store(tile, c0.to(tl.int64))
    tl.store(tile + NQ * NK, c1.to(tl.int64))
    tl.store(tile + 2 * NQ * NK, c2.to(tl.int64))
    tl.store(tile + 3 * NQ * NK, c3.to(tl.int64))


RNG_STATES = {
    "small": (1234, 0),
    "seed-above-2^32": (0x1234_5678_9ABC, 77),
    "negative-seed": (-5, 3),
    "offset-above-2^32": (42, 2**32 + 5),
}


@pytest.mark.parametrize("rounds", [10, DROPOUT_ROUNDS], ids=["10-rounds", "dropout-rounds"])
@pytest.mark.parametrize("state", RNG_STATES.values(), ids=RNG_STATES.keys())
def test_philox_equals_triton(state: tuple[int, int], rounds: int) -> None:
    """Bitwise agreement with tl.philox is what lets the kernels and the reference share masks: at the
    10 rounds of the known answers and at dropout's."""
    batch, nheads, seqlen_q, seqlen_k = 2, 3, 8, 16
    rng_state = torch.tensor(state, dtype=torch.int64)
    words = torch.zeros(batch * nheads, 4, seqlen_q, seqlen_k, dtype=torch.int64)
    _philox_grid_kernel[(batch * nheads,)](words, rng_state, seqlen_q, seqlen_k, nheads, rounds)
    seed, offset = state
    bh = torch.arange(batch * nheads)[:, None, None]
    ours = philox4x32(
        (seed, seed >> 32), (torch.arange(seqlen_k), torch.arange(seqlen_q)[:, None], bh, offset), rounds
    )
    assert torch.equal(torch.stack(ours, dim=1), words)


def test_keep_rule_is_one_philox_call_per_block_of_sixteen() -> None:
    """Entry (i, j) reads byte 2·((i // 8) % 2) + (j // 8) % 2 of word 2·(i % 2) + j % 2 of the call for the
    quads (j // 16)·4 + (j % 8) // 2 and (i // 16)·4 + (i % 8) // 2; written out one scalar call at a time,
    independently of the vectorised rule, over rows and columns past 16 (a second block)."""
    rng_state = torch.tensor([99, 5])
    b, h, nheads = 1, 2, 3
    rows, cols = range(35), range(37)
    for p in (0.25, 0.5, 0.9):
        expected = torch.zeros(len(rows), len(cols), dtype=torch.bool)
        for i in rows:
            for j in cols:
                i_quad, j_quad = (i // 16) * 4 + (i % 8) // 2, (j // 16) * 4 + (j % 8) // 2
                words = philox4x32((99, 0), (j_quad, i_quad, b * nheads + h, 5), DROPOUT_ROUNDS)
                byte = 2 * ((i // 8) % 2) + (j // 8) % 2
                draw = (int(words[2 * (i % 2) + j % 2]) >> (8 * byte)) & 0xFF
                expected[i, j] = draw >= math.floor(p * 2**8)
        keep = dropout_keep(rng_state, p, b, h, nheads, torch.arange(35)[:, None], torch.arange(37))
        assert torch.equal(keep, expected), p


def test_dropout_p_zero_keeps_everything() -> None:
    keep = dropout_keep(
        torch.tensor([7, 0]),
        0.0,
        0,
        torch.arange(4)[:, None, None],
        4,
        torch.arange(32)[:, None],
        torch.arange(32),
    )
    assert keep.all()


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_dropped_fraction_is_close_to_p(dropout_p: float, seed: int) -> None:
    rng_state = torch.randint(-(2**62), 2**62, (2,))
    b = torch.arange(2)[:, None, None, None]
    h = torch.arange(4)[None, :, None, None]
    rows, cols = torch.arange(512)[:, None], torch.arange(256)
    keep = dropout_keep(rng_state, dropout_p, b, h, 4, rows, cols)
    assert keep.numel() >= 10**6
    dropped = 1.0 - keep.double().mean().item()
    assert abs(dropped - dropout_p) < 0.01, f"dropped {dropped}, p {dropout_p}, rng_state {rng_state}"
