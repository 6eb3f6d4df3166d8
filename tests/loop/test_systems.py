"""Candidates and incumbents: identity (the memory's), changes, knob groups, names, compounding."""

import pytest
from loop_fixtures import STOCK

from specpilot.loop.systems import Candidate, Incumbent, describe, group_of, short_name
from specpilot.memory.records import system_hash


def test_identity_is_knobs_and_patch_not_name():
    a = Candidate(STOCK.with_changes(name="a", depth=3))
    assert a.hash == Candidate(STOCK.with_changes(name="b", depth=3)).hash == system_hash(a.knobs)
    assert a.hash != Candidate(a.system, "diff --git a/x b/x\n").hash
    assert Candidate(a.system, "").patch is None  # no patch, not an empty one
    spec = a.runner_spec("fixture", "m:f")
    assert spec.system == {"name": "a", **a.system.knobs()} and spec.factory == "m:f" and spec.workdir is None


def test_changes_groups_and_names():
    stock, wide = Candidate(STOCK), Candidate(STOCK.with_changes(name="w", tree_budget=12, sync_every=2), "p")
    diff = wide.changes_from(stock)
    assert diff == {"sync_every": [1, 2], "tree_budget": [7, 12], "patch": [False, True]}
    assert wide.groups_changed_from(stock) == {"runtime", "tree", "code"}
    assert group_of("depth") == group_of("drafter") == "tree" and group_of("w12") == "kernels"
    assert describe(diff) == "sync_every 1->2, tree_budget 7->12, + patch"
    assert short_name("knob", {"adaptive_depth": [[], [3, 7]]}) == "knob:adaptive_depth=(3,7)"
    assert len(short_name("knob", {f"k{i}": [0, i] for i in range(30)})) == 56


def test_promotion_compounds_gains_and_extends_the_lineage():
    stock = Incumbent(Candidate(STOCK))
    one = stock.promote(Candidate(STOCK.with_changes(name="1", depth=3)), 4, 0.10, "r1")
    two = one.promote(Candidate(STOCK.with_changes(name="2", depth=3, topk=2)), 9, 0.20, "r2")
    assert two.cumulative_gain == pytest.approx(1.1 * 1.2 - 1) and (two.entry_id, two.round) == (9, "r2")
    assert two.lineage == {stock.candidate.hash, one.candidate.hash} and not two.is_stock and stock.is_stock
