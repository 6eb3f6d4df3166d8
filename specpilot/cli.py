"""The `specpilot` command. Each area registers its own subcommands; this module only dispatches.

Subcommands: generate, bench, guard, evaluate, memory, run, w12. A `SpecPilotError` is printed as
one `error: ...` line with its exit code (2 for bad input); anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specpilot import __version__
from specpilot.errors import SpecPilotError

# module with register(subparsers), in the order `--help` lists them
SUBCOMMAND_MODULES = (
    "specpilot.loop.cli",
    "specpilot.engine.cli",
    "specpilot.bench.cli",
    "specpilot.guard.cli",
    "specpilot.control.cli",
    "specpilot.memory.cli",
    "specpilot.w12.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specpilot",
        description="Find, validate and keep lossless speculative-decoding speedups per deployment.",
    )
    parser.add_argument("--version", action="version", version=f"specpilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name and name.startswith(err.name):
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except SpecPilotError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
