"""``multidraft`` command line: one module per subcommand family.

Each module in ``COMMANDS`` exposes ``register(subparsers)``, which adds its subcommands
and sets ``func`` on them (``func(args) -> int``). User mistakes (``ValueError``,
``FileNotFoundError``) print one clear line on stderr and exit 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand modules, in help order
COMMANDS: list[str] = ["compare", "bound", "experiment", "report", "decode", "demo"]


class UserError(Exception):
    """A mistake in the user's input; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="multidraft",
        description="Multi-draft speculative decoding: lossless verifiers, optimal acceptance, end-to-end decoding.",
    )
    parser.add_argument("--version", action="version", version=f"multidraft {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, FileNotFoundError, NotADirectoryError) as exc:
        print(f"multidraft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("multidraft: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
