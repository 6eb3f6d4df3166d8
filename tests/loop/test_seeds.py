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


def test_a_patch_is_offered_where_it_applies_and_left_out_with_the_reason_where_it_does_not(tmp_path):
    repo = git_repo(tmp_path / "repo")
    checkout = Checkout.capture(repo)
    wt = checkout.create(tmp_path / "made")
    (wt.path / "pkg" / "a.py").write_text("A = 3  # faster\n")
    patch = wt.diff()
    wt.remove()
    there = other("fx-256", max_new_tokens=256)
    code_only = other("fx-128", max_new_tokens=128)
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(there, evaluation(STOCK.with_changes(name="p", depth=6)), CONFIG, patch=patch)
        memory.record_evaluation(code_only, evaluation(STOCK.with_changes(name="c")), CONFIG, patch=patch)
        seed, only = find_seeds(memory, HERE, STOCK, checkout, tmp_path / "scratch")
        assert seed.proposal is not None and seed.proposal.candidate.patch == patch
        assert seed.line().endswith("depth 5->6, patch pkg/a.py (+1 -1) (entry 1, +5.0% over its stock)")
        workdir = seed.proposal.candidate.workdir
        assert (tmp_path / "scratch").is_dir() and open(f"{workdir}/pkg/a.py").read() == "A = 3  # faster\n"
        assert only.proposal is not None and only.proposal.candidate.system.knobs() == STOCK.knobs()
        assert only.to_dict()["patch_summary"]["line"] == "patch pkg/a.py (+1 -1)"
        # the code moved on under the patch: it no longer applies; the knob change goes on alone and
        # says why, the seed that was only the patch is skipped with the reason
        (repo / "pkg" / "a.py").write_text("A = 4  # someone else's change\n")
        seed, only = find_seeds(memory, HERE, STOCK, Checkout.capture(repo), tmp_path / "scratch")
        assert seed.proposal is not None and seed.proposal.candidate.patch is None
        assert seed.proposal.candidate.system.depth == 6 and seed.to_dict()["has_patch"] is False
        assert "; without its patch: its patch no longer applies here (`git apply --check` fails" in seed.line()
        assert only.proposal is None and "no longer applies" in only.skipped and "pkg/a.py" in only.skipped
        assert only.line().startswith("not seeded from deployment fx-128 (similarity")
        # without a git checkout a patch cannot be applied at all
        seed, only = find_seeds(memory, HERE, STOCK, None, tmp_path / "scratch")
        assert only.proposal is None and "not a git checkout" in only.skipped
        assert seed.proposal.candidate.patch is None and "not a git checkout" in seed.proposal.rationale


def test_a_patch_made_on_another_commit_is_carried_as_a_diff_against_this_baseline(tmp_path):
    """A software version later: the file moved down a line; the patch still applies (`git apply`
    finds it at an offset), and the seed's patch is re-made against this checkout, so a later
    resume re-applies it exactly."""
    repo = git_repo(tmp_path / "repo")
    lines = [f"X{i} = {i}\n" for i in range(8)]
    (repo / "pkg" / "m.py").write_text("".join(lines))
    wt = Checkout.capture(repo).create(tmp_path / "made")
    (wt.path / "pkg" / "m.py").write_text("".join(lines[:4] + ["X4 = 40  # faster\n"] + lines[5:]))
    patch = wt.diff()
    wt.remove()
    (repo / "pkg" / "m.py").write_text("".join(["# a new header line\n"] + lines))
    bumped = other("fx-next", versions={**HERE.versions, "specpilot": "0.1.1"})
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(bumped, evaluation(STOCK.with_changes(name="p")), CONFIG, patch=patch)
        (seed,) = find_seeds(memory, HERE, STOCK, Checkout.capture(repo), tmp_path / "scratch")
    moved = seed.proposal.candidate
    assert moved.patch != patch and "@@ -3,7 +3,7 @@" in moved.patch and "+X4 = 40  # faster" in moved.patch
    assert open(f"{moved.workdir}/pkg/m.py").read().splitlines()[:6] == [
        "# a new header line", "X0 = 0", "X1 = 1", "X2 = 2", "X3 = 3", "X4 = 40  # faster"]
    assert "specpilot 0.1.0 vs 0.1.1" in seed.line() and seed.similarity < 1.0


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
