"""Isolated git worktrees holding the code of patch candidates.

A patch candidate (from the coding agent, the kernel agent, or a promoted patch the next rounds
build on) is code, so it is timed from its own copy of the package: a `git worktree` of this
checkout that the controller's workers import first (`ArmSpec.workdir`).

The *baseline* is the checkout as the loop found it, uncommitted work included: a worktree is
`git worktree add --detach` at HEAD, then the checkout's uncommitted changes (`git diff HEAD`,
applied) and its untracked, not-ignored files (copied; files above `LINK_BYTES`, i.e. model data,
are symlinked instead) are laid over it, and `git add -A` + `git write-tree` record the result as
the baseline tree. Nothing is committed and no ref moves: the tree is a loose object.

A candidate's patch is `git diff --binary` of everything in its worktree against the baseline
tree, so a patch is always complete (the incumbent's patch plus the new change), applies to a fresh
baseline worktree with `git apply`, and identifies the system in the memory together with its knobs.

Owns: `Checkout` (the snapshot), `Worktree` (create, apply a patch, diff, remove). Does not own
what runs in a worktree (agents) or how its code is imported (the controller's workers).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import SpecPilotError

LINK_BYTES = 4 << 20  # untracked files larger than this are symlinked into worktrees, not copied
_GIT_LOCK = threading.Lock()  # `git worktree add/remove` edit shared metadata: one at a time


class WorktreeError(SpecPilotError):
    """A git operation on a worktree failed."""


def git(*args: str, cwd: Path, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, timeout=300)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise WorktreeError(f"git {' '.join(args[:3])} failed in {cwd}: {err[-1] if err else proc.returncode}")
    return proc


def package_checkout() -> Path | None:
    """The git checkout `specpilot` is imported from, or None (an installed package, no git)."""
    import specpilot

    root = Path(specpilot.__file__).resolve().parents[1]
    try:
        proc = git("rev-parse", "--show-toplevel", cwd=root, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    top = Path(proc.stdout.decode().strip()).resolve()
    return top if (top / "specpilot" / "__init__.py").is_file() else None


@dataclass(frozen=True)
class Checkout:
    """The checkout's state when the loop started: HEAD plus uncommitted work."""

    root: Path
    head: str
    changes: bytes  # `git diff --binary HEAD` (staged and unstaged changes to tracked files)
    untracked: tuple[str, ...]  # untracked, not-ignored files (relative paths)

    @classmethod
    def capture(cls, root: Path) -> Checkout:
        head = git("rev-parse", "HEAD", cwd=root).stdout.decode().strip()
        changes = git("diff", "--binary", "HEAD", cwd=root).stdout
        listed = git("ls-files", "--others", "--exclude-standard", "-z", cwd=root).stdout.decode()
        return cls(root, head, changes, tuple(p for p in listed.split("\0") if p))

    def create(self, path: Path) -> Worktree:
        """A new worktree at `path` holding the baseline (see the module docstring)."""
        path = Path(path)
        if path.exists():
            raise WorktreeError(f"worktree path {path} already exists")
        path.parent.mkdir(parents=True, exist_ok=True)
        with _GIT_LOCK:
            git("worktree", "add", "--detach", str(path), self.head, cwd=self.root)
        try:
            if self.changes:
                git("apply", "--binary", "--whitespace=nowarn", "-", cwd=path, stdin=self.changes)
            for rel in self.untracked:
                src, dst = self.root / rel, path / rel
                if not src.is_file():
                    continue  # deleted since the snapshot
                dst.parent.mkdir(parents=True, exist_ok=True)
                if src.stat().st_size > LINK_BYTES:
                    dst.symlink_to(src.resolve())
                else:
                    shutil.copy2(src, dst)
            git("add", "-A", cwd=path)
            baseline = git("write-tree", cwd=path).stdout.decode().strip()
        except BaseException:
            remove(self.root, path)
            raise
        return Worktree(self.root, path, baseline)


@dataclass(frozen=True)
class Worktree:
    repo: Path  # the main checkout
    path: Path
    baseline: str  # tree id of the baseline

    def apply(self, patch: str) -> None:
        """Apply a patch made by `diff` (against the same baseline) to the working files."""
        if patch:
            git("apply", "--binary", "--whitespace=nowarn", "-", cwd=self.path, stdin=patch.encode())

    def applies(self, patch: str) -> bool:
        if not patch:
            return True
        proc = git("apply", "--check", "--binary", "-", cwd=self.path, stdin=patch.encode(), check=False)
        return proc.returncode == 0

    def diff(self) -> str:
        """Everything in the worktree that differs from the baseline, as one patch ('' if nothing)."""
        git("add", "-A", cwd=self.path)
        return git("diff", "--binary", "--cached", self.baseline, cwd=self.path).stdout.decode()

    def changed_files(self) -> list[str]:
        git("add", "-A", cwd=self.path)
        out = git("diff", "--cached", "--name-only", self.baseline, cwd=self.path).stdout.decode()
        return [line for line in out.splitlines() if line]

    def remove(self) -> None:
        remove(self.repo, self.path)


def remove(repo: Path, path: Path) -> None:
    """Remove a worktree and its metadata (never raises: cleanup must not mask the real error)."""
    with _GIT_LOCK:
        try:
            git("worktree", "remove", "--force", str(path), cwd=repo, check=False)
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(path, ignore_errors=True)
        try:
            git("worktree", "prune", cwd=repo, check=False)
        except (OSError, subprocess.SubprocessError):
            pass
