"""scripts/paper_standing.py: each paper cell's ratio comes from the last named commit that timed it, against
the best other implementation of that same run; rows off the paper grid, other GPUs and failed rows are left
out."""

from __future__ import annotations

import csv
import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "paper_standing.py"
COLUMNS = ("commit", "gpu", "impl", "mode", "dtype", "causal", "batch", "heads", "heads_kv", "seqlen_q",
           "seqlen_k", "head_dim", "tflops", "status")  # fmt: skip


@pytest.fixture
def standing():
    spec = importlib.util.spec_from_file_location("paper_standing_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(commit, impl, tflops, *, n=4096, d=128, gpu="NVIDIA H200", status="ok", heads_kv=None):
    heads = 2048 // d
    values = (commit, gpu, impl, "bwd", "bf16", "false", 16384 // n, heads, heads_kv or heads, n, n, d)
    return dict(zip(COLUMNS, (*values, tflops, status), strict=True))


def test_the_last_named_commit_wins_against_its_own_best_peer(standing, tmp_path) -> None:
    rows = [
        _row("aaaa111", "flashtile", 400), _row("aaaa111", "sdpa-cudnn", 500),
        _row("bbbb222", "flashtile", 450), _row("bbbb222", "sdpa-cudnn", 300), _row("bbbb222", "flex", 360),
        # Not the paper grid (GQA), another GPU, a failed row, a commit not named: all ignored.
        _row("bbbb222", "sdpa-flash", 900, heads_kv=4), _row("bbbb222", "sdpa-flash", 900, gpu="NVIDIA H100"),
        _row("bbbb222", "sdpa-math", 900, status="error"), _row("cccc333", "flashtile", 1),
        _row("cccc333", "sdpa-cudnn", 1000),
    ]  # fmt: skip
    path = tmp_path / "bench.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    cells = standing.paper_cells(path, "NVIDIA H200", ["aaaa111", "bbbb222"])
    assert cells == {("bwd", 128, False, 4096): (450 / 360, "flex", "bbbb222")}
    # The earlier commit alone: its own run's peer.
    assert standing.paper_cells(path, "NVIDIA H200", ["aaaa111"]) == {
        ("bwd", 128, False, 4096): (400 / 500, "sdpa-cudnn", "aaaa111")
    }


def test_ratios_below_one_are_bold_and_never_read_as_one(standing) -> None:
    assert standing._format_ratio(1.04) == "1.04"
    assert standing._format_ratio(0.93) == "**0.93**"
    assert standing._format_ratio(0.998) == "**0.998**"


def test_the_plot_is_written_with_cells_missing(standing, tmp_path) -> None:
    cells = {
        ("bwd", 128, False, 4096): (1.04, "sdpa-cudnn", "aaaa111"),
        ("fwd", 64, True, 512): (0.91, "sdpa-cudnn", "aaaa111"),
    }
    path = tmp_path / "standing.png"
    standing.plot_standing(cells, "NVIDIA H200", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
