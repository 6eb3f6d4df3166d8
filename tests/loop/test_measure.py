"""The incumbent's measurement times each other drafter the session loads, switched in."""

import torch

from specpilot.config import DrafterKind, load_deployment
from specpilot.engine.session import Session
from specpilot.loop.measure import loaded_drafters, measure
from specpilot.loop.systems import switched


def test_each_other_loaded_drafter_is_timed_with_the_incumbents_other_knobs():
    dep = load_deployment("fixture-dflash")  # the draft model, EAGLE-3 and DFlash
    session = Session.load(dep, "cpu", torch.float32)
    assert loaded_drafters(session) == [DrafterKind.MODEL, DrafterKind.EAGLE3, DrafterKind.DFLASH]
    system = dep.stock.with_changes(name="m", drafter=DrafterKind.MODEL, depth=3, topk=2, tree_budget=4)
    prompt = session.encode_prompt("def add(a, b):")
    built, generator = [], session.generator
    session.generator = lambda s: built.append(s) or generator(s)
    table = measure(session, system, [[prompt], [prompt[:3]]], 6)
    assert set(table.switch_ms_per_token) == {"eagle3", "dflash"}
    assert all(t > 0 for t in table.switch_ms_per_token.values())
    e3 = table.switch_rounds["eagle3"]  # measured in full: a table of its own at the same shape
    assert e3["ms_per_token"] == table.switch_ms_per_token["eagle3"] and len(e3["accept_at_depth"]) == 3
    assert e3["round_ms"] / e3["tokens_per_round"] > 0 and table.switched("eagle3").shape == table.shape
    assert table.switch_rounds["dflash"]["tokens_per_round"] >= 1 and table.switched("dflash") is None  # no such shape
    eagle3 = switched(system, DrafterKind.EAGLE3)
    assert (eagle3.drafter, eagle3.depth, eagle3.topk, eagle3.tree_budget) == (DrafterKind.EAGLE3, 3, 2, 4)
    assert eagle3 in built and switched(system, DrafterKind.DFLASH) in built  # what was timed
    assert eagle3.fingerprint() not in session._generators  # and not kept
    ar = system.with_changes(name="ar", drafter=DrafterKind.NONE)
    assert measure(session, ar, [[prompt]], 6).switch_ms_per_token == {}  # from AR: none (the agent re-enters)


def test_an_incumbent_serving_with_segment_admission_is_measured_against_its_plain_ar():
    """AR of the incumbent resets segment admission (no verify rows to ride in): a loop that promoted
    it measured its next round, and the final system, against a valid AR."""
    dep = load_deployment("fixture")
    session = Session.load(dep, "cpu", torch.float32)
    system = dep.stock.with_changes(name="seg", segment_tokens=8, shared_budget=4)
    built, generator = [], session.generator
    session.generator = lambda s: built.append(s) or generator(s)
    prompt = session.encode_prompt("def add(a, b):")
    table = measure(session, system, [[prompt], [prompt[:4]]], 6)
    assert table.ar_ms_per_token > 0 and system.plain_ar() in built
