"""The ``flashtile`` console script: ``check``, ``bench``, ``roofline`` and ``memory``.

Each sub-command's module exposes ``add_parser(subparsers)``, which registers it with
``set_defaults(func=...)``; ``func(args)`` returns the exit status. ``check`` hands its arguments to
``flashtile.selfcheck.main`` unparsed, so that ``flashtile check --help`` shows the self-check's options.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

_CHECK_HELP = "check that flashtile computes attention correctly on this machine"
_OPTIONAL = {
    "roofline": "where flashtile stands against this machine's compute and bandwidth ceilings",
    "memory": "peak memory of forward and backward against the sequence length",
}


def _add_missing(subparsers: argparse._SubParsersAction, name: str, summary: str, exc: Exception) -> None:
    """Keep a sub-command whose module cannot be imported visible, failing with the reason when run."""
    reason = f"flashtile {name} is not available: {type(exc).__name__}: {exc}"
    parser = subparsers.add_parser(name, help=f"{summary} (not available)", description=reason)
    parser.set_defaults(func=lambda args: _fail(reason))


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="flashtile",
        description="FlashAttention in Python: self-check, benchmarks, roofline and memory reports.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="{check,bench,roofline,memory}", required=True)
    subparsers.add_parser("check", help=_CHECK_HELP, add_help=False)

    from flashtile.bench import bench

    bench.add_parser(subparsers)
    for name, summary in _OPTIONAL.items():
        try:
            module = importlib.import_module(f"flashtile.bench.{name}")
            module.add_parser(subparsers)
        except (ImportError, AttributeError) as exc:
            _add_missing(subparsers, name, summary, exc)
    return parser


def _check(argv: list[str]) -> int:
    try:
        from flashtile.selfcheck import main as selfcheck_main
    except ImportError as exc:
        if {"-h", "--help"} & set(argv):
            print(
                f"usage: flashtile check [...]\n\n{_CHECK_HELP}.\n(flashtile.selfcheck is unavailable: {exc})"
            )
            return 0
        return _fail(f"flashtile check is not available: {type(exc).__name__}: {exc}")
    return _exit_status(selfcheck_main, argv)


def _exit_status(func: object, *args: object) -> int:
    """Run ``func(*args)`` as a command: argparse's SystemExit (``--help``, bad flags) becomes the status."""
    try:
        status = func(*args)
    except SystemExit as exc:
        status = exc.code
    if status is None:
        return 0
    return status if isinstance(status, int) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the sub-command; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "check":
        return _check(args_list[1:])
    try:
        args = build_parser().parse_args(args_list)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return _exit_status(args.func, args)


if __name__ == "__main__":
    raise SystemExit(main())
