"""Worktrees: the baseline is the checkout with its uncommitted work; patches are diffs against it."""

import subprocess

from loop_fixtures import git_repo

from specpilot.loop import worktree
from specpilot.loop.worktree import Checkout


def test_baseline_holds_uncommitted_work_and_patches_round_trip(tmp_path, monkeypatch):
    repo = git_repo(tmp_path / "repo")
    (repo / "big.bin").write_bytes(b"x" * 64)
    monkeypatch.setattr(worktree, "LINK_BYTES", 32)  # big untracked files are linked, not copied
    checkout = Checkout.capture(repo)
    assert set(checkout.untracked) == {"pkg/new.py", "big.bin"} and b"uncommitted" in checkout.changes
    wt = checkout.create(tmp_path / "wt")
    assert (wt.path / "pkg" / "a.py").read_text() == "A = 2  # uncommitted\n"
    assert (wt.path / "pkg" / "new.py").is_file() and not (wt.path / "debug.log").exists()
    assert (wt.path / "big.bin").is_symlink()
    assert wt.diff() == "" and wt.changed_files() == []
    (wt.path / "pkg" / "a.py").write_text("A = 3\n")
    (wt.path / "pkg" / "b.py").write_text("B = 1\n")
    patch = wt.diff()
    assert "+A = 3" in patch and "pkg/b.py" in patch and wt.changed_files() == ["pkg/a.py", "pkg/b.py"]
    other = checkout.create(tmp_path / "wt2")
    assert other.applies(patch)
    other.apply(patch)
    assert (other.path / "pkg" / "a.py").read_text() == "A = 3\n" and other.diff() == patch
    wt.remove()
    other.remove()
    assert not wt.path.exists() and not other.path.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert str(wt.path) not in listed
    assert (repo / "pkg" / "a.py").read_text() == "A = 2  # uncommitted\n"  # the checkout itself untouched
