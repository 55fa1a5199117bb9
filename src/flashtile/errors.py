"""flashtile's exception classes.

flash_attn reports bad arguments from C++ as RuntimeError; flashtile raises the Python class that describes
the problem (ValueError, TypeError) and makes it a RuntimeError as well, so ``except RuntimeError`` written
against flash_attn still catches it. NotImplementedError, for options not implemented yet, already derives
from RuntimeError.
"""

from __future__ import annotations


class FlashtileValueError(ValueError, RuntimeError):
    """A wrong shape or value (ValueError), also a RuntimeError like flash_attn's checks."""


class FlashtileTypeError(TypeError, RuntimeError):
    """A wrong type or dtype (TypeError), also a RuntimeError like flash_attn's checks."""
