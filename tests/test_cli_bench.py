"""The ``flashtile`` console script and ``flashtile bench`` on tiny CPU grids, run in-process."""

from __future__ import annotations

import csv
import dataclasses
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import flashtile.bench.peers as registry
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


def test_decode_says_not_yet_available(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--decode"]) == 2
    assert "not yet available: decoding lands in a later issue" in capsys.readouterr().err


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
