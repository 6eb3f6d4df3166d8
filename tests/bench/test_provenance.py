"""Provenance names the commit a run came from, also on a copied tree."""

from specpilot.bench.provenance import git_state


def test_named_commit_wins_over_what_git_says(monkeypatch):
    monkeypatch.setenv("SPECPILOT_COMMIT", "abc1234")
    assert git_state() == {"git_commit": "abc1234", "git_dirty": None}


def test_without_a_name_git_is_asked(monkeypatch):
    monkeypatch.delenv("SPECPILOT_COMMIT", raising=False)
    state = git_state()
    assert set(state) == {"git_commit", "git_dirty"}
    assert state["git_commit"] is None or len(state["git_commit"]) == 40
