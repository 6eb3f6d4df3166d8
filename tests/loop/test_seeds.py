"""Memory that transfers: similar deployments seed from each other, across versions, with patches that apply."""

from dataclasses import replace

from loop_fixtures import CONFIG, STOCK, evaluation, fingerprint, git_repo

from specpilot.control.rule import Outcome
from specpilot.loop.report import seed_line
from specpilot.loop.seeds import find_seeds
from specpilot.loop.worktree import Checkout
from specpilot.memory.store import Memory

HERE = fingerprint("fx-512")  # max_new_tokens 2048 in the fixture; the others differ from it


def other(name: str, **changes):
    return replace(HERE, name=name, **changes)


def test_a_deployment_differing_only_in_max_new_tokens_seeds_from_the_others_promotions(tmp_path):
    there = other("fx-256", max_new_tokens=256)
    s1 = STOCK.with_changes(name="s1", depth=6)
    s2 = s1.with_changes(name="s2", topk=2)
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(there, evaluation(s1, STOCK, gain=0.05), CONFIG)
        memory.record_evaluation(there, evaluation(s2, s1, gain=0.03), CONFIG)  # on top of s1
        memory.record_evaluation(there, evaluation(STOCK.with_changes(name="bad", depth=2), s2, gain=-0.1,
                                                   verdict=Outcome.REJECT), CONFIG)
        (seed,) = find_seeds(memory, HERE, STOCK, None, tmp_path)
    p = seed.proposal
    # the whole chain's change over its stock, laid over this deployment's stock
    assert p is not None and p.candidate.system.depth == 6 and p.candidate.system.topk == 2
    assert p.candidate.system.tree_budget == STOCK.tree_budget and p.candidate.patch is None and p.agent == "memory"
    assert seed.similarity == HERE.similarity(there) < 1.0
    assert seed.line().startswith(f"seeded from deployment fx-256 (similarity {seed.similarity:.2f}: same target "
                                  "and drafter, max_new_tokens 2048 vs 256): ")
    assert seed.line().endswith(f": depth 5->6, topk 4->2 (entry {seed.entry_id}, +8.2% over its stock)")
    assert seed.to_dict()["changes"] == {"depth": [5, 6], "topk": [4, 2]}
    assert seed_line(seed.to_dict()) == (f"seeded from `fx-256` (similarity {seed.similarity:.2f}: same target and "
                                         "drafter, max_new_tokens 2048 vs 256): `seed-fx-256` (depth 5->6, topk 4->2)")


def test_a_version_bump_still_seeds_with_a_lower_similarity(tmp_path):
    workload = other("fx-256", max_new_tokens=256)
    bumped = other("fx-next", versions={**HERE.versions, "specpilot": "0.1.1", "torch": "2.14"})
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(workload, evaluation(STOCK.with_changes(name="a", depth=6)), CONFIG)
        memory.record_evaluation(bumped, evaluation(STOCK.with_changes(name="b", depth=7)), CONFIG)
        seeds = find_seeds(memory, HERE, STOCK, None, tmp_path)
    assert [s.source for s in seeds] == ["fx-256", "fx-next"]  # most similar first
    new = seeds[1]
    assert new.proposal is not None and new.proposal.candidate.system.depth == 7
    assert new.similarity < seeds[0].similarity and new.similarity >= 0.7
    assert "specpilot 0.1.0 vs 0.1.1, torch 2.13 vs 2.14" in new.line()


def test_a_patch_is_offered_where_it_applies_and_skipped_with_the_reason_where_it_does_not(tmp_path):
    repo = git_repo(tmp_path / "repo")
    checkout = Checkout.capture(repo)
    wt = checkout.create(tmp_path / "made")
    (wt.path / "pkg" / "a.py").write_text("A = 3  # faster\n")
    patch = wt.diff()
    wt.remove()
    there = other("fx-256", max_new_tokens=256)
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(there, evaluation(STOCK.with_changes(name="p", depth=6)), CONFIG, patch=patch)
        (seed,) = find_seeds(memory, HERE, STOCK, checkout, tmp_path / "scratch")
        assert seed.proposal is not None and seed.proposal.candidate.patch == patch
        workdir = seed.proposal.candidate.workdir
        assert (tmp_path / "scratch").is_dir() and open(f"{workdir}/pkg/a.py").read() == "A = 3  # faster\n"
        # the code moved on under the patch: it no longer applies, and the seed says so
        (repo / "pkg" / "a.py").write_text("A = 4  # someone else's change\n")
        (seed,) = find_seeds(memory, HERE, STOCK, Checkout.capture(repo), tmp_path / "scratch")
        assert seed.proposal is None and "no longer applies" in seed.skipped and "pkg/a.py" in seed.skipped
        assert seed.line().startswith("not seeded from deployment fx-256 (similarity")
        # without a git checkout a patch cannot be applied at all
        (seed,) = find_seeds(memory, HERE, STOCK, None, tmp_path / "scratch")
        assert seed.proposal is None and "not a git checkout" in seed.skipped


def test_dissimilar_deployments_and_nothing_to_transfer_give_no_offer(tmp_path):
    far = other("far", target=(("config.json", "e" * 64), ("model.safetensors", "f" * 64)))
    same_as_stock = other("fx-256", max_new_tokens=256)
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(far, evaluation(STOCK.with_changes(name="a", depth=6)), CONFIG)
        # promoted, but its change is this deployment's stock already
        memory.record_evaluation(same_as_stock, evaluation(STOCK.with_changes(name="b"), STOCK.with_changes(
            name="base", depth=6)), CONFIG)
        seeds = find_seeds(memory, HERE, STOCK, None, tmp_path)
    assert [(s.source, s.proposal) for s in seeds] == [("fx-256", None)]
    assert "nothing to transfer" in seeds[0].skipped
