"""The round object: its users call it through public names only, the tier policy, slack and the
drafters' shared per-workspace state."""

import ast
from pathlib import Path

import pytest

import specpilot.engine.generator as generator_module
import specpilot.engine.serving as serving_module
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.round import TierPolicy


def foreign_private_names(module) -> list[str]:
    """`x._name` in the module's source for any `x` but `self` (dunders aside)."""
    tree = ast.parse(Path(module.__file__).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                out.append(f"{ast.unparse(node)} (line {node.lineno})")
    return out


@pytest.mark.parametrize("module", [serving_module, generator_module], ids=["serving", "generator"])
def test_the_loops_call_the_round_through_public_names_only(module):
    """`ServingEngine` calls no private `Generator` method, and neither loop reaches into `Rounds`."""
    assert foreign_private_names(module) == []


def test_tier_policy_moves_one_tier_on_the_mean_of_a_window():
    policy = TierPolicy.start([2, 4, 8])
    assert policy.tier == 4 and policy.adaptive
    assert [policy.update(a) for a in (4, 4, 4)] == [4, 4, 4]  # fewer than a window: stays
    assert policy.update(3.2) == 8 and policy.recent == []  # mean 3.8 >= 0.8 x 4: deeper, record cleared
    assert [policy.update(1) for _ in range(4)] == [8, 8, 8, 4]  # mean 1 < 0.4 x 8: shallower
    assert [policy.update(2) for _ in range(4)] == [4, 4, 4, 4]  # 1.6 <= 2 < 3.2: stays
    assert [policy.update(0) for _ in range(8)][-1] == 2 and policy.update(0) == 2  # none shallower
    single = TierPolicy.start([5])
    assert single.tier == 5 and not single.adaptive and single.update(5.0) == 5


def test_slack_is_the_most_any_tier_writes_past_the_committed_length(target, draft):
    """A draft model writes its catch-up window plus its candidates; the n-gram drafter its tree."""
    tiers = {d: DraftModelDrafter(draft, d, 2, 2 * d, window=9) for d in (2, 4)}
    assert [d.slack() for d in tiers.values()] == [2 + 2 * 2 + 9, 2 + 3 * 4 + 9]
    assert Generator(target, tiers).rounds.slack() == 2 + 3 * 4 + 9 + 1
    assert Generator(target, {3: NgramDrafter(3, 2, 5)}).rounds.slack() == 5 + 1 + 1
    assert Generator(target).rounds.slack() == 2


def test_depth_tiers_share_one_state_per_workspace(target, draft, make_prompts):
    """Every tier's drafter reads the state whichever tier started the batch; a dropped workspace is
    forgotten by all of them."""
    tiers = {d: DraftModelDrafter(draft, d, 2, 2 * d, window=9) for d in (2, 4, 8)}
    gen = Generator(target, tiers)
    gen.rounds.max_workspaces = 1
    gen.generate(make_prompts(2, seed=1), 8)
    (key,) = gen.workspaces
    assert len({id(d.caches) for d in tiers.values()}) == 1 and tiers[8].cache is tiers[2].caches.entries[key]
    gen.generate(make_prompts(3, seed=1), 8)  # another batch size: the first workspace is dropped
    assert list(tiers[4].caches.entries) == list(gen.workspaces) != [key]
