"""flashtile._environ.Knob reads what os.environ.get reads, through every way a test or user changes it."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from flashtile._environ import Knob

NAME = "FLASHTILE_TEST_KNOB"


@pytest.mark.parametrize("value", ["1", "", " 0 ", "é-ü"])
def test_knob_follows_os_environ(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    knob = Knob(NAME)
    monkeypatch.delenv(NAME, raising=False)
    assert knob.get() is None and knob.get("default") == "default"
    monkeypatch.setenv(NAME, value)
    assert knob.get() == os.environ.get(NAME) == value
    assert knob.get("default") == value
    with mock.patch.dict(os.environ, {NAME: "patched"}):
        assert knob.get() == "patched"
    assert knob.get() == value
    del os.environ[NAME]
    assert knob.get() is None
