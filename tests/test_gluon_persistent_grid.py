"""Which Gluon forward launches take the persistent grid (kernels/hopper/fwd.py, docs/design/hopper.md,
"Persistent forward"): work tiles of equal cost — plain attention, or a sliding window at most half of N_k
wide — at D = 64 or with ≤ 2048 keys a tile, as many programs as SMs; everything else one program a work
tile. The launches are prepared on the CPU (no kernel runs), where the SM count is 4."""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels import configs
from flashtile.kernels.hopper import fwd

CPU = torch.device("cpu")
SMS = configs.multiprocessor_count(CPU)


def grid(head_dim: int, seqlen: int, *, causal=False, window=(-1, -1), softcap=0.0, alibi=None, varlen=None,
         dropout_p=0.0, persistent=True) -> tuple[int, ...]:  # fmt: skip
    cfg = configs.hopper_fwd_config(head_dim)
    window = (window[0], 0) if causal else window
    launch = fwd._fwd_launch(
        CPU, 2, seqlen, seqlen, 8, 2, head_dim, head_dim**-0.5, causal, window, softcap, alibi, cfg.BLOCK_N,
        cfg.STAGES, varlen, None, dropout_p, persistent,
    )  # fmt: skip
    return launch.grid


def work_tiles(seqlen: int) -> int:
    return -(-seqlen // 128) * 2 * 8


@pytest.mark.parametrize(
    ("head_dim", "seqlen"), [(64, 512), (64, 16384), (128, 1024), (128, 2048), (128, 777)]
)
def test_plain_attention_at_short_keys_or_d64_runs_one_program_an_sm(head_dim, seqlen):
    assert grid(head_dim, seqlen) == (SMS,)


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "window", "causal"),
    [(128, 8192, (256, 0), False), (128, 16384, (255, -1), True), (64, 1024, (64, 64), False),
     (128, 16384, (1000, 900), False), (64, 16384, (4000, 3000), False)],
    ids=["256-0", "causal-255", "64-64", "1000-900", "d64-wide"],
)  # fmt: skip
def test_sliding_windows_run_one_program_an_sm(head_dim, seqlen, window, causal):
    # Every row block visits about the same keys (the window's span), however long the sequence.
    assert grid(head_dim, seqlen, window=window, causal=causal) == (SMS,)


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "options"),
    [
        (128, 2049, {}),
        (128, 16384, {}),
        (256, 1024, {}),
        (128, 1024, {"causal": True}),
        (64, 1024, {"window": (17, -1)}),
        (64, 1024, {"window": (-1, 17)}),
        (64, 1024, {"window": (300, 200)}),
        (128, 16384, {"window": (1100, 900)}),
        (64, 1024, {"softcap": 30.0}),
        (64, 1024, {"alibi": 0}),
        (64, 1024, {"dropout_p": 0.1}),
        (128, 1024, {"persistent": False}),
    ],
    ids=[
        "long-keys",
        "16k",
        "d256",
        "causal",
        "left-only",
        "right-only",
        "wide-window",
        "long-window",
        "softcap",
        "alibi",
        "dropout",
        "turned-off",
    ],
)
def test_every_other_launch_runs_one_program_a_work_tile(head_dim, seqlen, options):
    assert grid(head_dim, seqlen, **options) == (work_tiles(seqlen),)


def test_packed_batches_run_one_program_a_work_tile():
    varlen = (3000, 3000, 1024, 1024)
    assert grid(64, 0, varlen=varlen) == (work_tiles(1024),)


def test_a_grid_never_exceeds_its_work_tiles():
    # One work tile in all (a single 64-row block of one head): one program, however many SMs.
    launch = fwd._fwd_launch(CPU, 1, 64, 64, 1, 1, 64, 0.125, False, (-1, -1), 0.0, None, 128, 2)
    assert launch.grid == (1,)
