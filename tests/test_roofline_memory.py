"""IO accounting (the worked example of docs/design/io_accounting.md); the roofline and memory commands."""

from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path

import pytest

from flashtile.bench import io_model
from flashtile.bench.io_model import AttentionShape, account, extra_memory, tiled_kv_rows, tiled_q_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "design" / "io_accounting.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# (direction, algorithm) -> (FLOPs, HBM bytes, FLOP/byte to 3 decimals); N = 2048, d = 64, fp32, B_r = 64.
WORKED_EXAMPLE = {
    ("forward", "naive"): (1_073_741_824, 69_206_016, "15.515"),
    ("forward", "tiled"): (1_073_741_824, 34_611_200, "31.023"),
    ("forward", "minimum"): (1_073_741_824, 2_105_344, "510.008"),
    ("backward", "naive"): (2_684_354_560, 121_634_816, "22.069"),
    ("backward", "tiled"): (2_684_354_560, 72_376_320, "37.089"),
    ("backward", "minimum"): (2_684_354_560, 4_202_496, "638.752"),
}
WORKED_EXAMPLE_CAUSAL_TILED_FORWARD = (536_870_912, 18_358_272, "29.244")
WORKED_EXAMPLE_EXTRA_MEMORY = {"tiled": 2_113_536, "naive": 52_428_800}


def _doc_numbers() -> set[str]:
    return set(re.findall(r"\d[\d,]*\.?\d*", DOC.read_text()))


def test_worked_example_matches_code_and_doc() -> None:
    shape = AttentionShape(
        batch=1, heads=1, seqlen_q=2048, seqlen_k=2048, head_dim=64, dtype_bytes=4, block_m=64
    )
    documented = _doc_numbers()
    for traffic in account(shape):
        flops, nbytes, intensity = WORKED_EXAMPLE[(traffic.direction, traffic.algorithm)]
        assert (traffic.flops, traffic.hbm_bytes, f"{traffic.intensity:.3f}") == (flops, nbytes, intensity)
        for number in (f"{flops:,}", f"{nbytes:,}", intensity):
            assert number in documented, (
                f"{traffic.direction} {traffic.algorithm}: {number} missing from {DOC.name}"
            )

    causal = io_model.tiled_forward(AttentionShape(causal=True))
    flops, nbytes, intensity = WORKED_EXAMPLE_CAUSAL_TILED_FORWARD
    assert (causal.flops, causal.hbm_bytes, f"{causal.intensity:.3f}") == (flops, nbytes, intensity)
    for algorithm, nbytes in WORKED_EXAMPLE_EXTRA_MEMORY.items():
        assert extra_memory(shape, algorithm) == nbytes
        assert f"{nbytes:,}" in documented


def test_worked_example_terms() -> None:
    shape = AttentionShape()
    terms = {t.what: t.nbytes for t in io_model.tiled_forward(shape).terms}
    assert terms == {
        "read Q": 524_288,
        "read K (32 programs)": 16_777_216,
        "read V (32 programs)": 16_777_216,
        "write O": 524_288,
        "write LSE (fp32)": 8_192,
    }
    naive = io_model.naive_forward(shape)
    assert sum(t.nbytes for t in naive.terms if t.what.endswith((" S", " P"))) == 4 * 16_777_216


def test_flops_conventions() -> None:
    shape = AttentionShape(batch=3, heads=5, seqlen_q=96, seqlen_k=96, head_dim=32)
    assert io_model.forward_flops(shape) == 4 * 3 * 5 * 96 * 96 * 32
    assert io_model.backward_flops(shape) * 2 == 5 * io_model.forward_flops(shape)
    causal = AttentionShape(batch=3, heads=5, seqlen_q=96, seqlen_k=96, head_dim=32, causal=True)
    assert 2 * io_model.forward_flops(causal) == io_model.forward_flops(shape)
    # N_q ≠ N_k: the bottom-right causal mask's visible pairs, counted one by one.
    rect = AttentionShape(seqlen_q=5, seqlen_k=9, head_dim=8, causal=True)
    pairs = sum(1 for i in range(5) for j in range(9) if j <= i + 9 - 5)
    assert io_model.forward_flops(rect) == 4 * 8 * pairs


def _brute_force_rows(
    seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, causal: bool
) -> tuple[int, int]:
    """K rows loaded by the query-row programs and Q rows loaded by the key-block programs, by enumerating
    the blocks that hold at least one visible (query, key) pair (for the dK/dV pass: from that block on)."""

    def visible(i: int, j: int) -> bool:
        return not causal or j <= i + seqlen_k - seqlen_q

    kv_rows = 0
    for r0 in range(0, seqlen_q, block_m):
        rows = range(r0, min(r0 + block_m, seqlen_q))
        for c0 in range(0, seqlen_k, block_n):
            cols = range(c0, min(c0 + block_n, seqlen_k))
            if any(visible(i, j) for i in rows for j in cols):
                kv_rows += len(cols)
    q_rows = 0
    for c0 in range(0, seqlen_k, block_n):
        cols = range(c0, min(c0 + block_n, seqlen_k))
        for r0 in range(0, seqlen_q, block_m):
            if any(visible(i, j) for i in range(r0, min(r0 + block_m, seqlen_q)) for j in cols):
                q_rows += seqlen_q - r0
                break
    return kv_rows, q_rows


@pytest.mark.parametrize(
    "seqlen_q,seqlen_k,block_m,block_n",
    [
        (64, 64, 16, 16),
        (100, 100, 32, 16),
        (37, 91, 16, 32),
        (91, 37, 32, 16),
        (8, 50, 16, 16),
        (50, 8, 16, 16),
    ],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tiled_rows_match_block_enumeration(
    seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, causal: bool
) -> None:
    shape = AttentionShape(
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=16, block_m=block_m, block_n=block_n, causal=causal
    )
    assert (tiled_kv_rows(shape), tiled_q_rows(shape)) == _brute_force_rows(
        seqlen_q, seqlen_k, block_m, block_n, causal
    )


def _shape(n: int, **kw: object) -> AttentionShape:
    return AttentionShape(batch=1, heads=16, seqlen_q=n, seqlen_k=n, head_dim=128, dtype_bytes=2, **kw)


def test_naive_quadratic_tiled_footprint_linear() -> None:
    for n in (4096, 8192, 16384):
        small, big = _shape(n), _shape(2 * n)
        # The tiled footprint doubles exactly with N; the naive one approaches ×4.
        assert extra_memory(big, "tiled") == 2 * extra_memory(small, "tiled")
        assert 3.9 < extra_memory(big, "naive") / extra_memory(small, "naive") <= 4
        # Naive traffic is quadratic; minimum traffic is linear.
        assert 3.9 < io_model.naive_forward(big).hbm_bytes / io_model.naive_forward(small).hbm_bytes <= 4
        assert io_model.minimum_forward(big).hbm_bytes == 2 * io_model.minimum_forward(small).hbm_bytes


def test_tiled_traffic_divides_naive_by_two_block_m_over_d() -> None:
    # At a fixed tile the tiled traffic is quadratic too (K and V once per query-row program), smaller than
    # the naive traffic by 2·B_r/d; with one program for all rows it is the minimum: linear.
    for block_m in (64, 128, 256):
        shape = _shape(65536, block_m=block_m, block_n=64)
        ratio = io_model.naive_forward(shape).hbm_bytes / io_model.tiled_forward(shape).hbm_bytes
        assert ratio == pytest.approx(2 * block_m / 128, rel=0.01)
    for n in (1024, 2048):
        whole = _shape(n, block_m=n)
        assert io_model.tiled_forward(whole).hbm_bytes == io_model.minimum_forward(whole).hbm_bytes


def test_shape_rejects_nonpositive_sizes() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        AttentionShape(head_dim=0)


def _flashtile(*argv: str) -> int:
    """Run ``flashtile <argv>`` in-process, as the console script would."""
    from flashtile.cli import main

    return main(list(argv))


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_roofline_prints_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert _flashtile("roofline") == 0
    out = capsys.readouterr().out
    for number in ("1,073,741,824", "69,206,016", "34,611,200", "15.52", "31.02"):
        assert number in out


def test_roofline_measure_writes_csv_and_plot(tmp_path: Path) -> None:
    from flashtile.bench.roofline import COLUMNS

    csv_path, png = tmp_path / "roofline.csv", tmp_path / "roofline.png"
    argv = ["--measure", "--device", "cpu", "--seqlen", "128", "--head-dim", "32", "--heads", "2", "--causal"]
    argv += ["--out-dir", str(tmp_path)]
    assert _flashtile("roofline", *argv) == 0
    header, rows = _read_csv(csv_path)
    assert header == list(COLUMNS)
    by_impl = {r["impl"]: r for r in rows}
    assert {"flashtile", "naive"} <= set(by_impl)
    for name in ("flashtile", "naive"):
        row = by_impl[name]
        assert row["status"] == "ok", row["note"]
        assert row["gpu"].startswith("CPU")
        assert float(row["p20_ms"]) <= float(row["p50_ms"]) <= float(row["p80_ms"])
        assert float(row["achieved_tflops"]) > 0
        assert row["commit"] and row["torch"] and row["date"]
    assert by_impl["naive"]["io_model"] == "naive" and by_impl["flashtile"]["io_model"] == "tiled"
    assert png.read_bytes().startswith(PNG_MAGIC)

    # A second run appends under the same header.
    assert _flashtile("roofline", *argv) == 0
    assert len(_read_csv(csv_path)[1]) == 2 * len(rows)


def test_memory_writes_csv_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flashtile.bench.memory import COLUMNS

    csv_path, png = tmp_path / "memory.csv", tmp_path / "memory.png"
    argv = [
        "--device",
        "cpu",
        "--heads",
        "2",
        "--head-dim",
        "32",
        "--min-seqlen",
        "64",
        "--max-seqlen",
        "256",
    ]
    assert _flashtile("memory", *argv, "--out-dir", str(tmp_path)) == 0
    header, rows = _read_csv(csv_path)
    assert header == list(COLUMNS)
    for name in ("flashtile", "naive"):
        mine = [r for r in rows if r["impl"] == name]
        assert [int(r["seqlen"]) for r in mine] == [64, 128, 256]
        assert all(r["status"] == "ok" and r["measure"].startswith("cpu") for r in mine)
        assert all(r["causal"] == "true" for r in mine)
        models = [int(r["model_bytes"]) for r in mine]
        if name == "flashtile":
            assert models[1:] == [2 * m for m in models[:-1]]
        else:
            assert all(b > 3 * a for a, b in itertools.pairwise(models))
    assert png.read_bytes().startswith(PNG_MAGIC)
    out = capsys.readouterr().out
    assert "longest N" in out and "CPU" in out


USAGE_ERRORS = [
    pytest.param(
        ("roofline", "--seqlen", "0"), "--seqlen: must be at least 1, got 0", id="roofline-seqlen-0"
    ),
    pytest.param(
        ("roofline", "--heads", "-3"), "--heads: must be at least 1, got -3", id="roofline-heads-neg"
    ),
    pytest.param(("roofline", "--measure", "--device", "nosuch"), "--device nosuch", id="roofline-device"),
    pytest.param(
        ("roofline", "--measure", "--device", "cpu", "--impls", "nosuch"), "--impls", id="roofline-impls"
    ),
    pytest.param(
        ("roofline", "--measure", "--device", "cpu", "--out-dir", "{file}"), "--out-dir", id="roofline-out"
    ),
    pytest.param(
        ("memory", "--min-seqlen", "0"), "--min-seqlen: must be at least 1, got 0", id="memory-min-0"
    ),
    pytest.param(
        ("memory", "--device", "cpu", "--min-seqlen", "512", "--max-seqlen", "256"),
        "--min-seqlen 512 and --max-seqlen 256",
        id="memory-min-above-max",
    ),
    pytest.param(("memory", "--device", "nosuch"), "--device nosuch", id="memory-device"),
    pytest.param(("memory", "--device", "cpu", "--impls", "nosuch"), "--impls", id="memory-impls"),
    pytest.param(("memory", "--device", "cpu", "--out-dir", "{file}"), "--out-dir", id="memory-out"),
]


@pytest.mark.parametrize(("argv", "message"), USAGE_ERRORS)
def test_usage_errors_exit_2_with_one_line(
    argv: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Usage errors exit 2 as argparse's and flashtile bench's do, whether argparse or the command finds them.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = tuple(a.replace("{file}", str(blocker)) for a in argv)
    if "--out-dir" not in argv:
        argv += ("--out-dir", str(tmp_path))
    assert _flashtile(*argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "", "nothing is printed or measured before the flags are checked"
    lines = captured.err.strip().splitlines()
    assert lines[-1].startswith(f"flashtile {argv[0]}: ") and message in lines[-1], captured.err
    # argparse prints its usage above its error line; the commands' own checks print that line alone.
    assert len(lines) == 1 or "error: argument" in lines[-1], captured.err
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"], "no results file"


def test_append_rows_refuses_other_columns(tmp_path: Path) -> None:
    from flashtile.bench.results import append_rows

    path = tmp_path / "x.csv"
    append_rows(path, [{"a": 1, "b": 2}], ("a", "b"))
    append_rows(path, [{"a": 3, "b": 4}], ("a", "b"))
    assert _read_csv(path)[1] == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    with pytest.raises(ValueError, match="columns"):
        append_rows(path, [{"a": 1, "c": 2}], ("a", "c"))


def test_memory_sweep_stops_each_implementation_at_its_first_failure() -> None:
    import torch

    from flashtile.bench.memory import longest_survived, sweep
    from flashtile.bench.roofline import Contender
    from flashtile.reference.naive import attention

    def runs_out_at_128(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> torch.Tensor:
        if q.shape[1] >= 128:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return attention(q, k, v, softmax_scale=scale, causal=causal)[0]

    def broken(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
        raise RuntimeError("no kernel for this shape")

    impls = [
        Contender("quadratic", runs_out_at_128, "naive"),
        Contender("broken", broken, "tiled"),
        Contender("missing", None, "tiled", unavailable="ImportError: no module"),
    ]
    points = sweep(
        impls,
        [32, 64, 128, 256],
        batch=1,
        heads=2,
        head_dim=16,
        dtype="fp32",
        causal=True,
        device=torch.device("cpu"),
    )
    assert [(p.impl, p.seqlen, p.status) for p in points] == [
        ("quadratic", 32, "ok"),
        ("quadratic", 64, "ok"),
        ("quadratic", 128, "oom"),
        ("broken", 32, "error"),
        ("missing", 32, "unavailable"),
    ]
    assert longest_survived(points, "quadratic") == 64
    assert longest_survived(points, "broken") is None
    assert "no kernel" in points[3].note
