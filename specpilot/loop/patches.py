"""Code patches as data: which files a patch touches, how many lines, and what it adds over another.

Every patch the loop handles is complete — `git diff --binary` of a worktree against the loop's
baseline (`worktree.py`) — so a candidate built on a patched incumbent carries the incumbent's
change too. What an agent changed *over its incumbent* is the increment: the file sections
(`diff --git` blocks) of the candidate's patch that are not identical in the incumbent's, plus the
incumbent's sections the candidate dropped (it reverted that file). A section that differs is shown
whole (it is against the baseline, not against the incumbent's version of the file), which is
exact for the common case — the new change touches other files, or a file the incumbent left alone.

`PatchSummary` is what the journal, the report, the CLI and the coding agents' briefs show:
"patch specpilot/engine/faults.py (+1 -1)"; `excerpt` cuts a diff to a line budget for a brief.

Owns: `FileChange`, `PatchSummary`, `sections`, `increment`, `summarize`, `excerpt`. Does not own
making or applying patches (`worktree.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = "diff --git "


def sections(patch: str | None) -> dict[str, str]:
    """{path: its `diff --git` block} of a git patch, in order (the path after `b/`)."""
    out: dict[str, str] = {}
    if not patch:
        return out
    path, block = None, []
    for line in patch.splitlines(keepends=True):
        if line.startswith(HEADER):
            if path is not None:
                out[path] = "".join(block)
            path, block = _path(line), []
        if path is not None:
            block.append(line)
    if path is not None:
        out[path] = "".join(block)
    return out


def _path(header: str) -> str:
    rest = header[len(HEADER):].rstrip("\n")
    return rest.split(" b/", 1)[1] if " b/" in rest else rest


def increment(patch: str | None, parent: str | None) -> tuple[str, tuple[str, ...]]:
    """(the sections of `patch` not identical in `parent`, joined; the files whose `parent` section
    `patch` dropped, i.e. reverted to the baseline)."""
    mine, theirs = sections(patch), sections(parent)
    new = "".join(text for path, text in mine.items() if theirs.get(path) != text)
    return new, tuple(path for path in theirs if path not in mine)


@dataclass(frozen=True)
class FileChange:
    path: str
    added: int  # lines
    removed: int
    binary: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PatchSummary:
    """The change a patch makes over its parent's patch (None: over the baseline)."""

    files: tuple[FileChange, ...]
    reverted: tuple[str, ...] = ()  # files the parent's patch changed and this one restores
    whole: bool = True  # False: the increment over a parent patch, True: the complete patch

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)

    @property
    def empty(self) -> bool:
        return not self.files and not self.reverted

    def line(self, limit: int = 3) -> str:
        """'patch specpilot/engine/faults.py (+1 -1)' or 'patch 4 files (+20 -3): a, b, c, ...'."""
        if self.empty:
            return "patch unchanged"
        parts = []
        if self.files:
            names = [f.path for f in self.files]
            shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
            count = f"+{self.added} -{self.removed}"
            parts.append(f"patch {names[0]} ({count})" if len(names) == 1 else
                         f"patch {len(names)} files ({count}): {shown}")
        if self.reverted:
            parts.append("reverts " + ", ".join(self.reverted[:limit]) + (", ..." if len(self.reverted) > limit
                                                                          else ""))
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"files": [f.to_dict() for f in self.files], "reverted": list(self.reverted), "whole": self.whole,
                "added": self.added, "removed": self.removed, "line": self.line()}

    @classmethod
    def from_dict(cls, d: dict) -> PatchSummary:
        return cls(tuple(FileChange(**f) for f in d["files"]), tuple(d.get("reverted", ())), d.get("whole", True))


def count(section: str) -> FileChange:
    """Lines added and removed by one `diff --git` block."""
    added = removed = 0
    binary = False
    in_hunk = False
    for line in section.splitlines():
        if line.startswith("@@"):
            in_hunk = True
        elif line.startswith(("GIT binary patch", "Binary files ")):
            binary = True
        elif in_hunk and line.startswith("+"):
            added += 1
        elif in_hunk and line.startswith("-"):
            removed += 1
    first = section.split("\n", 1)[0]
    return FileChange(_path(first), added, removed, binary)


def summarize(patch: str | None, parent: str | None = None) -> PatchSummary | None:
    """What `patch` changes over `parent`'s patch (over the baseline when `parent` is None); None
    when there is no patch and nothing is reverted."""
    if not patch and not parent:
        return None
    new, reverted = increment(patch, parent)
    files = tuple(count(s) for s in sections(new).values())
    return PatchSummary(files, reverted, whole=parent is None)


def excerpt(diff: str, max_lines: int) -> str:
    """The first `max_lines` lines of `diff`, and how many were left out (binary blocks shortened)."""
    lines, out, skipping = diff.splitlines(), [], False
    for line in lines:
        if line.startswith("GIT binary patch"):
            out.append("GIT binary patch (not shown)")
            skipping = True
            continue
        if skipping and not line.startswith(HEADER):
            continue
        skipping = False
        out.append(line)
    if len(out) <= max_lines:
        return "\n".join(out)
    return "\n".join(out[:max_lines] + [f"... ({len(out) - max_lines} more lines)"])
