"""Environment variables read on every call, cheaply.

``os.environ.get`` encodes the name and goes through the Mapping machinery at each call (≈ 0.7 µs on this
project's CPU machine, several on a GPU's host), and a plain call's host path reads a few knobs. On POSIX,
CPython keeps ``os.environ``'s own bytes mapping in step with every change made through ``os.environ``
(``putenv`` alone changes neither), so a lookup there with the name encoded once gives the same answer.
"""

from __future__ import annotations

import os

# os.environ's mapping of encoded names to encoded values, where this Python has one (CPython on POSIX).
_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


class Knob:
    """One environment variable: :meth:`get` is ``os.environ.get(name, default)``."""

    __slots__ = ("_key", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._key = os.fsencode(name)

    def get(self, default: str | None = None) -> str | None:
        """The variable's value, or ``default`` when it is not set."""
        if _DATA is None:
            return os.environ.get(self.name, default)
        value = _DATA.get(self._key)
        return default if value is None else os.fsdecode(value)
