"""Speculative decoding is token-identical to AR decoding on CPU float32.

Random test checkpoints, 20 prompts x 128 new tokens, chain and tree drafting with the draft-model
drafter and the n-gram drafter, tree budgets 1..64. If a divergence appears, the failure message
shows the target's logit margin at that position: a genuine near-tie would show a margin at float32
rounding level (~1e-5); anything larger is a bug.
"""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.round import TierPolicy
from specpilot.models.loading import load_model

N_PROMPTS, NEW_TOKENS = 20, 128


@pytest.fixture(scope="module")
def models(target_dir, drafter_dir):
    return load_model(target_dir), load_model(drafter_dir)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 48, (N_PROMPTS,), generator=g)
    # repeat a motif inside some prompts so prompt lookup finds matches
    out = []
    for i, L in enumerate(lens):
        p = torch.randint(1, 4096, (int(L),), generator=g).tolist()
        out.append(p + p[: len(p) // 2] if i % 2 else p)
    return out


@pytest.fixture(scope="module")
def ar_outputs(models, prompts):
    target, _ = models
    return Generator(target).generate(prompts, NEW_TOKENS).outputs


def margin_at_divergence(target, prompt, expected, got) -> str:
    i = next(j for j, (a, b) in enumerate(zip(expected, got)) if a != b)
    seq = torch.tensor([prompt + expected[:i]])
    with torch.no_grad():
        logits = target.forward_causal(seq)[0, -1]
    return (
        f"first divergence at generated token {i}: AR {expected[i]} vs speculative {got[i]}, "
        f"logit margin {float(logits[expected[i]] - logits[got[i]]):.3e}"
    )


def assert_identical(target, prompts, expected, result):
    for p, e, g in zip(prompts, expected, result.outputs):
        if e != g:
            pytest.fail(margin_at_divergence(target, p, e, g))


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 8])
def test_chain_draft_model(models, prompts, ar_outputs, depth):
    target, draft = models
    gen = Generator(target, {depth: DraftModelDrafter(draft, depth, topk=1, tree_budget=depth)})
    result = gen.generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, result)
    assert result.mean_accepted_length > 1.1  # the drafter shares layers with the target


# depth 5, topk 4: 68 candidates, 4 at depth 1 and 16 per deeper level (`best_first.num_candidates`);
# budgets at each level's end (4, 20, 36, 52), one past it (a level begun: 5, 21, 53), one short of
# it (a level left partial: 3), the smallest and the largest tested
@pytest.mark.parametrize("budget", [1, 3, 4, 5, 20, 21, 36, 52, 53, 64])
@pytest.mark.slow
def test_tree_draft_model_at_budgets_around_each_level(models, prompts, ar_outputs, budget):
    target, draft = models
    gen = Generator(target, {5: DraftModelDrafter(draft, depth=5, topk=4, tree_budget=budget)})
    result = gen.generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, result)


@pytest.mark.parametrize("depth,topk,budget", [(1, 1, 1), (4, 1, 4), (6, 1, 6), (3, 2, 5),
                                               pytest.param(4, 4, 16, marks=pytest.mark.slow),
                                               pytest.param(8, 8, 64, marks=pytest.mark.slow)])
def test_ngram(models, prompts, ar_outputs, depth, topk, budget):
    target, _ = models
    gen = Generator(target, {depth: NgramDrafter(depth, topk, budget)})
    result = gen.generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, result)


def test_single_request_equals_batched(models, prompts, ar_outputs):
    target, draft = models
    gen = Generator(target, {4: DraftModelDrafter(draft, 4, 3, 12)})
    for p, e in zip(prompts[:4], ar_outputs[:4]):
        assert gen.generate([p], NEW_TOKENS).outputs == [e]


def test_self_drafting_accepts_everything(models, prompts):
    target, _ = models
    gen = Generator(target, {4: DraftModelDrafter(target, 4, 1, 4)})
    r = gen.generate(prompts[:3], 40)
    # every round commits depth + 1 tokens except where the 40-token limit cuts the last one
    assert all(all(a == 5 for a in row[:-1]) for row in r.accept_lengths)


def test_adaptive_depth_tiers_and_lazy_sync_stay_exact(models, prompts, ar_outputs):
    target, draft = models
    tiers = {d: DraftModelDrafter(draft, d, 2, 2 * d, window=9) for d in (2, 4, 8)}
    result = Generator(target, tiers).generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, result)
    lazy = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6)}, sync_every=4).generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, lazy)


def test_ngram_adaptive_depth_tiers_stay_exact(models, prompts, ar_outputs, monkeypatch):
    """Every depth tier of the n-gram drafter drafts from the same rows' indexes: a round on any tier,
    whichever tier started the batch, proposes from every committed token and stays exact. The
    tier moves round by round here, so each of them drafts."""
    target, _ = models
    tiers = {d: NgramDrafter(d, 2, 2 * d) for d in (2, 4, 8)}
    used = []

    def update(policy, accepted):
        used.append(policy.tier)
        policy.tier = policy.tiers[policy.tiers.index(policy.tier) - 1]
        return policy.tier

    monkeypatch.setattr(TierPolicy, "update", update)
    result = Generator(target, tiers).generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, result)
    assert set(used) == set(tiers)
    assert len({id(d.indexes) for d in tiers.values()}) == 1
    for idx, p, out in zip(tiers[2].indexes, prompts, result.outputs):  # all but the last round's tokens
        n = len(p) + len(out)
        assert len(idx.tokens) >= n - 9 and idx.tokens[:n] == (p + out)[: len(idx.tokens)]
