"""``flashtile bench --masks``: its grid, its mask definitions against FlexAttention's, its oracle check, the
first-call child process and the CSV → table → plot path, on the CPU without timing anything; the run itself
is a GPU test."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from flashtile.bench import masks as bench_masks
from flashtile.bench import results
from flashtile.block_mask import EMPTY
from flashtile.cli import build_parser, main
from flashtile.mods import Mods

SMALL = 512


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_masks_preset_covers_the_targets(capsys: pytest.CaptureFixture[str]) -> None:
    m = bench_masks
    assert (16, 128, torch.bfloat16, 16384, 128) == (m.HEADS, m.HEAD_DIM, m.DTYPE, m.SEQLEN, m.BLOCK)
    assert m.CASES == ("block_sparse", "document", "prefix_lm") and m.MODES == ("fwd", "bwd")
    assert set(m.QUICK_CASES) <= set(m.CASES) and "document" in m.QUICK_FIRST_CALL_CASES
    assert set(m.QUICK_FIRST_CALL_CASES) <= set(m.FIRST_CALL_CASES) <= set(m.CASES) - {"block_sparse"}
    assert (m.SPARSE_TARGET, m.FLEX_TARGET, m.FIRST_CALL_TARGET) == (3.0, 1.2, 0.25)
    lengths = m.document_lengths(m.SEQLEN)
    assert len(lengths) == 8 and sum(lengths) == 16384 and any(n % m.BLOCK for n in lengths)
    assert m.prefix_length(m.SEQLEN) == 2048
    tiles = m.random_tiles(m.SEQLEN)
    assert tiles.shape == (128, 128) and tiles.sum(dim=1).tolist() == [32] * 128, "75 % empty in every row"
    assert torch.equal(tiles, m.random_tiles(m.SEQLEN)), "a fixed seed"
    assert "8 documents of 3000 1200" in m.describe("document", m.SEQLEN)
    with pytest.raises(ValueError, match="multiple of 512"):
        m.check_seqlen(1000)
    assert main(["bench", "--help"]) == 0
    assert "--masks" in capsys.readouterr().out


def test_cli_parses_masks_and_refuses_other_presets(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["bench", "--masks", "--quick", "--seqlen", "2k"])
    assert args.masks and args.quick and args.seqlen == [2048]
    assert main(["bench", "--masks", "--paper"]) == 2
    assert "--masks takes --quick" in capsys.readouterr().err


def test_peers_choose_the_implementations(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_masks.chosen_peers(None) == ("flashtile", "flex")
    assert bench_masks.chosen_peers(["flex", "flashtile"]) == ("flashtile", "flex")
    assert bench_masks.chosen_peers(["flashtile"]) == ("flashtile",)
    with pytest.raises(ValueError, match="sdpa-cudnn not in the --masks preset; choose from flashtile, flex"):
        bench_masks.chosen_peers(["flashtile", "sdpa-cudnn"])
    # Checked before anything needs a GPU.
    assert main(["bench", "--masks", "--quick", "--peers", "flexattention", "--device", "cpu"]) == 2
    assert "--peers: flexattention not in the --masks preset" in capsys.readouterr().err


def test_masks_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--masks", "--quick", "--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_visible_pairs_count_each_mask() -> None:
    cpu = torch.device("cpu")
    expected = {
        "block_sparse": int(bench_masks.random_tiles(SMALL).sum()) * bench_masks.BLOCK**2,
        "document": sum(n * n for n in bench_masks.document_lengths(SMALL)),
        "prefix_lm": sum(max(i + 1, bench_masks.prefix_length(SMALL)) for i in range(SMALL)),
    }
    for case, pairs in expected.items():
        block_mask, aux = bench_masks.flashtile_mask(case, SMALL, cpu)
        assert bench_masks.visible_pairs(block_mask, aux, rows_per_chunk=100) == pairs, case


def test_flex_masks_are_flashtiles() -> None:
    cpu = torch.device("cpu")
    rows, cols = torch.arange(SMALL)[:, None], torch.arange(SMALL)[None, :]
    zero = torch.zeros((), dtype=torch.int64)
    for case in ("document", "prefix_lm"):
        ours, aux = bench_masks.flashtile_mask(case, SMALL, cpu)
        keep = Mods(aux_tensors=aux).call(ours.mask_mod, zero, zero, rows, cols)
        assert torch.equal(bench_masks.flex_mask_mod(case, SMALL, cpu)(zero, zero, rows, cols), keep), case
        flex = bench_masks.flex_block_mask(case, SMALL, cpu).to_dense()[0, 0].bool()
        assert torch.equal(flex, ours.tile_states[0, 0] != EMPTY), case
    flex = bench_masks.flex_block_mask("block_sparse", SMALL, cpu)
    assert torch.equal(flex.to_dense()[0, 0].bool(), bench_masks.random_tiles(SMALL))


def test_check_passes_the_mask_and_fails_without_it(seed: int) -> None:
    cpu = torch.device("cpu")
    inputs = tuple(torch.randn(1, SMALL, 1, 32, dtype=torch.bfloat16) for _ in range(4))
    block_mask, aux = bench_masks.flashtile_mask("document", SMALL, cpu)
    mods = Mods(block_mask, None, None, None, aux)
    reference = tuple(bench_masks.oracle(*inputs, mods, d) for d in (torch.float64, torch.bfloat16))
    ours = bench_masks.implementation("flashtile", "document", SMALL, cpu)
    good = bench_masks.check(ours, inputs, reference)
    assert good.fwd[0] == good.bwd[0] == "ok", (good, seed)
    assert "checked on the last head" in good.bwd[1]
    dense_fn = bench_masks.implementation("flashtile-dense", "", SMALL, cpu)
    dense = bench_masks.check(dense_fn, inputs, reference)
    assert dense.fwd[0] == dense.bwd[0] == "wrong" and "max|err|" in dense.fwd[1]


def test_first_call_runs_in_a_fresh_process_with_empty_caches(tmp_path: Path) -> None:
    env = bench_masks.fresh_cache_env(tmp_path)
    assert env["TRITON_CACHE_DIR"].startswith(str(tmp_path))
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    assert not any(tmp_path.iterdir()), "the caches start empty"
    import flashtile

    assert env["PYTHONPATH"].split(":")[0] == str(Path(flashtile.__file__).resolve().parents[1])
    seconds = bench_masks.first_call("flashtile", "document", SMALL, heads=1, device="cpu")
    assert set(seconds) == {"mask_s", "forward_s", "backward_s", "warm_s"}
    assert all(math.isfinite(s) and s > 0 for s in seconds.values())


def _row(impl: str, case: str, mode: str, **values: str) -> dict[str, str]:
    env = results.Environment("abc", "NVIDIA H100", "", "2.x", "3.6", "", "2026-01-01T00:00:00", "cuda")
    base = bench_masks._base_row(env, impl, case, 16384)
    return {**base, "mode": mode, "status": "ok", "detail": "", **values}


def test_targets_table_and_plot_from_the_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = [
        _row("flashtile", "block_sparse", "fwd", p50_ms="1.0", tflops="150"),
        _row("flex", "block_sparse", "fwd", p50_ms="2.0", tflops="75"),
        _row("flashtile-dense", "block_sparse", "fwd", p50_ms="4.0", tflops="550"),
        _row("flashtile", "document", "bwd", p50_ms="1.0", tflops="300"),
        _row("flex", "document", "bwd", p50_ms="1.5", tflops="200"),
        _row("flashtile", "document", "first_call", first_call_s="4"),
        _row("flex", "document", "first_call", first_call_s="20"),
        _row("flashtile", "document", "first_call_new_mask", first_call_s="1"),
        _row("flex", "document", "first_call_new_mask", first_call_s="2"),
    ]
    ratios = {(c.what, c.mode): (c.ratio, c.met) for c in bench_masks.comparisons(found)}
    assert ratios == {
        ("block_sparse: dense time / block-sparse time", "fwd"): (4.0, True),
        ("block_sparse: TFLOP/s / Flex", "fwd"): (2.0, True),
        ("document: TFLOP/s / Flex", "bwd"): (1.5, True),
        ("document first call / Flex", "first_call"): (0.2, True),
        ("document first call (new mask) / Flex", "first_call_new_mask"): (0.5, False),
    }
    results.append_rows(tmp_path / "bench_masks.csv", found, bench_masks.COLUMNS)
    assert main(["bench", "--masks", "--plot-only", "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "flashtile against its targets" in printed and "4.00×" in printed
    assert (tmp_path / "bench_masks.png").exists()
    assert tuple(_rows(tmp_path / "bench_masks.csv")[0]) == bench_masks.COLUMNS


@pytest.mark.gpu
def test_masks_preset_on_the_gpu_checks_and_times_every_case(tmp_path: Path) -> None:
    fast = ["--warmup-ms", "1", "--rep-ms", "3", "--min-reps", "2", "--out-dir", str(tmp_path)]
    assert main(["bench", "--masks", "--quick", "--seqlen", "2k", *fast]) == 0
    rows = _rows(tmp_path / "bench_masks.csv")
    status = {(r["case"], r["mode"], r["impl"]): r for r in rows}
    for case in bench_masks.QUICK_CASES:
        for mode in bench_masks.MODES:
            for impl in ("flashtile", "flex"):
                row = status[(case, mode, impl)]
                assert row["status"] == "ok" and float(row["tflops"]) > 0, row["detail"]
    assert status[("block_sparse", "fwd", "flashtile-dense")]["status"] == "ok"
    for impl in ("flashtile", "flex"):
        for mode in ("first_call", "first_call_new_mask"):
            first = status[("document", mode, impl)]
            assert first["status"] == "ok" and float(first["first_call_s"]) > 0, first["detail"]
    assert (tmp_path / "bench_masks.png").exists()


@pytest.mark.gpu
def test_masks_preset_with_flashtile_alone(tmp_path: Path) -> None:
    fast = ["--warmup-ms", "1", "--rep-ms", "3", "--min-reps", "2", "--out-dir", str(tmp_path), "--no-plot"]
    assert main(["bench", "--masks", "--quick", "--seqlen", "2k", "--peers", "flashtile", *fast]) == 0
    rows = _rows(tmp_path / "bench_masks.csv")
    assert {r["impl"] for r in rows} == {"flashtile", "flashtile-dense"}
    assert all(r["status"] == "ok" for r in rows), [r["detail"] for r in rows if r["status"] != "ok"]
