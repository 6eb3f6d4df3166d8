"""The `specpilot` command. Each command lives in a module of this package (`run.py`, `generate.py`,
`bench.py`, `guard.py`, `evaluate.py`, `memory.py`, `w12.py`, `fp8.py`) with a one-line `HELP` and a
`register(subparsers)`; this module only dispatches.

Only the command being run registers its flags; the others are listed by their `HELP`, so
`specpilot --help` and `specpilot memory list` import neither torch nor the models (the command
modules import heavy code inside their functions). A `SpecPilotError` is printed as one
`error: ...` line with its exit code (2 for bad input); so is an OSError that says a named file
could not be written (permission, read-only file system, full disk: `errors.storage_error`),
wherever it was raised; Ctrl-C exits 130 (`interrupted`); a `Notice` warning is printed as one
`note: ...` line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from typing import Iterable

from specpilot import __version__
from specpilot.errors import Notice, SpecPilotError, storage_error

# the commands, in the order `--help` lists them; the module of each is specpilot.cli.<name>
COMMANDS = ("run", "generate", "bench", "guard", "evaluate", "memory", "w12", "fp8")

INTERRUPTED = 130  # exit status after Ctrl-C, for every command (128 + SIGINT)


def build_parser(full: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser; commands in `full` (None: all) get their flags, the others only their help line."""
    parser = argparse.ArgumentParser(
        prog="specpilot",
        description="Find, validate and keep lossless speculative-decoding speedups per deployment.",
    )
    parser.add_argument("--version", action="version", version=f"specpilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    full = set(COMMANDS if full is None else full)
    for name in COMMANDS:
        module = importlib.import_module(f"specpilot.cli.{name}")
        if name in full:
            module.register(sub)
        else:
            sub.add_parser(name, help=module.HELP)
    return parser


def chosen_command(argv: list[str]) -> str | None:
    """The command named on the line (the first word that is not an option), if it is one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    """The `specpilot` entry point: parse `argv` (default: the command line), run, return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = chosen_command(argv)
    parser = build_parser([command] if command else [])
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return execute(args.func, args)


def execute(func, args: argparse.Namespace) -> int:
    """`func(args)`'s exit status, with errors, Ctrl-C and notices shown the command line's way."""
    with warnings.catch_warnings():
        show = warnings.showwarning

        def one_line_notice(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, Notice):
                print(f"note: {message}", file=sys.stderr if file is None else file)
            else:
                show(message, category, filename, lineno, file, line)

        warnings.simplefilter("default", Notice)
        warnings.showwarning = one_line_notice
        try:
            return int(func(args) or 0)
        except SpecPilotError as err:
            print(f"error: {err}", file=sys.stderr)
            return err.exit_code
        except OSError as err:  # a write no command wrapped: only an unwritable or full location is not a bug
            storage = storage_error(err)
            if storage is None:
                raise
            print(f"error: {storage}", file=sys.stderr)
            return storage.exit_code
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
