"""The ``flashtile`` console script: ``check``, ``bench``, ``roofline`` and ``memory``.

Each sub-command's module exposes ``add_parser(subparsers)``, which registers it with
``set_defaults(func=...)``; ``func(args)`` returns the exit status: 0, 1 when flashtile failed (a check or
a measurement), 2 for a usage error, as argparse (a flag value found bad after parsing prints one line,
``flashtile COMMAND: message``). The command line draws tables with rich and plots with matplotlib, which
the ``cli`` extra installs (``pip install 'flashtile[cli]'``); the library itself needs neither, so they are
imported only here, after checking that they are there.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "check": "flashtile.selfcheck",
    "bench": "flashtile.bench.bench",
    "roofline": "flashtile.bench.roofline",
    "memory": "flashtile.bench.memory",
}
CLI_EXTRA = ("rich", "matplotlib")


def missing_extra() -> str | None:
    """Why the command line cannot run (a package of the ``cli`` extra is missing), or None."""
    for name in CLI_EXTRA:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return (
                f"flashtile: the command line needs {' and '.join(CLI_EXTRA)}, which the 'cli' extra "
                f"installs: pip install 'flashtile[cli]' ({type(exc).__name__}: {exc})"
            )
    return None


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="flashtile",
        description="FlashAttention in Python: self-check, benchmarks, roofline and memory reports.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the sub-command; returns the exit status."""
    if (reason := missing_extra()) is not None:
        print(reason, file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        status = args.func(args)
    except SystemExit as exc:
        # argparse exits on --help and bad flags; the caller gets the status instead.
        status = exc.code
    if status is None:
        return 0
    if isinstance(status, str):
        print(status, file=sys.stderr)
    return status if isinstance(status, int) else 1


if __name__ == "__main__":
    raise SystemExit(main())
