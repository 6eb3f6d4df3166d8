"""`specpilot --help` and `specpilot memory list` start without importing torch (or the models):
only the command being run registers its flags, and the command modules import lazily."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "triton", "transformers", "matplotlib", "scipy")

PROBE = """
import json, sys
from specpilot.cli import main
try:
    code = main({argv!r})
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def probe(argv: list[str], home) -> dict:
    env = dict(os.environ, SPECPILOT_HOME=str(home))
    env.pop("SPECPILOT_MEMORY", None)
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], [], ["memory", "list"], ["memory", "list", "--json"]])
def test_help_and_memory_list_import_no_torch(argv, tmp_path):
    result = probe(argv, tmp_path)
    assert result["heavy"] == []
    # no database yet: one `error:` line and exit 2, still without torch
    assert result["code"] == (2 if argv and argv[0] == "memory" else 0)


def test_memory_list_of_an_empty_database_imports_no_torch(tmp_path):
    from specpilot.memory.store import Memory

    Memory(tmp_path / "memory.sqlite").close()
    assert probe(["memory", "list"], tmp_path) == {"code": 0, "heavy": []}


def test_every_command_registers_its_flags_in_full():
    """`build_parser()` (all commands in full) still works, and each command's --help is the full one."""
    from specpilot.cli import COMMANDS, build_parser

    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "x", "--device", "cpu"])
    assert args.func.__name__ == "run_generate" and args.device == "cpu"
    light = build_parser([])
    for name in COMMANDS:
        assert name in light.format_help()
