"""The ``flashtile`` console script and ``flashtile bench`` on tiny CPU grids, run in-process."""

from __future__ import annotations

import csv
import dataclasses
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import flashtile.bench.peers as registry
from flashtile.backend import resolve
from flashtile.bench import bench, grid, results
from flashtile.bench.grid import Config
from flashtile.bench.peers import AttentionFn, Peer
from flashtile.cli import main

TINY = [
    "bench",
    "--device",
    "cpu",
    "--seqlen",
    "32",
    "48",
    "--head-dim",
    "16",
    "--batch",
    "1",
    "--heads",
    "2",
    "--mode",
    "fwd",
    "bwd",
    "--causal",
    "both",
    "--warmup-ms",
    "1",
    "--rep-ms",
    "2",
    "--min-reps",
    "2",
]


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.parametrize(
    "command", [[], ["check"], ["bench"], ["roofline"], ["memory"]], ids=lambda c: c[0] if c else "top"
)
def test_help_exits_zero_and_names_the_command(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--help"]) == 0
    printed = capsys.readouterr().out
    assert "usage: flashtile" in printed
    if not command:
        for name in ("check", "bench", "roofline", "memory"):
            assert name in printed


def test_bench_on_cpu_writes_documented_csv_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results" / "bench.csv"
    assert main([*TINY, "--out-dir", str(out.parent)]) == 0
    header, rows = _rows(out)
    assert tuple(header) == results.COLUMNS
    ours = [r for r in rows if r["impl"] == "flashtile"]
    assert len(ours) == 2 * 2 * 2, "one row per seqlen, causal flag and mode"
    for r in ours:
        assert r["status"] == "ok", r["detail"]
        assert r["device"] == "cpu"
        assert 0 < float(r["p20_ms"]) <= float(r["p50_ms"]) <= float(r["p80_ms"])
        assert float(r["tflops"]) > 0 and float(r["gbytes_per_s"]) > 0
    assert {r["impl"] for r in rows} >= {"flashtile", "sdpa-math", "naive"}
    assert {r["status"] for r in rows} <= set(results.STATUSES)
    pngs = sorted(p.name for p in out.parent.glob("*.png"))
    assert pngs == ["bench_bwd_fp32.png", "bench_fwd_fp32.png"]
    printed = capsys.readouterr().out
    assert "CPU numbers" in printed and "flashtile / best" in printed


def test_each_configuration_times_the_peers_in_a_rotated_order(tmp_path: Path) -> None:
    # The first-timed peer of a configuration runs on a GPU the checks left idle: the order rotates by one
    # peer per configuration, and each row says where its peer came.
    assert main([*TINY, "--mode", "fwd", "--out-dir", str(tmp_path), "--no-plot"]) == 0
    _, rows = _rows(tmp_path / "bench.csv")
    places: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        found = re.search(r"timed (\d+) of (\d+)", r["detail"])
        if r["status"] == "ok":
            assert found, r["detail"]
            places.setdefault((r["seqlen_q"], r["causal"]), {})[r["impl"]] = int(found[1])
    assert len(places) == 4
    for timed in places.values():
        assert sorted(timed.values()) == list(range(1, len(timed) + 1))
    firsts = [next(impl for impl, place in timed.items() if place == 1) for timed in places.values()]
    assert len(set(firsts)) > 1, firsts


def test_each_row_gives_its_rounds_and_rounds_can_be_set(tmp_path: Path) -> None:
    # Every timed row reports one median per round (bench.timing.time_in_rounds); --rounds sets how many.
    for rounds in (3, 1):
        out = tmp_path / str(rounds)
        argv = [*TINY, "--mode", "fwd", "--causal", "false", "--rounds", str(rounds), "--no-plot"]
        assert main([*argv, "--out-dir", str(out)]) == 0
        _, rows = _rows(out / "bench.csv")
        ok = [r for r in rows if r["status"] == "ok"]
        assert ok
        for r in ok:
            found = re.search(r"median of rounds ([0-9.e+-]+(?:, [0-9.e+-]+)*) ms", r["detail"])
            assert found and len(found[1].split(", ")) == rounds, r["detail"]
    assert main([*TINY, "--rounds", "0", "--out-dir", str(tmp_path)]) == 2


def test_the_rotation_does_not_repeat_with_the_period_of_the_peer_count() -> None:
    # --paper times six lengths per row with six peers: a plain one-place rotation timed N = 512 first in
    # every row. Each length (index mod count) must start at every place over count rows.
    for count in range(1, 8):
        starts: dict[int, set[int]] = {}
        for index in range(count * count):
            shift = bench.rotation_shift(index, count)
            assert 0 <= shift < count
            starts.setdefault(index % count, set()).add(shift)
        assert all(shifts == set(range(count)) for shifts in starts.values()), (count, starts)


def test_second_run_appends_and_plot_only_redraws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.csv"
    args = [
        *TINY,
        "--seqlen",
        "32",
        "--mode",
        "fwd",
        "--causal",
        "false",
        "--peers",
        "flashtile",
        "--no-plot",
    ]
    assert main([*args, "--out-dir", str(out.parent)]) == 0
    assert main([*args, "--out-dir", str(out.parent)]) == 0
    _, rows = _rows(out)
    assert len(rows) == 2
    assert not list(tmp_path.glob("*.png"))
    capsys.readouterr()
    assert main(["bench", "--plot-only", "--out-dir", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.glob("*.png")] == ["bench_fwd_fp32.png"]
    printed = capsys.readouterr().out
    assert "fwd · non-causal · D=16" in printed and "flashtile" in printed


def test_wrong_peer_gets_no_number(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = registry.available_peers

    def with_wrong_peer(device: str, **kwargs: object) -> list[Peer]:
        peers = real(device, **kwargs)
        math = next(p for p in peers if p.name == "sdpa-math")

        def doubled_scale(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
        ) -> torch.Tensor:
            return math.fn(q, k, v, causal, 2 * scale)

        return [*peers, Peer("wrong", doubled_scale, lambda config: None)]

    monkeypatch.setattr(registry, "available_peers", with_wrong_peer)
    out = tmp_path / "bench.csv"
    assert main([*TINY, "--out-dir", str(out.parent), "--no-plot"]) == 0
    _, rows = _rows(out)
    wrong = [r for r in rows if r["impl"] == "wrong"]
    assert len(wrong) == 8
    for r in wrong:
        assert r["status"] == "wrong"
        assert r["p50_ms"] == r["tflops"] == ""
        assert "max|err|" in r["detail"]
    assert all(r["status"] == "ok" for r in rows if r["impl"] == "flashtile")
    assert all(results.Result.from_row(r).error > 0 for r in wrong)


def test_requested_unavailable_peer_is_listed_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = registry.available_peers

    def with_missing_peer(device: str, **kwargs: object) -> list[Peer]:
        return [
            *real(device, **kwargs),
            Peer("missing", None, lambda c: None, unavailable="ImportError: no wheel"),
        ]

    monkeypatch.setattr(registry, "available_peers", with_missing_peer)
    out = tmp_path / "bench.csv"
    assert main([*TINY, "--peers", "flashtile", "missing", "--out-dir", str(out.parent), "--no-plot"]) == 0
    _, rows = _rows(out)
    missing = [r for r in rows if r["impl"] == "missing"]
    assert missing and all(r["status"] == "unsupported" and "no wheel" in r["detail"] for r in missing)


def test_unknown_peer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--peers", "nosuch", "--out-dir", str(tmp_path)]) == 2
    assert "unknown nosuch" in capsys.readouterr().err


def test_decode_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--decode", "--quick", "--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_decode_grid_covers_the_targets() -> None:
    from flashtile.bench.decode import MAX_CACHE_BYTES, cells

    full = cells(quick=False)
    assert {c.batch for c in full} == {1, 4, 16, 64, 256}
    assert {c.cache_len for c in full} == {1024, 4096, 16384, 65536, 131072}
    assert {c.gqa for c in full} == {1, 4, 8}
    assert {c.page_size for c in full} == {None, 16, 64, 256}
    assert {c.seqlen_q for c in full} == {1, 4}
    assert all(c.kv_bytes <= MAX_CACHE_BYTES for c in full)
    assert len(cells(quick=True)) == 8


def test_paper_preset_is_the_papers_grid() -> None:
    paper = grid.preset("paper", "cuda")
    cells = paper.configs()
    assert len(cells) == 6 * 3 * 2 * 3
    assert {c.batch * c.seqlen_q for c in cells} == {16384}
    assert {c.heads * c.head_dim for c in cells} == {2048}
    assert {c.dtype for c in cells} == {"bf16"}
    with pytest.raises(ValueError, match="needs a device of kind cuda"):
        grid.preset("paper", "cpu")


def test_flop_and_byte_counts_follow_the_papers_conventions() -> None:
    config = Config(
        "cuda",
        "bf16",
        "fwd",
        False,
        batch=16,
        heads=16,
        heads_kv=16,
        seqlen_q=1024,
        seqlen_k=1024,
        head_dim=128,
    )
    forward = 4 * 16 * 16 * 1024 * 1024 * 128
    assert config.flops() == forward
    assert config.with_mode("bwd").flops() == 2.5 * forward
    assert config.with_mode("fwd_bwd").flops() == 3.5 * forward
    causal = Config("cuda", "bf16", "fwd", True, 16, 16, 16, 1024, 1024, 128)
    assert causal.flops() == forward / 2
    tensor = 16 * 1024 * 16 * 128 * 2
    assert config.bytes_moved() == 4 * tensor
    assert config.with_mode("bwd").bytes_moved() == 8 * tensor
    gqa = Config("cuda", "bf16", "fwd", False, 16, 16, 4, 1024, 1024, 128)
    assert gqa.bytes_moved() == 2 * tensor + 2 * tensor // 4


def test_check_slice_keeps_the_kernel_configuration() -> None:
    big = Config(
        "cpu", "bf16", "bwd", True, batch=1, heads=8, heads_kv=2, seqlen_q=16384, seqlen_k=16384, head_dim=128
    )
    piece = bench.check_slice(big, torch.device("cpu"))
    assert (piece.batch, piece.heads, piece.heads_kv) == (1, 4, 1)
    assert (piece.seqlen_q, piece.head_dim, piece.causal, piece.dtype) == (16384, 128, True, "bf16")
    small = Config("cpu", "bf16", "fwd", False, 2, 4, 4, 64, 64, 32)
    assert bench.check_slice(small, torch.device("cpu")) == small


def _add_peers(monkeypatch: pytest.MonkeyPatch, make: Callable[[list[Peer]], list[Peer]]) -> None:
    real = registry.available_peers
    monkeypatch.setattr(registry, "available_peers", lambda device, **kwargs: make(real(device, **kwargs)))


def test_partial_oracle_covers_the_last_sequence_and_heads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Room for two (sequence, head) rows of the float64 oracle: one sequence, one KV head and its 2 heads.
    monkeypatch.setattr(bench, "_TOKEN_BUDGET", 2 * 32 * 16)

    def last_head_off(peers: list[Peer]) -> list[Peer]:
        ours = peers[0].fn

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
            out = ours(q, k, v, causal, scale)
            return torch.cat([out[:, :, :-1], 1.5 * out[:, :, -1:]], dim=2)

        return [*peers, Peer("last-head-off", fn, lambda config: None)]

    _add_peers(monkeypatch, last_head_off)
    out = tmp_path / "bench.csv"
    gqa = [
        "--batch",
        "2",
        "--heads",
        "4",
        "--gqa-ratio",
        "2",
        "--seqlen",
        "32",
        "--causal",
        "true",
        "--no-plot",
    ]
    assert main([*TINY, *gqa, "--out-dir", str(out.parent)]) == 0
    _, rows = _rows(out)
    ours = [r for r in rows if r["impl"] == "flashtile"]
    assert [r["status"] for r in ours] == ["ok", "ok"]
    assert all("last 1/2 sequences, 2/4 heads" in r["detail"] and r["heads_kv"] == "2" for r in ours)
    assert [r["status"] for r in rows if r["impl"] == "last-head-off"] == ["wrong", "wrong"]


def test_failures_are_classified_and_shown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def raising(exc: Exception, warning: str | None = None) -> AttentionFn:
        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
            if warning:
                warnings.warn(warning, UserWarning, stacklevel=1)
            raise exc

        return fn

    def failing(peers: list[Peer]) -> list[Peer]:
        return [
            *peers,
            Peer(
                "oom",
                raising(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")),
                lambda c: None,
            ),
            Peer(
                "nokernel",
                raising(
                    RuntimeError("No available kernel. Aborting execution."), "Flash attention needs sm80"
                ),
                lambda c: None,
            ),
            Peer("broken", raising(ValueError("bad stride")), lambda c: None),
            Peer("picky", None, lambda c: None, unavailable="never"),
        ]

    _add_peers(monkeypatch, failing)
    out = tmp_path / "bench.csv"
    assert (
        main([*TINY, "--seqlen", "32", "--causal", "false", "--out-dir", str(out.parent), "--no-plot"]) == 0
    )
    _, rows = _rows(out)
    status = {(r["impl"], r["mode"]): (r["status"], r["detail"]) for r in rows}
    assert status[("oom", "fwd")][0] == "oom"
    assert status[("nokernel", "bwd")] == ("unsupported", "Flash attention needs sm80")
    assert status[("broken", "fwd")] == ("error", "ValueError: bad stride")
    assert ("picky", "fwd") not in status, "an unavailable peer not asked for is a note, not a row"
    printed = capsys.readouterr().out
    assert (
        "OOM" in printed
        and "n/a [" in printed
        and "error [" in printed
        and "picky: not measured, never" in printed
    )


REPO_RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# The smallest run of each writing command, and the files it writes under its --out-dir.
WRITERS = {
    "bench": (
        [*TINY, "--seqlen", "32", "--mode", "fwd", "--causal", "false", "--peers", "flashtile"],
        {"bench.csv", "bench_fwd_fp32.png"},
    ),
    "roofline": (
        [
            "roofline",
            "--measure",
            "--device",
            "cpu",
            "--seqlen",
            "64",
            "--head-dim",
            "16",
            "--impls",
            "flashtile",
        ],
        {"roofline.csv", "roofline.png"},
    ),
    "memory": (
        [
            "memory",
            "--device",
            "cpu",
            "--heads",
            "1",
            "--head-dim",
            "16",
            "--min-seqlen",
            "32",
            "--max-seqlen",
            "32",
            "--impls",
            "flashtile",
        ],
        {"memory.csv", "memory.png"},
    ),
}


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.parametrize("command", list(WRITERS))
def test_out_dir_holds_every_file_written(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, files = WRITERS[command]
    cwd, out_dir = tmp_path / "cwd", tmp_path / "elsewhere" / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main([*argv, "--out-dir", str(out_dir)]) == 0
    assert {p.name for p in out_dir.iterdir()} == files
    assert not list(cwd.iterdir())


@pytest.mark.parametrize("command", list(WRITERS))
def test_default_out_dir_is_flashtile_results_in_the_current_directory(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, files = WRITERS[command]
    committed = _snapshot(REPO_RESULTS)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["flashtile-results"]
    assert {p.name for p in (tmp_path / "flashtile-results").iterdir()} == files
    assert _snapshot(REPO_RESULTS) == committed


@pytest.mark.parametrize(
    ("make", "module", "capability", "reason"),
    [
        (registry.fa2_peer, "flash_attn", (7, 5), "FlashAttention-2 needs sm_80 or newer"),
        (registry.fa2_peer, "flash_attn", (9, 0), None),
        (registry.fa3_peer, "flash_attn_interface", (8, 0), "FlashAttention-3 runs on sm_90 only"),
        (registry.fa4_peer, "flash_attn.cute", (10, 0), None),
    ],
    ids=["fa2-sm75", "fa2-sm90", "fa3-sm80", "fa4-sm100"],
)
def test_flash_attn_peers_call_their_build_and_state_their_limits(
    make: Callable[[], Peer],
    module: str,
    capability: tuple[int, int],
    reason: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    fake = types.ModuleType(module)
    fake.flash_attn_func = lambda q, k, v, softmax_scale, causal: (q * softmax_scale, "lse")
    monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: capability)
    peer = make()
    assert peer.unavailable is None
    q = torch.ones(1, 2, 1, 8)
    assert torch.equal(peer.fn(q, q, q, True, 0.5), q * 0.5)
    cell = Config("cuda", "bf16", "fwd", True, 1, 1, 1, 64, 64, 64)
    assert peer.supports(cell) == reason
    assert peer.supports(dataclasses.replace(cell, device="cpu")) == "needs a CUDA device"
    assert "fp32 not supported" in peer.supports(dataclasses.replace(cell, dtype="fp32"))
    if peer.name == "fa2" and reason is None:
        assert "head dim 60" in peer.supports(dataclasses.replace(cell, head_dim=60))
        mla = dataclasses.replace(cell, head_dim=192, head_dim_v=128)
        assert "head dims 192/128 not supported" in peer.supports(mla)


def test_head_dims_preset_covers_the_targets() -> None:
    assert grid.HEAD_DIM_PAIRS == ((128, 128), (192, 128), (256, 256), (512, 512), (576, 512))
    full = grid.preset("head-dims", "cuda").configs()
    assert len(full) == 2 * 2 * 5 * 2, "N 4k and 16k, causal and not, five pairs, fwd and bwd"
    assert {(c.head_dim, c.dim_v) for c in full} == set(grid.HEAD_DIM_PAIRS)
    assert {(c.seqlen_q, c.causal, c.mode, c.dtype) for c in full} == {
        (n, causal, mode, "bf16")
        for n in (4096, 16384)
        for causal in (False, True)
        for mode in ("fwd", "bwd")
    }
    assert {c.batch * c.seqlen_q for c in full} == {16384}
    heads = {(c.head_dim, c.dim_v): c.heads for c in full}
    assert heads == {(128, 128): 16, (192, 128): 10, (256, 256): 8, (512, 512): 4, (576, 512): 3}
    assert all(c.heads_kv == c.heads and not c.options for c in full)
    assert [c.seqlen_q for c in full] == sorted(c.seqlen_q for c in full), "16k last: a spent budget costs it"
    mla = next(c for c in full if c.head_dim == 576)
    assert mla.v_shape()[-1] == mla.out_shape()[-1] == 512 and mla.kv_shape()[-1] == 576
    assert mla.softmax_scale == 576**-0.5 and mla.head_dim_label == "576/512"
    quick = grid.preset("head-dims-quick", "cuda").configs()
    assert {c.seqlen_q for c in quick} == {4096} and {(c.head_dim, c.dim_v) for c in quick} == set(
        grid.HEAD_DIM_PAIRS
    )
    assert {(c.causal, c.mode) for c in quick} == {(a, m) for a in (False, True) for m in ("fwd", "bwd")}
    with pytest.raises(ValueError, match="needs a device of kind cuda"):
        grid.preset("head-dims", "cpu")


@pytest.mark.parametrize(("head_dim", "head_dim_v"), [(192, 128), (576, 512), (128, 128)], ids=str)
def test_flops_and_bytes_count_each_gemm_at_its_own_head_dim(head_dim: int, head_dim_v: int) -> None:
    b, h, n = 2, 3, 1024
    config = Config("cuda", "bf16", "fwd", False, b, h, h, n, n, head_dim, head_dim_v=head_dim_v)
    # Forward: S = QKᵀ over D, O = PV over D_v. Backward: S again, dK, dQ over D; dP, dV over D_v.
    assert config.flops() == 2 * b * h * n * n * (head_dim + head_dim_v)
    assert config.with_mode("bwd").flops() == 2 * b * h * n * n * (3 * head_dim + 2 * head_dim_v)
    assert config.with_mode("fwd_bwd").flops() == 2 * b * h * n * n * (4 * head_dim + 3 * head_dim_v)
    causal = dataclasses.replace(config, causal=True)
    assert causal.flops() == config.flops() / 2
    assert causal.with_mode("bwd").flops() == config.with_mode("bwd").flops() / 2
    if head_dim == head_dim_v:
        assert config.with_mode("bwd").flops() == 2.5 * config.flops(), "the papers' 2.5"
        assert config.head_dim_v == 0 and config.head_dim_label == "128"
    tokens = b * n * h * 2
    assert config.bytes_moved() == tokens * (2 * head_dim + 2 * head_dim_v), "q, k read over D; v, o over D_v"
    assert config.with_mode("bwd").bytes_moved() == 2 * config.bytes_moved()
    sink = dataclasses.replace(causal, sink=True)
    assert sink.options == ("sink",) and sink.option_label() == "learnable sink"
    assert sink.flops() == 2 * h * (head_dim + head_dim_v) * b * n * (n + 1) // 2, "visible pairs"
    assert sink.without_options() == causal


def test_head_dims_cli_parses_and_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    from flashtile.cli import build_parser

    args = build_parser().parse_args(["bench", "--head-dims", "--quick", "--seqlen", "1k"])
    assert args.head_dims and args.quick and args.seqlen == [1024] and args.head_dim is None
    assert main(["bench", "--help"]) == 0
    assert "--head-dims" in capsys.readouterr().out
    refusals = {
        ("--quick", "--device", "cpu"): "--head-dims needs a CUDA device",
        ("--head-dim", "64"): "leave out --head-dim",
        ("--options",): "--head-dims takes --quick",
        ("--masks",): "separate runs",
    }
    for extra, message in refusals.items():
        assert main(["bench", "--head-dims", *extra, "--no-plot"]) == 2, extra
        assert message in capsys.readouterr().err, extra


def test_rows_keep_v_head_dim_and_sink() -> None:
    from flashtile.bench.timing import Timing

    env = results.Environment("abc", "NVIDIA H100", "", "2.x", "3.6", "", "2026-01-01T00:00:00", "cuda")
    for config in (
        Config("cuda", "bf16", "bwd", True, 1, 3, 3, 16384, 16384, 576, head_dim_v=512),
        Config("cuda", "bf16", "bwd", True, 4, 16, 16, 4096, 4096, 128, sink=True),
        Config("cuda", "bf16", "fwd", False, 4, 16, 16, 4096, 4096, 128, head_dim_v=128),
    ):
        row = results.Result(config, "flashtile", "ok", timing=Timing(1.0, 1.0, 1.0, reps=1)).row(env)
        assert results.Result.from_row(row).config == config
    assert row["head_dim_v"] == "128" and row["sink"] == "false"
    old_row = {k: v for k, v in row.items() if k not in ("head_dim_v", "sink")}
    assert results.Result.from_row(old_row).config == config, "CSVs without the new columns read back"


def _checked(config: Config, peer: Peer) -> tuple[bench._Verdict, bench._Verdict]:
    options = bench.call_options(config, torch.device("cpu"))
    ref = bench._reference(config, True, torch.device("cpu"), options)
    fwd, bwd = bench._check_peer(peer, ref, True, options)
    assert bwd is not None
    return fwd, bwd


def test_oracle_checks_unequal_head_dims_and_the_sink_gradient(seed: int) -> None:
    ours = registry.flashtile_peer("cpu")
    mla = Config("cpu", "fp32", "bwd", True, 2, 2, 1, 40, 40, 24, head_dim_v=16)
    fwd, bwd = _checked(mla, ours)
    assert (fwd.status, bwd.status) == ("ok", "ok"), (fwd, bwd, seed)
    assert "dv" in bwd.detail

    def v_dims_swapped(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> object:
        return ours.fn(q, k, v.flip(-1), causal, scale)

    fwd, bwd = _checked(mla, Peer("swapped", v_dims_swapped, lambda c: None))
    assert fwd.status == bwd.status == "wrong" and "max|err|" in fwd.detail
    sink = Config("cpu", "fp32", "bwd", True, 2, 2, 2, 40, 40, 16, sink=True)
    fwd, bwd = _checked(sink, ours)
    assert (fwd.status, bwd.status) == ("ok", "ok") and "dsink" in bwd.detail, (fwd, bwd, seed)

    def sink_ignored(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, learnable_sink: object
    ) -> object:
        return ours.fn(q, k, v, causal, scale)

    fwd, _ = _checked(sink, Peer("no-sink", sink_ignored, lambda c: None, options=frozenset({"sink"})))
    assert fwd.status == "wrong"


def test_flex_sink_equals_the_naive_sink() -> None:
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from flashtile.reference.naive import attention

    q, k = torch.randn(2, 1, 24, 2, 16, dtype=torch.float64)
    v = torch.randn(1, 24, 2, 8, dtype=torch.float64)
    sink = torch.randn(2, dtype=torch.float64, requires_grad=True)
    mask = create_block_mask(registry._mask_mod(0, -1, 0), None, None, 24, 24, device="cpu")
    with warnings.catch_warnings():
        # Eager FlexAttention (no torch.compile) warns that it materialises the scores: fine at this size.
        warnings.simplefilter("ignore", UserWarning)
        out, aux = flex_attention(
            *(t.transpose(1, 2) for t in (q, k, v)),
            block_mask=mask,
            scale=0.3,
            return_aux=AuxRequest(lse=True),
        )
    ours = registry._with_sink(out, aux.lse, sink).transpose(1, 2)
    expected, _ = attention(q, k, v, softmax_scale=0.3, causal=True, learnable_sink=sink)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    dout = torch.randn_like(expected)
    (d_ours,) = torch.autograd.grad(ours, sink, dout)
    (d_expected,) = torch.autograd.grad(expected, sink, dout)
    torch.testing.assert_close(d_ours, d_expected, rtol=0, atol=1e-12)


def test_head_dim_ratios_table_and_plot_from_the_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flashtile.bench.timing import Timing

    def timed(d: int, d_v: int, impl: str, tflops: float) -> results.Result:
        config = Config("cuda", "bf16", "bwd", True, 1, 2048 // d, 2048 // d, 16384, 16384, d, head_dim_v=d_v)
        ms = config.flops() / (tflops * 1e9)
        return results.Result(config, impl, "ok", "", Timing(ms, ms, ms, reps=1))

    found = [
        timed(128, 128, "flashtile", 400.0),
        timed(192, 128, "flashtile", 360.0),
        timed(192, 128, "flex", 300.0),
        timed(256, 256, "flashtile", 300.0),
        timed(512, 512, "flashtile", 150.0),
    ]
    compared = {c.head_dims: c for c in bench.head_dim_comparisons(found)}
    mla = compared["192/128"]
    assert mla.vs_128 == pytest.approx(0.9) and mla.vs_256 == pytest.approx(1.2)
    assert mla.peer == "flex" and mla.peer_ratio == pytest.approx(1.2)
    assert compared["512/512"].vs_256 == pytest.approx(0.5) and compared["512/512"].peer is None
    assert bench.head_dim_comparisons([r for r in found if not r.config.head_dim_v]) == []
    env = results.Environment("abc", "NVIDIA H100", "", "2.x", "3.6", "", "2026-01-01T00:00:00", "cuda")
    csv_path = tmp_path / "bench_head_dims.csv"
    results.append_rows(csv_path, [r.row(env) for r in found], results.HEAD_DIM_COLUMNS)
    assert main(["bench", "--head-dims", "--plot-only", "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "head dims · flashtile TFLOP/s against its equal-dim 128 and 256 cells" in printed
    assert "bwd · causal · D=192/128 · bf16" in printed and "0.90×" in printed
    assert {p.name for p in tmp_path.glob("*.png")} == {"bench_head_dims_bwd_bf16.png"}


def test_options_preset_is_the_issue_8_grid() -> None:
    cells = grid.preset("options", "cuda").configs()
    assert {(c.dtype, c.head_dim, c.heads * c.head_dim) for c in cells} == {("bf16", 128, 2048)}
    assert {c.mode for c in cells} == {"fwd", "bwd"}
    by_option: dict[tuple[str, ...], set[tuple[int, bool]]] = {}
    for c in cells:
        by_option.setdefault(c.options, set()).add((c.seqlen_q, c.causal))
    assert by_option[("window",)] == {(8192, True)}
    for option in ("softcap", "alibi", "dropout"):
        assert by_option[(option,)] == {(4096, False), (16384, False)}
    assert by_option[("sink",)] == {(4096, True), (16384, True)}
    packed = next(c for c in cells if c.layout == "varlen")
    documents = {(n, True) for n in packed.lengths}
    assert by_option[()] == {(8192, True), (4096, False), (16384, False), (4096, True), (16384, True)} | (
        documents
    ), "each option's plain yardstick, and the packed batch's documents alone"
    assert all(
        c.batch == 1 for c in cells if not c.options and (c.seqlen_q, c.causal) in documents - {(8192, True)}
    )
    window = next(c for c in cells if c.options == ("window",))
    assert window.window == (256, 0) and window.batch * window.seqlen_q == 16384
    # --causal true / both: softcap, ALiBi and dropout causal (or both), beside the causal plain cells.
    for causal, expected in (((True,), {True}), ((False, True), {False, True})):
        preset = grid.preset("options", "cuda").with_overrides(causal=causal)
        chosen = preset.configs()
        for option in ("softcap", "alibi", "dropout"):
            assert {c.causal for c in chosen if c.options == (option,)} == expected
        assert {c.causal for c in chosen if c.options == ("window",)} == {True}
        documents = set(next(c for c in chosen if c.layout == "varlen").lengths)
        assert {c.seqlen_q for c in chosen if not c.options and c.causal} - documents == {4096, 8192, 16384}
    assert {c.softcap for c in cells if c.options == ("softcap",)} == {30.0}
    assert {c.dropout_p for c in cells if c.options == ("dropout",)} == {0.1}
    padded = next(c for c in cells if c.layout == "padded")
    assert sum(packed.lengths) == packed.tokens == 16384 and packed.causal
    assert all(256 <= n <= 8192 for n in packed.lengths[:-1]) and len(set(packed.lengths)) > 2
    assert padded.lengths == packed.lengths and padded.seqlen_q == max(packed.lengths)
    assert padded.q_shape() == (len(packed.lengths), max(packed.lengths), 16, 128)
    assert packed.q_shape() == (1, 16384, 16, 128)
    exact = 4 * 16 * 128 * sum(n * (n + 1) // 2 for n in packed.lengths)
    assert packed.forward_flops() == padded.forward_flops() == exact, "FLOPs of real tokens only"
    assert window.forward_flops() == 4 * 2 * 16 * 128 * (257 * 8192 - 256 * 257 // 2)


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "causal", "window"),
    [
        (37, 37, True, (-1, -1)),
        (37, 37, False, (8, 0)),
        (37, 37, True, (8, 3)),
        (19, 45, True, (-1, -1)),
        (45, 19, True, (-1, -1)),
        (45, 19, False, (4, 2)),
        (19, 45, False, (0, 0)),
        (23, 23, False, (100, 100)),
        (23, 23, False, (-1, 5)),
        (30, 11, False, (3, -1)),
        (0, 11, True, (-1, -1)),
    ],
    ids=lambda x: str(x).replace(" ", ""),
)
def test_visible_pairs_equal_the_naive_keep_mask(
    seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]
) -> None:
    from flashtile.reference.naive import keep_mask

    brute = int(keep_mask(seqlen_q, seqlen_k, causal=causal, window_size=window).sum())
    assert grid.visible_pairs(seqlen_q, seqlen_k, causal, window) == brute
    config = Config("cpu", "fp32", "fwd", causal, 3, 2, 1, seqlen_q, seqlen_k, 16, window=window, alibi=True)
    assert config.forward_flops() == 4 * 2 * 16 * 3 * brute


def test_flex_mask_and_score_mods_equal_the_naive_options() -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from flashtile.reference.naive import attention

    q = torch.randn(1, 24, 2, 16, dtype=torch.float64)
    k, v = torch.randn(2, 1, 40, 2, 16, dtype=torch.float64)
    slopes = grid.alibi_slopes(2).double()
    offset = k.shape[1] - q.shape[1]
    mask = create_block_mask(registry._mask_mod(offset, 5, 0), None, None, 24, 40, device="cpu")
    with warnings.catch_warnings():
        # Eager FlexAttention (no torch.compile) warns that it materialises the scores: fine at this size.
        warnings.simplefilter("ignore", UserWarning)
        out = flex_attention(
            *(t.transpose(1, 2) for t in (q, k, v)),
            score_mod=registry._score_mod(3.0, slopes, offset),
            block_mask=mask,
            scale=0.3,
        ).transpose(1, 2)
    expected, _ = attention(q, k, v, softmax_scale=0.3, window_size=(5, 0), softcap=3.0, alibi_slopes=slopes)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_options_run_writes_option_rows_and_prints_the_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--options", "--device", "cpu", "--out-dir", str(tmp_path)]) == 0
    header, rows = _rows(tmp_path / "bench_options.csv")
    assert tuple(header) == results.OPTION_COLUMNS
    ours = {
        (r["mode"], r["layout"], r["window_right"], r["softcap"], r["alibi"], r["dropout_p"], r["sink"]): r
        for r in rows
        if r["impl"] == "flashtile" and r["dtype"] != "fp8"
    }
    assert all(r["status"] == "ok" for r in ours.values()), [r["detail"] for r in ours.values()]
    # The float8 forward: flashtile alone, checked against its own roundings, no backward cell.
    fp8 = [r for r in rows if r["dtype"] == "fp8"]
    assert {(r["impl"], r["mode"], r["status"]) for r in fp8 if r["impl"] == "flashtile"} == {
        ("flashtile", "fwd", "ok")
    }
    assert all("checked on the last" in r["detail"] for r in fp8 if r["impl"] == "flashtile")
    assert {r["detail"] for r in fp8 if r["impl"] != "flashtile"} == {
        f"{name} does not implement fp8" for name in ("naive", "sdpa-math")
    }
    assert all("backend reference" in r["detail"] for r in ours.values())
    for mode in ("fwd", "bwd"):
        window = ours[(mode, "dense", "0", "0", "false", "0", "false")]
        assert (window["window_left"], window["causal"]) == ("16", "true")
        assert int(window["pairs"]) == 2 * 2 * grid.visible_pairs(64, 64, True, (16, 0))
        assert "checked on the last" in ours[(mode, "dense", "-1", "30", "false", "0", "false")]["detail"]
        assert "checked on the last" in ours[(mode, "dense", "-1", "0", "true", "0", "false")]["detail"]
        assert "not checked: dropout" in ours[(mode, "dense", "-1", "0", "false", "0.1", "false")]["detail"]
        sink = ours[(mode, "dense", "-1", "0", "false", "0", "true")]
        assert sink["causal"] == "true" and "checked on the last 4/4 sequences" in sink["detail"]
        assert ("dsink" in sink["detail"]) == (mode == "bwd"), "the sink's gradient checked in full"
        packed = ours[(mode, "varlen", "-1", "0", "false", "0", "false")]
        assert "checked on the last" in packed["detail"]
        assert sum(int(n) for n in packed["lengths"].split()) == 128
        assert ours[(mode, "padded", "-1", "0", "false", "0", "false")]["lengths"] == packed["lengths"]
    plain = [
        r
        for r in rows
        if r["layout"] == "dense"
        and r["window_right"] == "-1"
        and r["softcap"] == "0"
        and r["alibi"] == "false"
        and r["dropout_p"] == "0"
        and r["sink"] == "false"
        and r["dtype"] != "fp8"
    ]
    assert {r["impl"] for r in plain} == {"flashtile"}, "the plain yardsticks are flashtile's alone"
    peers = {(r["impl"], r["status"]) for r in rows if r["impl"] != "flashtile"}
    assert ("naive", "ok") in peers and ("sdpa-math", "ok") in peers
    sink_peers = {(r["impl"], r["status"], r["detail"]) for r in rows if r["sink"] == "true"}
    assert ("sdpa-math", "unsupported", "sdpa-math does not implement sink") in sink_peers
    assert {(i, s) for i, s, _ in sink_peers if i == "naive"} == {("naive", "ok")}
    printed = capsys.readouterr().out
    assert "options · flashtile TFLOP/s on visible pairs" in printed
    assert "padded to longest" in printed and "dense causal" in printed
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert {
        f"bench_options_{o}_{m}_fp32.png"
        for o in ("window", "softcap", "alibi", "dropout", "sink", "varlen")
        for m in ("fwd", "bwd")
    } | {"bench_options_fp8_fwd_bf16.png"} == pngs


def test_option_comparisons_pair_each_option_with_its_yardstick_and_peer() -> None:
    from flashtile.bench.timing import Timing

    plain = Config("cuda", "bf16", "fwd", True, 2, 16, 16, 8192, 8192, 128)
    window = dataclasses.replace(plain, window=(256, 0))
    packed = dataclasses.replace(plain, layout="varlen", batch=3, lengths=(8000, 6000, 2384))
    padded = dataclasses.replace(packed, layout="padded", seqlen_q=8000, seqlen_k=8000)

    def timed(config: Config, impl: str, ms: float) -> results.Result:
        return results.Result(config, impl, "ok", timing=Timing(ms, ms, ms, reps=1))

    found = [
        timed(plain, "flashtile", 10.0),
        timed(window, "flashtile", 0.5),
        timed(window, "flex", 1.0),
        timed(packed, "flashtile", 4.0),
        timed(padded, "flashtile", 6.0),
        # The packed batch's documents alone: 2 + 1.5 + 0.5 ms.
        *(
            timed(dataclasses.replace(plain, batch=1, seqlen_q=n, seqlen_k=n), "flashtile", ms)
            for n, ms in ((8000, 2.0), (6000, 1.5), (2384, 0.5))
        ),
    ]
    window_row, packed_row, alone_row, padded_row = bench.option_comparisons(found)
    assert alone_row.yardstick == "documents alone" and alone_row.speedup == 1.0
    # The same time; the dense cells count causal FLOPs as N²/2 (the paper grid's convention), the packed
    # one its visible pairs, N(N + 1)/2.
    assert alone_row.ratio == pytest.approx(1.0, rel=1e-3)
    assert window_row.speedup == 20.0 and window_row.peer == "flex" and window_row.peer_ratio == 2.0
    assert window_row.ratio == pytest.approx(20.0 * window.flops() / plain.flops())
    assert packed_row.yardstick == "dense causal" and packed_row.speedup == 2.5
    assert padded_row.yardstick == "padded to longest" and padded_row.speedup == 1.5
    assert padded_row.ratio == pytest.approx(1.5), "the same real-token FLOPs: the ratio is the speedup"


def test_a_packed_batchs_documents_alone_are_not_drawn_as_its_plain_kernel() -> None:
    """The varlen figure's dashed plain line is dense causal at the cells' lengths, not the documents timed
    alone (dense batches of one, one of them at the padded batch's length)."""
    from flashtile.bench import plots

    def row(batch: str, seqlen: str, lengths: str = "", series: str = "flashtile") -> dict[str, str]:
        common = {"dtype": "bf16", "mode": "fwd", "causal": "true"}
        return {**common, "batch": batch, "seqlen_q": seqlen, "lengths": lengths, "series": series}

    packed = row("3", "8192", "8000 6000 2384")
    padded = row("3", "8000", "8000 6000 2384", "flashtile padded")
    plain, alone = row("2", "8192"), row("1", "8000")
    figures = plots._options_beside_plain(
        {("varlen", "bf16", "fwd"): [packed, padded], ("", "bf16", "fwd"): [plain, alone]}
    )
    drawn = figures[("varlen", "bf16", "fwd")]
    assert [r["seqlen_q"] for r in drawn if r["series"] == "flashtile (no option)"] == ["8192"]


@pytest.mark.gpu
def test_options_preset_on_the_gpu_runs_and_checks_every_option(tmp_path: Path) -> None:
    fast = ["--warmup-ms", "1", "--rep-ms", "3", "--min-reps", "2", "--no-plot", "--out-dir", str(tmp_path)]
    peers = ["--peers", "flashtile", "flex", "sdpa-flash"]
    assert main(["bench", "--options", "--seqlen", "1k", *peers, *fast]) == 0
    _, rows = _rows(tmp_path / "bench_options.csv")
    status = {
        (r["impl"], r["mode"], r["layout"], r["window_left"], r["softcap"], r["alibi"], r["dropout_p"]): r
        for r in rows
    }
    # The packed batch's documents, each timed alone (flashtile's, a dense batch of one at its length).
    documents = set(next(r for r in rows if r["layout"] == "varlen")["lengths"].split())
    alone = [r for r in rows if r["layout"] == "dense" and r["batch"] == "1" and r["seqlen_q"] in documents]
    assert {r["impl"] for r in alone} == {"flashtile"} and len(alone) == 2 * len(documents)
    assert {r["seqlen_q"] for r in rows if r["layout"] == "dense" and r not in alone} == {"1024"}
    ours = [r for r in rows if r["impl"] == "flashtile"]
    # Nine cells a mode, the documents alone, and the fp8 cell, which is forward only.
    assert len(ours) == 2 * 9 + len(alone) + 1 and all(r["status"] == "ok" for r in ours), [
        r["detail"] for r in ours
    ]
    fp8 = [r for r in ours if r["dtype"] == "fp8"]
    assert [r["mode"] for r in fp8] == ["fwd"]
    # The router's choice for this GPU (hopper on sm_90, triton elsewhere), never the CPU reference; the fp8
    # cell names flashtile.fp8's kernel instead.
    gpu_backend = resolve(torch.device("cuda"))
    assert gpu_backend != "reference"
    assert all(f"backend {gpu_backend}" in r["detail"] for r in ours if r["dtype"] != "fp8")
    assert "float8 forward" in fp8[0]["detail"] and "float8 forward reference" not in fp8[0]["detail"]
    for mode in ("fwd", "bwd"):
        for option in (("256", "0", "false", "0"), ("-1", "30", "false", "0"), ("-1", "0", "true", "0")):
            flex = status[("flex", mode, "dense", *option)]
            assert flex["status"] == "ok", flex["detail"]
        flex_sink = [r for r in rows if (r["impl"], r["mode"], r["sink"]) == ("flex", mode, "true")]
        assert [r["status"] for r in flex_sink] == ["ok"], [r["detail"] for r in flex_sink]
        dropout = status[("sdpa-flash", mode, "dense", "-1", "0", "false", "0.1")]
        assert dropout["status"] == "ok" and "not checked: dropout" in dropout["detail"]


@pytest.mark.gpu
def test_head_dims_preset_on_the_gpu_runs_every_pair(tmp_path: Path) -> None:
    fast = ["--warmup-ms", "1", "--rep-ms", "3", "--min-reps", "2", "--out-dir", str(tmp_path)]
    peers = ["--peers", "flashtile", "flex", "sdpa-efficient"]
    assert main(["bench", "--head-dims", "--quick", "--seqlen", "1k", *peers, *fast]) == 0
    header, rows = _rows(tmp_path / "bench_head_dims.csv")
    assert tuple(header) == results.HEAD_DIM_COLUMNS
    ours = {
        (r["head_dim"], r["head_dim_v"], r["causal"], r["mode"]): r for r in rows if r["impl"] == "flashtile"
    }
    assert len(ours) == 5 * 2 * 2
    for r in ours.values():
        assert r["status"] == "ok" and float(r["tflops"]) > 0, r["detail"]
    flex = [r for r in rows if r["impl"] == "flex" and (r["head_dim"], r["head_dim_v"]) == ("192", "128")]
    assert flex and all(r["status"] == "ok" for r in flex), [r["detail"] for r in flex]
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert pngs == {"bench_head_dims_fwd_bf16.png", "bench_head_dims_bwd_bf16.png"}


def test_options_named_on_the_command_line_are_the_only_ones_run(tmp_path: Path) -> None:
    """``--options varlen softcap`` keeps those two options' cells (and the plain cells they are compared
    with); a name outside the preset is refused by argparse."""
    argv = ["bench", "--options", "varlen", "softcap", "--device", "cpu", "--mode", "fwd"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 0
    _, rows = _rows(tmp_path / "bench_options.csv")
    ours = [r for r in rows if r["impl"] == "flashtile"]
    assert {r["layout"] for r in ours} == {"dense", "varlen", "padded"}
    assert {r["softcap"] for r in ours} == {"0", "30"}
    assert all(r["window_left"] == "-1" for r in ours)
    assert not any(r["alibi"] == "true" or r["dropout_p"] != "0" or r["sink"] == "true" for r in ours)
    assert main(["bench", "--options", "nonsense", "--device", "cpu"]) == 2


def test_decode_summary_checks_each_target_on_its_cells() -> None:
    from flashtile.bench.decode import PAIRED_CONTIGUOUS, summary

    def row(impl: str, batch: int, cache: int, page: int, us: float, of_copy: float = 0.5) -> dict[str, str]:
        shape = dict(batch=str(batch), heads_kv="8", seqlen_q="1", cache_len=str(cache))
        page_size = str(page) if page else ""
        return dict(
            impl=impl, **shape, page_size=page_size, p50_us=str(us), of_copy=str(of_copy), status="ok"
        )

    rows = [
        # batch 1: one cell faster than cuDNN, one slower; a 1k cache is below the target's range.
        row("flashtile", 1, 4096, 0, 10.0), row("sdpa_cudnn", 1, 4096, 0, 11.0),
        row("flashtile", 1, 16384, 0, 20.0), row("sdpa_cudnn", 1, 16384, 0, 19.0),
        row("flashtile", 1, 1024, 0, 5.0), row("sdpa_cudnn", 1, 1024, 0, 4.0),
        # paged: 4 % slower than the contiguous cell, 8 % slower than its paired contiguous timing; pages
        # of 16 are outside the target.
        row("flashtile", 1, 4096, 64, 10.4), row(PAIRED_CONTIGUOUS, 1, 4096, 64, 9.6),
        row("flashtile", 1, 4096, 16, 30.0),
        # batch 16 at 16k: one cell over 90 % of the copy bandwidth, one under; at 4k it is not counted.
        row("flashtile", 16, 16384, 0, 100.0, 1.2), row("flashtile", 16, 16384, 256, 100.0, 0.8),
        row("flashtile", 16, 4096, 0, 100.0, 0.1),
        {**row("flashtile", 64, 16384, 0, 1.0), "status": "error"},
    ]  # fmt: skip
    copy, batch_one, across, paired = summary(rows)
    assert copy.endswith("1 of 2 cells (worst 0.800, B=16 L=16k G=4 Nq=1 page 256)")
    assert batch_one.endswith("1 of 2 cells (worst 0.950, B=1 L=16k G=4 Nq=1)")
    assert across.endswith("2 of 2 cells (worst 0.962, B=1 L=4k G=4 Nq=1 page 64)")
    assert paired.endswith("0 of 1 cells (worst 0.923, B=1 L=4k G=4 Nq=1 page 64)")
    assert summary([])[0].endswith("no cells")


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``argv``, assert it failed without a traceback, and return its one-line message."""
    status = main(argv)
    err = capsys.readouterr().err
    assert status != 0, argv
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_bad_out_dir_or_csv_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    measured = []
    monkeypatch.setattr(bench._Runner, "run_configuration", lambda self, group: measured.append(group) or [])
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "bench.csv").write_text("a,b\n1,2\n")
    (tmp_path / "folder.csv").mkdir()
    refusals = {
        ("--out-dir", str(a_file)): "is a file, not a folder",
        ("--out-dir", str(a_file / "sub")): "is a file, not a folder",
        ("--out-dir", str(foreign)): "has columns ['a', 'b']",
        ("--out-dir", str(tmp_path), "--name", "folder"): "is a folder, not a results CSV",
    }
    for extra, message in refusals.items():
        line = _usage_error([*TINY, *extra], capsys)
        assert line.startswith("flashtile bench: ") and message in line, line
    assert not measured
    memory = ["memory", "--device", "cpu", "--min-seqlen", "32", "--max-seqlen", "32", "--impls", "naive"]
    others = {
        ("roofline", "--measure", "--device", "cpu", "--out-dir", str(a_file)): "is a file, not a folder",
        (*memory, "--out-dir", str(foreign), "--name", "bench"): "has columns ['a', 'b']",
    }
    for argv, message in others.items():
        assert message in _usage_error(list(argv), capsys), argv


def test_plot_only_on_odd_csvs_says_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flashtile.bench.plots import plot_results

    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text(",".join(results.COLUMNS) + "\n")
    (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
    for name in ("empty", "header"):
        assert "no rows in" in _usage_error(
            ["bench", "--plot-only", "--out-dir", str(tmp_path), "--name", name], capsys
        )
        assert plot_results(tmp_path / f"{name}.csv", tmp_path) == []
    line = _usage_error(["bench", "--plot-only", "--out-dir", str(tmp_path), "--name", "foreign"], capsys)
    assert "not a results CSV" in line and "date" not in line.split(":")[0]
    with pytest.raises(ValueError, match="not a results CSV"):
        plot_results(tmp_path / "foreign.csv", tmp_path)
    # A run whose every row failed: its table, and no plot, said so.
    args = [*TINY, "--seqlen", "32", "--mode", "fwd", "--causal", "false", "--peers", "naive", "--no-plot"]
    assert main([*args, "--out-dir", str(tmp_path)]) == 0
    header, rows = _rows(tmp_path / "bench.csv")
    with (tmp_path / "failed.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows({**r, "status": "error", "p50_ms": "", "tflops": "", "detail": "boom"} for r in rows)
    capsys.readouterr()
    assert main(["bench", "--plot-only", "--out-dir", str(tmp_path), "--name", "failed"]) == 0
    assert "no plot: the run of" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))
    # One implementation alone is drawn.
    assert main(["bench", "--plot-only", "--out-dir", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.glob("*.png")] == ["bench_fwd_fp32.png"]


def test_bad_values_get_one_line_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out-dir", str(tmp_path)]
    refusals = {
        ("bench", "--seqlen", "0"): "sequence length must be positive",
        ("bench", "--seqlen", "4q"): "not a length such as 512, 4k or 16k",
        ("bench", "--time-budget", "0"): "--time-budget must be positive",
        ("bench", "--warmup-ms", "-1"): "--warmup-ms must be at least 0",
        ("check", "--device", "nonsense"): "--device nonsense: choose auto, cpu, cuda",
        ("roofline", "--seqlen", "0"): "argument --seqlen: must be at least 1, got 0",
        ("roofline", "--block-m", "x"): "argument --block-m: 'x' is not an integer",
        ("memory", "--min-seqlen", "0"): "argument --min-seqlen: must be at least 1, got 0",
        ("memory", "--heads", "-2"): "argument --heads: must be at least 1, got -2",
        ("memory", "--device", "meta"): "--device meta: choose auto, cpu, cuda",
    }
    for argv, message in refusals.items():
        extra = out if argv[0] != "check" else []
        assert message in _usage_error([*argv, *extra], capsys), argv
    if not torch.cuda.is_available():
        for command in (["check"], ["roofline", "--measure"], ["memory"]):
            line = _usage_error(
                [*command, "--device", "cuda", *(out if command != ["check"] else [])], capsys
            )
            assert "--device cuda: torch sees no CUDA device" in line, command


def test_decode_plot_only_measures_nothing_and_needs_no_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashtile.bench import decode

    monkeypatch.setattr(decode, "measure", lambda *a, **k: pytest.fail("--plot-only measured"))
    assert "no results in" in _usage_error(
        ["bench", "--decode", "--plot-only", "--out-dir", str(tmp_path)], capsys
    )
    env = results.environment(torch.device("cpu"))
    shape = dict(batch="1", heads=str(decode.HEADS), heads_kv=str(decode.HEADS // 4), seqlen_q="1")
    rows = [
        {**dataclasses.asdict(env), **shape, "impl": impl, "cache_len": str(cache), "page_size": "",
         "head_dim": "128", "dtype": "bf16", "p50_us": "10", "tb_per_s": "1.5", "copy_tb_per_s": "3",
         "of_copy": "0.5", "status": "ok", "detail": ""}
        for impl in ("flashtile", "sdpa_cudnn") for cache in (1024, 4096)
    ]  # fmt: skip
    results.append_rows(tmp_path / "bench_decode.csv", rows, decode.COLUMNS)
    assert main(["bench", "--decode", "--plot-only", "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "≥ 1.0× SDPA cuDNN" in printed and "plot:" in printed
    assert (tmp_path / "bench_decode.png").exists()
