"""Output directories that a failed or interrupted command would leave behind empty.

`removed_if_left_empty(path)` wraps the part of a command that creates `path` and fills it: when
that part raises (an error, Ctrl-C), every directory on the way to `path` that did not exist
before and is still empty is removed. A directory that existed before, or that holds anything
(a partial report is kept), is never touched.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def missing_dirs(path: str | Path) -> list[Path]:
    """`path` and its parents that do not exist yet, deepest first."""
    path, out = Path(path).absolute(), []
    for d in (path, *path.parents):
        if d.exists():
            break
        out.append(d)
    return out


@contextmanager
def removed_if_left_empty(*paths: str | Path) -> Iterator[None]:
    """On an exception in the body, rmdir the directories towards `paths` this body created and left empty."""
    new = sorted({d for p in paths for d in missing_dirs(p)}, key=lambda d: len(d.parts), reverse=True)
    try:
        yield
    except BaseException:
        for d in new:
            try:
                d.rmdir()  # fails (and is skipped) unless the directory is empty
            except OSError:
                pass
        raise
