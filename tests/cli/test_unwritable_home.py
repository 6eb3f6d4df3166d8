"""A SpecPilot home (or --out) that cannot be written — a read-only mount, another user's directory —
ends `bench`, `run` and `evaluate` with one `error:` line naming it and exit 2, before any model is
loaded; an OSError of that kind raised anywhere else in a command is shown the same way.

Tests run as root, which chmod does not stop: `read_only` makes the calls that create directories
and files under a folder (and SQLite's open of a database there) fail as the kernel would.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest

from specpilot.cli import execute, main
from specpilot.engine.session import Session


def read_only(monkeypatch, root: Path, code: int) -> None:
    """Creating a directory or a file under `root`, or opening a SQLite database there, fails with `code`."""
    root = root.absolute()

    def under(path) -> bool:
        return Path(os.fsdecode(path)).absolute().is_relative_to(root)

    def refuse(path):
        raise OSError(code, os.strerror(code), os.fsdecode(path))

    real_mkdir, real_open, real_connect = os.mkdir, os.open, sqlite3.connect

    def mkdir(path, *args, **kwargs):
        return refuse(path) if under(path) else real_mkdir(path, *args, **kwargs)

    def open_(path, flags, *args, **kwargs):
        writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        return refuse(path) if writes and under(path) else real_open(path, flags, *args, **kwargs)

    def connect(database, *args, **kwargs):
        if under(database):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(sqlite3, "connect", connect)


@pytest.fixture
def no_loading(monkeypatch):
    def load(cls, *args, **kwargs):
        pytest.fail("a model was loaded before the home was found unwritable")

    monkeypatch.setattr(Session, "load", classmethod(load))


COMMANDS = {
    "bench": ["bench", "--device", "cpu", "--n-prompts", "1", "--max-new-tokens", "2", "--no-progress"],
    "run": ["run", "--devices", "cpu", "--rounds", "1", "--quiet", "--no-final"],
    "evaluate": ["evaluate", "--candidate", "stock", "--devices", "cpu"],
}


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    (line,) = [x for x in stderr.splitlines() if x.startswith("error:")]
    assert stderr.strip().endswith(line)
    return line


@pytest.mark.parametrize("code, exists", [(errno.EROFS, True), (errno.EACCES, False)], ids=["read-only", "denied"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unwritable_home_is_one_error_line(command, code, exists, tmp_path, monkeypatch, capsys, no_loading):
    """A read-only home that exists (EROFS), or one that cannot be created in its parent (EACCES)."""
    home = tmp_path / "ro" / "home"
    (home if exists else home.parent).mkdir(parents=True)
    monkeypatch.setenv("SPECPILOT_HOME", str(home))
    monkeypatch.delenv("SPECPILOT_MEMORY", raising=False)
    read_only(monkeypatch, tmp_path / "ro", code)
    assert main(COMMANDS[command]) == 2
    line = one_error_line(capsys.readouterr().err)
    words = "read-only file system" if code == errno.EROFS else "permission denied"
    assert line.startswith("error: cannot write ") and str(home) in line and words in line


def test_an_unwritable_out_of_a_run_is_one_error_line(tmp_path, monkeypatch, capsys, no_loading):
    """The home takes files, --out does not: the loop's own mkdir fails, and the CLI names it."""
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECPILOT_MEMORY", raising=False)
    (tmp_path / "ro").mkdir()
    read_only(monkeypatch, tmp_path / "ro", errno.EACCES)
    out = tmp_path / "ro" / "run"
    assert main([*COMMANDS["run"], "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot write {out}: permission denied")


def test_a_storage_oserror_anywhere_is_one_line_and_a_bug_keeps_its_traceback(capsys):
    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/home/runs/loop/x/report.md")

    assert execute(full, None) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: cannot write /data/home/runs/loop/x/report.md: no space left on device; free some space there, "
        "or point SPECPILOT_HOME (or --out, --memory) elsewhere")
    for bug in (PermissionError(errno.EPERM, "Operation not permitted"),  # no file named: os.kill, not storage
                FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")):
        def raising(args, bug=bug):
            raise bug

        with pytest.raises(type(bug)):
            execute(raising, None)
