"""The Gluon forward's tile ranges and masks, on the CPU: the very bodies of its index helpers
(kernels/hopper/fwd.py: ``_key_tiles``, ``_masked_steps``, ``_row_terms``, ``_visible``) run in Python on
checked integers and numpy arrays, against flash_attn's visibility rule computed pair by pair.

For many (N_q, N_k, window, BLOCK_N), as the launcher passes them (``option_arguments``): no tile outside
[0, cdiv(N_k, BLOCK_N)) is loaded; every visible (query, key) pair lies in a loaded tile; every tile a
consumer warpgroup runs unmasked is inside N_k and seen whole by each of its 64 rows (past N_q too); and
the masked step's mask is exactly the visible set of the rows below N_q.
"""

from __future__ import annotations

import random
import types

import numpy as np
import pytest

from flashtile.kernels.hopper import fwd

BLOCK_M = 2 * fwd.WG_ROWS.value
WG_ROWS = fwd.WG_ROWS.value
INT32_MAX = 2**31 - 1


class CheckedInt(int):
    """An int32 as the kernel has it: sums stay in range, and // (truncating in Triton, flooring here)
    only ever divides a non-negative number, where the two agree."""

    def __new__(cls, value: int) -> CheckedInt:
        assert -INT32_MAX - 1 <= value <= INT32_MAX, f"{value} overflows int32"
        return super().__new__(cls, value)

    def __add__(self, other: int) -> CheckedInt:
        return CheckedInt(int(self) + int(other))

    __radd__ = __add__

    def __sub__(self, other: int) -> CheckedInt:
        return CheckedInt(int(self) - int(other))

    def __rsub__(self, other: int) -> CheckedInt:
        return CheckedInt(int(other) - int(self))

    def __mul__(self, other: int) -> CheckedInt:
        return CheckedInt(int(self) * int(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: int) -> CheckedInt:
        assert self >= 0 and other > 0, f"{int(self)} // {other}: Triton truncates where Python floors"
        return CheckedInt(int(self) // int(other))


def _cdiv(x: int, div: int) -> CheckedInt:
    # gl.cdiv is (x + div − 1) // div.
    return (CheckedInt(x) + (div - 1)) // div


_SCALAR_GL = types.SimpleNamespace(
    maximum=lambda a, b: CheckedInt(max(a, b)), minimum=lambda a, b: CheckedInt(min(a, b)), cdiv=_cdiv
)
_ARRAY_GL = types.SimpleNamespace(maximum=np.maximum, minimum=np.minimum, expand_dims=np.expand_dims)


def _in_python(jit_fn, gl_namespace):
    """The Python function under a Gluon ``jit_fn``, its ``gl`` replaced by ``gl_namespace``."""
    fn = jit_fn.fn
    namespace = {**fn.__globals__, "gl": gl_namespace, "WG_ROWS": WG_ROWS}
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


key_tiles = _in_python(fwd._key_tiles, _SCALAR_GL)
masked_steps = _in_python(fwd._masked_steps, _SCALAR_GL)
first_tile_partial = _in_python(fwd._first_tile_partial, _SCALAR_GL)
row_terms = _in_python(fwd._row_terms, _ARRAY_GL)
visible = _in_python(fwd._visible, _ARRAY_GL)


def _truth(rows: np.ndarray, cols: np.ndarray, seqlen_q: int, seqlen_k: int, left: int, right: int):
    """flash_attn's rule: query i sees key j < N_k iff i + N_k − N_q − left ≤ j ≤ i + N_k − N_q + right,
    a negative side unlimited."""
    i, j = rows[:, None], cols[None, :]
    see = np.broadcast_to((j >= 0) & (j < seqlen_k), (len(rows), len(cols))).copy()
    if left >= 0:
        see &= j >= i + seqlen_k - seqlen_q - left
    if right >= 0:
        see &= j <= i + seqlen_k - seqlen_q + right
    return see


def _clamped(args: dict, has_left: bool, is_local: bool) -> tuple[int, int]:
    """The window the kernel computes with: the launcher's clamped bounds, −1 where a side is off."""
    return (args["window_left"] if has_left else -1, args["window_right"] if is_local else -1)


def check_tile_ranges(seqlen_q: int, seqlen_k: int, window: tuple[int, int], causal: bool, block_n: int):
    args = fwd.option_arguments(0.125, causal, tuple(window), 0.0, None, seqlen_q, seqlen_k)
    is_local, has_left = args["IS_LOCAL"], args["HAS_WINDOW_LEFT"]
    left, right = window[0], 0 if causal else window[1]
    # The kernel body's lines.
    diag = CheckedInt(seqlen_k - seqlen_q)
    lo_diag = diag - args["window_left"]
    hi_diag = diag + args["window_right"]
    k_tiles = -(-seqlen_k // block_n)
    all_cols = np.arange(k_tiles * block_n)
    for m0 in range(0, seqlen_q, BLOCK_M):
        t_lo, n_tiles = key_tiles(
            CheckedInt(m0), CheckedInt(seqlen_k), lo_diag, hi_diag, BLOCK_M, block_n, is_local, has_left
        )
        case = f"N_q={seqlen_q} N_k={seqlen_k} window={window} causal={causal} BLOCK_N={block_n} m0={m0}"
        # (3) The producer loads tiles t_lo + i, i < n_tiles, all inside the key tiles.
        assert n_tiles >= 0 and (n_tiles == 0 or (t_lo >= 0 and t_lo + n_tiles <= k_tiles)), case
        loaded = np.zeros(k_tiles, dtype=bool)
        loaded[t_lo : t_lo + n_tiles] = True
        block_rows = np.arange(m0, min(m0 + BLOCK_M, seqlen_q))
        # (1) Every visible pair lies in a loaded tile.
        seen_tiles = _truth(block_rows, all_cols, seqlen_q, seqlen_k, left, right).any(0)
        seen_tiles = seen_tiles.reshape(k_tiles, block_n).any(1)
        missed = np.flatnonzero(seen_tiles & ~loaded)
        assert missed.size == 0, f"{case}: visible tiles {missed} not loaded"
        if n_tiles == 0:
            continue
        for wg in range(2):
            row0 = CheckedInt(m0 + wg * WG_ROWS)
            a, b = masked_steps(
                row0, t_lo, n_tiles, CheckedInt(seqlen_k), lo_diag, hi_diag, block_n, is_local, has_left
            )
            assert 1 <= a <= b <= n_tiles, f"{case} wg={wg}: a={a} b={b} n_tiles={n_tiles}"
            if not has_left:
                assert a == 1, case
            wg_rows = np.arange(row0, row0 + WG_ROWS)
            # The masked step's mask: the window as the kernel has it (bounds clamped) for all 64 rows,
            # flash_attn's for the rows below N_q.
            rows = row_terms(wg_rows, int(diag), int(lo_diag), int(hi_diag), seqlen_k, has_left, True)
            assert (rows[3] == wg_rows + seqlen_k - seqlen_q).all()
            truth = _truth(wg_rows, all_cols, seqlen_q, seqlen_k, left, right)
            kernel_truth = _truth(wg_rows, all_cols, seqlen_q, seqlen_k, *_clamped(args, has_left, is_local))
            # Dense, the mask is one row that the scores broadcast.
            keep = visible(0, all_cols, rows, seqlen_k, int(hi_diag), is_local, has_left)
            keep = np.broadcast_to(keep, truth.shape)
            # The causal mask's two forms (the key offsets against the row's last key, or two compares),
            # tile by tile as the kernel calls it.
            for t in range(k_tiles):
                n0 = t * block_n
                for form in (True, False):
                    tile = visible(
                        n0, np.arange(block_n), rows, seqlen_k, int(hi_diag), is_local, has_left, form
                    )
                    want = keep[:, n0 : n0 + block_n]
                    assert (np.broadcast_to(tile, want.shape) == want).all(), (
                        f"{case} wg={wg}: tile {t}, {form}"
                    )
            valid = wg_rows < seqlen_q
            assert (keep == kernel_truth).all(), f"{case} wg={wg}: mask differs from the clamped window"
            assert (keep[valid] == truth[valid]).all(), f"{case} wg={wg}: mask differs from the window"
            # (2) Tiles [a, b), unmasked, are inside N_k and seen whole by all 64 rows, those past N_q too;
            # the masked ones after tile 0 are not (the split wastes no mask).
            whole = kernel_truth.reshape(WG_ROWS, k_tiles, block_n).all(axis=(0, 2))
            for i in range(1, n_tiles):
                assert whole[t_lo + i] == (a <= i < b), f"{case} wg={wg}: tile {t_lo + i} misfiled"
            # (4) The first tile skips the mask exactly where all 64 rows see it whole.
            partial = first_tile_partial(
                row0, t_lo, CheckedInt(seqlen_k), lo_diag, hi_diag, block_n, is_local, has_left
            )
            assert bool(partial) == (not whole[t_lo]), f"{case} wg={wg}: first tile partial={partial}"


WINDOWS = [(-1, -1), (-1, 0), (0, 0), (256, 0), (100, 50), (-1, 37), (17, -1), (0, -1), (-1, 1), (1, 1)]
SHAPES = [(1, 1), (1, 300), (300, 1), (128, 128), (129, 127), (1025, 777), (333, 1200), (64, 700), (700, 64)]


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{left},{right}" for left, right in WINDOWS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{q}x{k}" for q, k in SHAPES])
def test_listed_windows(shape, window, block_n):
    seqlen_q, seqlen_k = shape
    check_tile_ranges(seqlen_q, seqlen_k, window, False, block_n)
    if window[1] in (-1, 0):
        check_tile_ranges(seqlen_q, seqlen_k, (window[0], 0), True, block_n)


@pytest.mark.parametrize("block_n", [64, 128])
def test_random_windows(block_n):
    rng = random.Random(20261124 + block_n)
    for _ in range(600):
        seqlen_q, seqlen_k = rng.randint(1, 900), rng.randint(1, 900)
        # Bounds from none to past both lengths (the launcher clamps those).
        left, right = (rng.choice([-1, rng.randint(0, 64), rng.randint(0, 2000)]) for _ in range(2))
        causal = rng.random() < 0.2
        check_tile_ranges(seqlen_q, seqlen_k, (left, 0 if causal else right), causal, block_n)


def _near_edge(rng: random.Random, seqlen_q: int, seqlen_k: int, block_n: int, sign: int) -> int:
    """A bound that puts a warpgroup's first or last row's window edge (side ``sign``) within two keys of
    a tile edge."""
    row = rng.randrange(0, seqlen_q, WG_ROWS) + rng.choice([0, WG_ROWS - 1])
    edge = rng.randint(0, (seqlen_k + 2 * block_n) // block_n) * block_n + rng.randint(-2, 2)
    return max(sign * (edge - row - (seqlen_k - seqlen_q)), 0)


@pytest.mark.parametrize("block_n", [64, 128])
def test_random_windows_at_tile_edges(block_n):
    # Diagonals i + N_k − N_q ± bound that cross a row block's first or last row a key or two from a tile
    # edge: where an off-by-one in the tile ranges would show.
    rng = random.Random(11 + block_n)
    for _ in range(600):
        seqlen_q, seqlen_k = rng.randint(1, 700), rng.randint(1, 700)
        left = rng.choice([-1, _near_edge(rng, seqlen_q, seqlen_k, block_n, -1)])
        right = rng.choice([-1, _near_edge(rng, seqlen_q, seqlen_k, block_n, 1)])
        check_tile_ranges(seqlen_q, seqlen_k, (left, right), False, block_n)


def test_huge_bounds_stay_in_int32():
    # A bound far past both lengths is clamped on the host: no index sum overflows.
    check_tile_ranges(1000, 900, (2**31 - 1, 2**31 - 1), False, 128)
    check_tile_ranges(1000, 900, (2**31 - 1, -1), False, 64)


def test_backward_query_blocks_cover_every_visible_pair():
    """The Gluon backward's ``_q_blocks`` (kernels/hopper/bwd.py) under a window: for each K/V block, the
    query blocks it visits lie in [0, cdiv(N_q, BM)) and hold every query that sees one of its keys."""
    from flashtile.kernels.hopper import bwd

    q_blocks = _in_python(bwd._q_blocks, _SCALAR_GL)
    rng = random.Random(0)
    cases = [(300, 300, (64, 0)), (203, 113, (17, -1)), (129, 300, (-1, 37)), (200, 200, (0, 0))]
    cases += [(100, 100, (1000, 1000)), (1, 1, (0, 0)), (64, 640, (5, 3))]
    for _ in range(300):
        window = (rng.choice([-1, rng.randrange(0, 400)]), rng.choice([-1, rng.randrange(0, 400)]))
        if window != (-1, -1):
            cases.append((rng.randrange(1, 700), rng.randrange(1, 700), window))
    for seqlen_q, seqlen_k, window in cases:
        args = fwd.option_arguments(0.125, False, window, 0.0, None, seqlen_q, seqlen_k)
        assert args["IS_LOCAL"]
        left, right = window
        for bm, bn in ((64, 128), (128, 128), (64, 64)):
            m_blocks = -(-seqlen_q // bm)
            for n0 in range(0, seqlen_k, bn):
                bounds = CheckedInt(args["window_left"]), CheckedInt(args["window_right"])
                m_first, m_end = q_blocks(
                    CheckedInt(n0), CheckedInt(seqlen_q), CheckedInt(seqlen_k), *bounds, False, True,
                    args["HAS_WINDOW_LEFT"], bm, bn,
                )  # fmt: skip
                case = f"N_q={seqlen_q} N_k={seqlen_k} window={window} BM={bm} BN={bn} n0={n0}"
                assert m_first >= 0 and m_end <= m_blocks, case
                seen = _truth(
                    np.arange(seqlen_q),
                    np.arange(n0, min(n0 + bn, seqlen_k)),
                    seqlen_q,
                    seqlen_k,
                    left,
                    right,
                )
                rows = np.flatnonzero(seen.any(1))
                if rows.size:
                    assert m_first * bm <= rows.min() and rows.max() < m_end * bm, case
