"""Makes this folder's helper modules importable by name (pytest runs with --import-mode=importlib),
and isolates every test's SpecPilot home (memory, runs, scratch) in a temporary directory."""

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECPILOT_MEMORY", raising=False)
    monkeypatch.delenv("SPECPILOT_CODING_AGENT", raising=False)
    return tmp_path / "home"
