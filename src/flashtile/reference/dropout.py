"""Dropout's keep mask: Philox4x32-7 in PyTorch integer arithmetic, bitwise equal to Triton's ``tl.philox``.

The kernels draw their mask with ``tl.philox(seed, c0, c1, c2, c3)``; this module computes the same 32-bit
words on any device with int64 tensors, so the CPU backend, the interpreter and the GPU kernels keep the
same entries of P for the same ``rng_state`` (``docs/design/options.md`` section 3).

Philox4x32-R (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps a 128-bit
counter ``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)`` through R rounds of

    c0, c1, c2, c3 ← hi(M1·c2) ^ c1 ^ k0,  lo(M1·c2),  hi(M0·c0) ^ c3 ^ k1,  lo(M0·c0)
    k0, k1 ← k0 + W0, k1 + W1                                  (mod 2³²)

with ``M0 = 0xD2511F53``, ``M1 = 0xCD9E8D57``, ``W0 = 0x9E3779B9``, ``W1 = 0xBB67AE85``; ``hi``/``lo``
are the upper and lower 32 bits of the 64-bit product. Triton takes the key from a 64-bit seed as
``k0 = seed & 0xffffffff``, ``k1 = seed >> 32``.

Dropout runs DROPOUT_ROUNDS = 7 rounds, as flash_attn's CUDA kernels do (``philox.cuh``); the paper finds
Philox4x32 passing TestU01's BigCrush from 7 rounds and recommends 10 (Random123's default, and
``philox4x32``'s here, whose known answers are for 10) for a safety margin. Seven take 30 % off Philox's
work in the kernels (docs/design/options.md §3).
"""

from __future__ import annotations

import math

import torch

_MASK32 = 0xFFFFFFFF
_MUL_A = 0xD2511F53
_MUL_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
_ROUNDS = 10
# Rounds of the dropout mask's Philox calls (kernels/_dropout.py, kernels/hopper/dropout.py).
DROPOUT_ROUNDS = 7

IntLike = torch.Tensor | int


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` 32-bit halves of ``multiplier · x`` for ``x`` in [0, 2³²), without any int64 overflow.

    The multiplier is split into 16-bit halves so every partial product stays below 2⁴⁹: signed overflow
    is undefined behaviour in the C++ kernels behind torch, so it is not relied on.
    """
    high_half = (multiplier >> 16) * x  # < 2⁴⁸
    low_half = (multiplier & 0xFFFF) * x  # < 2⁴⁸
    # multiplier · x = upper · 2¹⁶ + (low_half & 0xffff)
    upper = high_half + (low_half >> 16)
    return upper >> 16, ((upper & 0xFFFF) << 16) | (low_half & 0xFFFF)


def philox4x32(
    key: tuple[IntLike, IntLike], counter: tuple[IntLike, IntLike, IntLike, IntLike], rounds: int = _ROUNDS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 with ``rounds`` rounds: four int64 tensors holding the uint32 output words.

    ``key`` and ``counter`` are ints or integer tensors (broadcast together); only their low 32 bits are
    used, as Triton bitcasts the counter words to uint32.

    >>> [hex(int(w)) for w in philox4x32((0, 0), (0, 0, 0, 0))]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    given = (*counter, *key)
    device = next((x.device for x in given if isinstance(x, torch.Tensor)), None)
    words = [torch.as_tensor(x, dtype=torch.int64, device=device) & _MASK32 for x in given]
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*words)
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(_MUL_B, c2)
        hi_a, lo_a = _mulhilo(_MUL_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


# One Philox call gives four 32-bit words, sixteen 8-bit draws: one each for the entries {i, i + 1, i + 8,
# i + 9} × {j, j + 1, j + 8, j + 9} (i and j even, i % 16 < 8, j % 16 < 8). A thread of a Hopper wgmma
# accumulator holds the half of that block with one row parity: {i, i + 8} × the four keys in the forward's
# S (queries × keys), {j, j + 8} × the four queries in the backward's Sᵀ (keys × queries). Word
# 2·(i % 2) + j % 2 holds the draws of one query parity and one key parity, so either half is two words.
DRAW_BITS = 8


def dropout_threshold(dropout_p: float) -> int:
    """``floor(p · 2⁸)``: kept iff the 8-bit draw is ≥ this; the dropped fraction is then ``floor(p · 256) /
    256``, p to within 1/256, as in flash_attn (the output is still scaled by exactly 1 / (1 − p)).

    >>> dropout_threshold(0.0), dropout_threshold(0.1), dropout_threshold(0.5)
    (0, 25, 128)
    """
    return math.floor(dropout_p * 2**DRAW_BITS)


def quad(x: torch.Tensor) -> torch.Tensor:
    """The index of position ``x``'s block {x₀, x₀ + 1, x₀ + 8, x₀ + 9} (x₀ even, x₀ % 16 < 8):
    ``(x // 16) · 4 + (x % 8) // 2``; queries and keys alike.

    >>> quad(torch.tensor([0, 1, 8, 9, 2, 16])).tolist()
    [0, 0, 0, 0, 1, 4]
    """
    return (x // 16) * 4 + (x % 8) // 2


def half(x: torch.Tensor) -> torch.Tensor:
    """Whether position ``x`` is the second of its block's two 8-apart rows or columns (x % 16 ≥ 8)."""
    return (x // 8) % 2


def dropout_keep(
    rng_state: torch.Tensor,
    dropout_p: float,
    b: IntLike,
    h: IntLike,
    nheads: int,
    rows: IntLike,
    cols: IntLike,
) -> torch.Tensor:
    """Which entries of P dropout keeps: a bool tensor of the broadcast shape of ``b, h, rows, cols``.

    For batch (or varlen sequence) ``b``, query head ``h`` of ``nheads``, query ``i`` in ``rows`` and key
    ``j`` in ``cols`` (positions inside the sequence):
    ``w = philox4x32_7(key=(seed & 0xffffffff, seed >> 32), counter=(quad(j), quad(i), b·nheads + h,
    offset))``; the draw is byte ``2·half(i) + half(j)`` (lowest first) of word ``2·(i % 2) + j % 2``, and
    the entry is kept iff the draw is ``≥ floor(p · 2⁸)``. One Philox call serves the sixteen entries
    {i, i + 1, i + 8, i + 9} × {j, j + 1, j + 8, j + 9}. Counter words are taken modulo 2³² (so an offset
    ≥ 2³² enters as its low 32 bits), as in a kernel that casts them to uint32.

    Args:
        rng_state: int64 ``(2,)`` = ``(seed, offset)``, on the device the mask is wanted on; read without a
            host synchronisation.
        dropout_p: in [0, 1).
        b, h, rows, cols: ints or int64 tensors, broadcast together.
        nheads: query heads per batch element.

    >>> state = torch.tensor([0, 0])
    >>> dropout_keep(state, 0.5, 0, 0, 1, torch.arange(2)[:, None], torch.arange(3)).shape
    torch.Size([2, 3])
    """
    device = rng_state.device
    seed, offset = rng_state.to(torch.int64).unbind()

    def index(x: IntLike) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.int64, device=device)

    rows, cols = index(rows), index(cols)
    words = philox4x32(
        (seed, seed >> 32), (quad(cols), quad(rows), index(b) * nheads + index(h), offset), DROPOUT_ROUNDS
    )
    which = 2 * (rows % 2) + cols % 2
    word = words[0]
    for w in range(1, 4):
        word = torch.where(which == w, words[w], word)
    draw = (word >> (DRAW_BITS * (2 * half(rows) + half(cols)))) & (2**DRAW_BITS - 1)
    return draw >= dropout_threshold(dropout_p)
