"""scripts/sanitize_kernels.py's command line: ``--repeat`` runs each selected case that many times (the
second call of a signature relaunches directly, which the sanitizer must see too) and rejects less than
one."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "sanitize_kernels.py"


@pytest.fixture
def sanitize(monkeypatch: pytest.MonkeyPatch):
    """The script as a module (scripts/ is not a package; its dataclasses need it in sys.modules). Its
    dry run sets FLASHTILE_BACKEND=reference: restored after the test."""
    monkeypatch.setenv("FLASHTILE_BACKEND", os.environ.get("FLASHTILE_BACKEND", "auto"))
    spec = importlib.util.spec_from_file_location("sanitize_kernels_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


class _Case:
    def __init__(self, label: str, calls: list[str]) -> None:
        self.label, self._calls = label, calls

    def run(self) -> None:
        self._calls.append(self.label)


@pytest.mark.parametrize("repeat", [1, 3])
def test_repeat_runs_each_case_that_many_times(sanitize, monkeypatch, repeat: int) -> None:
    calls: list[str] = []
    cases = [_Case("first", calls), _Case("second", calls)]
    monkeypatch.setitem(sanitize.BUILDERS, "portable", lambda: cases)
    argv = ["sanitize_kernels.py", "--dry-run", "--only", "portable", "--repeat", str(repeat)]
    monkeypatch.setattr(sys, "argv", argv)
    assert sanitize.main() == 0
    assert calls == ["first"] * repeat + ["second"] * repeat


def test_repeat_below_one_is_an_error(sanitize, monkeypatch) -> None:
    argv = ["sanitize_kernels.py", "--dry-run", "--only", "portable", "--repeat", "0"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="--repeat must be at least 1, got 0"):
        sanitize.main()
