"""`errors.storage_error` / `errors.writing`: an unwritable or full location becomes one `StorageError`
line naming it; every other error passes through unchanged (a bug keeps its traceback)."""

import errno
import sqlite3

import pytest

from specpilot.errors import StorageError, storage_error, writing


@pytest.mark.parametrize("code, words", [(errno.EACCES, "permission denied"), (errno.EROFS, "read-only file system"),
                                         (errno.ENOSPC, "no space left on device")])
def test_an_unwritable_or_full_location_is_named(code, words):
    err = storage_error(OSError(code, "os text", "/data/home/runs/x"))
    assert isinstance(err, StorageError) and err.exit_code == 2
    assert str(err).startswith(f"cannot write /data/home/runs/x: {words}; ")
    assert ("free some space" in str(err)) == (code == errno.ENOSPC)
    named = storage_error(OSError(code, "os text", "/data/home/.tmp123"), "/data/home/results.json", "the results")
    assert str(named).startswith("cannot write the results /data/home/results.json: ")


@pytest.mark.parametrize("message", ["attempt to write a readonly database", "unable to open database file",
                                     "database or disk is full"])
def test_sqlite_says_the_same_in_its_words(message):
    err = storage_error(sqlite3.OperationalError(message), "/h/memory.sqlite", "the memory database")
    assert str(err).startswith(f"cannot write the memory database /h/memory.sqlite: {message}; ")


@pytest.mark.parametrize("err", [OSError(errno.ENOENT, "missing", "/x"), PermissionError(errno.EPERM, "kill"),
                                 sqlite3.OperationalError("no such table: t"), ValueError("bug"),
                                 sqlite3.OperationalError("attempt to write a readonly database")])
def test_anything_else_is_not_translated(err):
    """A missing file, a signal to another user's process (no file named), a bad query, a bug, and
    a SQLite error without the database's path are no storage errors."""
    assert storage_error(err) is None


def test_writing_translates_only_storage_errors(tmp_path):
    with pytest.raises(StorageError, match="cannot write the lock /x/y.lock: read-only file system"):
        with writing("/x/y.lock", "the lock"):
            raise OSError(errno.EROFS, "Read-only file system", "/x")
    for bug in (KeyError("k"), FileNotFoundError(errno.ENOENT, "missing", "/x")):
        with pytest.raises(type(bug)):
            with writing(tmp_path):
                raise bug
