"""User-facing errors.

`SpecPilotError` carries one line that names the problem (a missing file, a corrupt checkpoint,
an impossible config). The CLI prints it as `error: <line>` and exits with its code; library
callers catch it like any exception. Internal bugs stay ordinary exceptions with tracebacks.

`StorageError` is the one failure of the machine rather than of the input: a place SpecPilot must
write (its home, `--out`, the memory database) is not writable or is full. `writing(path)` turns
exactly those failures (an OSError of `STORAGE_ERRNOS`, SQLite's read-only / cannot-open / full
errors) into one; any other exception passes through unchanged.
"""

from __future__ import annotations

import errno
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class SpecPilotError(Exception):
    """A problem with the user's input, reported as one line."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class CheckpointError(SpecPilotError):
    """A checkpoint directory is missing, incomplete, corrupt or unsupported."""


class ConfigError(SpecPilotError):
    """A deployment, system or CLI setting is impossible."""


class Notice(UserWarning):
    """Not an error: something the user should know (e.g. a slow path taken on this machine), issued
    with `warnings.warn(..., Notice)`; the CLI prints it as one `note: ...` line on stderr."""


class StorageError(SpecPilotError):
    """A file or directory SpecPilot must write cannot be written: no permission, a read-only file
    system, a full disk. What was written before stays as it was."""


# what the operating system says when a location cannot take a write, as the error line words it
STORAGE_ERRNOS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                  errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on device",
                  errno.EDQUOT: "disk quota exceeded"}
FULL = (errno.ENOSPC, errno.EDQUOT)
# SQLite's messages for the same (result codes READONLY, CANTOPEN, FULL, PERM)
SQLITE_STORAGE = ("readonly database", "unable to open database", "database or disk is full",
                  "access permission denied")


def storage_error(err: BaseException, path: str | Path | None = None, what: str = "") -> StorageError | None:
    """`err` as a one-line `StorageError` naming `what` and `path` (default: the file the OSError
    names) when it says that location cannot be written or is full; None for any other error, and
    for an OSError that names no file (a signal to another user's process is not about storage)."""
    if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
        where = path if path is not None else err.filename
        if where is None:
            return None
        why, full = STORAGE_ERRNOS[err.errno], err.errno in FULL
    elif isinstance(err, sqlite3.OperationalError) and any(m in str(err).lower() for m in SQLITE_STORAGE):
        if path is None:
            return None
        where, why, full = path, str(err), "full" in str(err).lower()
    else:
        return None
    fix = "free some space there" if full else "make it writable"
    fix += ", or point SPECPILOT_HOME (or --out, --memory) elsewhere"
    return StorageError(f"cannot write {what + ' ' if what else ''}{where}: {why}; {fix}")


@contextmanager
def writing(path: str | Path, what: str = "") -> Iterator[None]:
    """Inside, an unwritable or full location raises `StorageError` naming `path`; other errors pass unchanged."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as err:
        translated = storage_error(err, path, what)
        if translated is None:
            raise
        raise translated from err
