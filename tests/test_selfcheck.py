"""The self-check passes on this machine and prints its table; its CLI returns the verdict as exit status."""

from __future__ import annotations

import os

import pytest
from rich.console import Console

from flashtile import selfcheck
from flashtile.cli import main
from flashtile.reference.compare import Comparison


def _console() -> Console:
    return Console(record=True, width=160, force_terminal=False)


def test_run_passes_and_prints_the_table() -> None:
    console = _console()
    assert selfcheck.run(device="cpu", console=console) is True
    text = console.export_text()
    for header in ("backend", "dtype", "case", "out", "lse", "dq", "dk", "dv", "margin", "result"):
        assert header in text
    assert "reference" in text and "sdpa*" in text
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert "triton" in text.split("backends:")[1].splitlines()[0]
    assert "FAIL" not in text and "Error:" not in text
    assert "flashtile checks passed" in text


def test_every_backend_dtype_and_case_is_graded() -> None:
    rows = selfcheck.check_backends(selfcheck._default_device(), selfcheck.SMALL_CASES)
    graded = {(row.implementation, row.dtype, row.case) for row in rows if row.counts}
    backends = selfcheck._backend.available_backends(selfcheck._default_device())
    expected = {
        (backend, dtype, case)
        for backend in backends
        for dtype in selfcheck.validation.supported_dtypes(backend, selfcheck._default_device())
        if dtype in selfcheck._DTYPES
        for case in selfcheck.SMALL_CASES
    }
    assert graded == expected
    assert all(set(row.results) == {"out", "lse", "dq", "dk", "dv"} for row in rows if row.counts)
    assert any(case.has_masked_rows for case in selfcheck.SMALL_CASES)
    assert any(case.nheads_kv == 1 for case in selfcheck.SMALL_CASES)


def test_a_failing_backend_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **options):
        raise RuntimeError("boom")

    monkeypatch.setattr("flashtile.reference.tiled.attention_fwd", broken)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    console = _console()
    assert selfcheck.run(device="cpu", console=console) is False
    text = console.export_text()
    assert "RuntimeError: boom" in text and "failed" in text


def test_a_wrong_result_is_a_failure() -> None:
    row = selfcheck.Row(
        "reference",
        selfcheck._DTYPES[0],
        selfcheck.SMALL_CASES[0],
        {"out": Comparison("out", 1.0, 1e-3, 1.0, (0, 0, 0, 0), 2e-3, 0)},
        counts=True,
    )
    assert not row.passed and row.margin == pytest.approx(500.0)


def test_main_exit_status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert main(["check", "--device", "cpu"]) == 0
    assert "flashtile self-check on cpu" in capsys.readouterr().out
