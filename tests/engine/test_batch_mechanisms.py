"""The batch mechanisms of the draft-model drafter: a shared node budget and per-request depth.

CPU float32 on the random test checkpoints: the packed forward gives the unpacked one's logits at
the packed rows; the shared selection keeps B x s nodes, per row a prefix-closed set of varying
size (its best nodes), none for rows that are done; per-request depth caps each row's tree by its
recent acceptance; decoding with either (static batch and continuous batching) gives AR's tokens.
"""

import pytest
import torch

from specpilot.config import DrafterKind, System
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.models.kv_cache import KVCache
from specpilot.engine.selection import row_caps
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill
from specpilot.errors import ConfigError

from tests.engine.test_lossless import assert_identical


@pytest.fixture(scope="module")
def prompts(make_prompts):
    return make_prompts(6, seed=21, lo=2, hi=40)


@pytest.fixture(scope="module")
def ar_outputs(target, prompts):
    return Generator(target).generate(prompts, 40).outputs


@pytest.fixture(scope="module")
def make_prompts():
    from tests.conftest import random_prompts

    return random_prompts


def test_packed_forward_equals_unpacked_at_packed_rows(target):
    B, T, S = 3, 5, 32
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 4096, (B, T), generator=g)
    pos = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [4], [9]])
    mask = torch.arange(S)[None, None, None, :] <= pos[:, None, :, None]  # [B,1,T,S] causal chunks
    full_cache = KVCache.allocate(target.config, B, S, "cpu", torch.float32)
    packed_cache = KVCache.allocate(target.config, B, S, "cpu", torch.float32)
    with torch.no_grad():
        full = target(tokens, pos, full_cache, pos, mask)  # [B,T,V]
        keep = torch.tensor([0, 1, 2, 5, 10, 11])  # a prefix of each row: (3, 1, 2) tokens
        packed = target(tokens, pos, packed_cache, pos, mask, pack=keep)  # [1,M,V]
    assert packed.shape == (1, 6, full.shape[-1])
    torch.testing.assert_close(packed[0], full.reshape(B * T, -1)[keep], rtol=1e-5, atol=1e-5)
    for b, n in enumerate((3, 1, 2)):  # the packed rows' cache entries too
        for layer in range(target.config.num_layers):
            slots = pos[b, :n]
            torch.testing.assert_close(packed_cache.k[layer][b, :, slots], full_cache.k[layer][b, :, slots],
                                       rtol=1e-5, atol=1e-5)


def shared_tree(target, draft, prompts, shared, done=(), budget=10, margin=0, log=None):
    B = len(prompts)
    drafter = DraftModelDrafter(draft, depth=4, topk=3, tree_budget=budget, shared_budget=shared,
                                row_depth_margin=margin)
    state = DecodeState.allocate(B, 128, 8, "cpu")
    state.reset(prompts, (), 16)
    for b in done:
        state.done[b] = True
    for b, counts in (log or {}).items():  # committed tokens per past round
        state.rounds[b] = len(counts)
        state.accept_log[b, : len(counts)] = torch.tensor(counts)
    cache = KVCache.allocate(target.config, B, 128, "cpu", torch.float32)
    prefill(target, cache, prompts)
    drafter.start(prompts, state)
    with torch.no_grad():
        return drafter.propose(state)


def test_shared_selection_is_prefix_closed_and_keeps_the_batch_budget(target, draft, prompts):
    tree = shared_tree(target, draft, prompts, shared=4)
    B, N = tree.tokens.shape
    assert N == 11 and tree.num_valid == B * 5 and int(tree.valid.sum()) == B * 5
    assert tree.valid[:, 0].all()
    parents_valid = tree.valid.gather(1, tree.parents[:, 1:].clamp(min=0))
    assert (parents_valid | ~tree.valid[:, 1:]).all()  # a valid node's parent is valid
    counts = tree.valid.sum(1)
    assert len(set(counts.tolist())) > 1  # confident rows get more nodes than others
    unshared = shared_tree(target, draft, prompts, shared=0)
    assert unshared.valid is None and torch.equal(unshared.tokens, tree.tokens)  # same ranking, same nodes
    for b, c in enumerate(counts.tolist()):  # a row's valid nodes are its c - 1 best: its tree at that budget
        alone = shared_tree(target, draft, prompts, shared=0, budget=c - 1) if c > 1 else None
        if alone is not None:
            assert torch.equal(tree.tokens[b][tree.valid[b]], alone.tokens[b])
            kept = tree.valid[b].nonzero()[:, 0]
            remap = {int(j): i for i, j in enumerate(kept)}
            assert [remap.get(int(p), -1) for p in tree.parents[b][kept]] == alone.parents[b].tolist()


def test_rows_that_are_done_give_their_share_away(target, draft, prompts):
    tree = shared_tree(target, draft, prompts, shared=4, done=(0, 3))
    assert tree.valid[[0, 3], 1:].sum() == 0
    assert int(tree.valid.sum()) == len(prompts) * 5


@pytest.mark.parametrize("shared", [1, 3, 10])
def test_generation_with_a_shared_budget_is_lossless(target, draft, prompts, ar_outputs, shared):
    gen = Generator(target, {4: DraftModelDrafter(draft, 4, 3, 10, shared_budget=shared)})
    result = gen.generate(prompts, 40)
    assert_identical(target, prompts, ar_outputs, result)
    assert result.mean_accepted_length > 1.1


def test_serving_with_a_shared_budget_is_lossless(target, draft, prompts, ar_outputs):
    gen = Generator(target, {4: DraftModelDrafter(draft, 4, 3, 10, shared_budget=3)})
    requests = [Request(tuple(p), 40 - 5 * (i % 3)) for i, p in enumerate(prompts)]
    result = ServingEngine(gen, 4, prefill_chunk=8).run(requests)
    assert [r.output for r in result.requests] == [o[: r.max_new] for o, r in zip(ar_outputs, requests)]


def test_knob_checks():
    assert System(shared_budget=7).fingerprint() != System().fingerprint()
    System(shared_budget=7).with_changes(drafter=DrafterKind.NONE)  # AR of such a stock
    with pytest.raises(ConfigError, match="> tree_budget"):
        System(tree_budget=7, shared_budget=8)
    with pytest.raises(ConfigError, match="needs drafter = 'model'"):
        System(drafter=DrafterKind.NGRAM, shared_budget=2)
    with pytest.raises(ConfigError, match=">= 0"):
        System(shared_budget=-1)
    assert System(row_depth_margin=1).fingerprint() != System().fingerprint()
    with pytest.raises(ConfigError, match="row_depth_margin"):
        System(drafter=DrafterKind.NGRAM, row_depth_margin=1)


def test_row_caps_follow_recent_acceptance():
    state = DecodeState.allocate(4, 64, 16, "cpu")
    state.reset([[1, 2]] * 4, (), 16)
    logs = {1: [6, 6, 6, 6], 2: [3, 1, 2, 1, 1, 1], 3: [1]}  # row 0: no round yet
    for b, counts in logs.items():
        state.rounds[b] = len(counts)
        state.accept_log[b, : len(counts)] = torch.tensor(counts)
    # row 1: 5 drafts accepted -> capped at depth 5; row 2: last 4 rounds 0.25 -> 1 + 1; row 3: 0 -> 1
    assert row_caps(state, depth=5, margin=1).tolist() == [5, 5, 2, 1]


def test_per_request_depth_caps_each_rows_tree(target, draft, prompts):
    log = {0: [2, 2, 2, 2], 1: [5, 5, 5, 5]}  # row 0 accepts 1 draft a round, row 1 all 4
    capped = shared_tree(target, draft, prompts, shared=0, margin=1, log=log).depths()
    free = shared_tree(target, draft, prompts, shared=0, log=log).depths()
    assert int(capped[0].max()) == 2 < int(free[0].max())  # ceil(1) + 1; its 12 candidates fill the budget
    assert torch.equal(capped[1:], free[1:])  # rows at full depth, or without a round yet, unchanged
    log[0] = [1, 1, 1, 1]  # accepts nothing: depth 1, fewer candidates than its budget
    shared = shared_tree(target, draft, prompts, shared=4, margin=1, log=log)
    assert int(shared.valid[0].sum()) <= 1 + 3 and int(shared.depths()[0][shared.valid[0]].max()) <= 1


@pytest.mark.parametrize("shared", [0, 3])
def test_per_request_depth_is_lossless(target, draft, prompts, ar_outputs, shared):
    gen = Generator(target, {4: DraftModelDrafter(draft, 4, 3, 10, shared_budget=shared, row_depth_margin=1)})
    assert_identical(target, prompts, ar_outputs, gen.generate(prompts, 40))
    requests = [Request(tuple(p), 40) for p in prompts]
    assert [r.output for r in ServingEngine(gen, 4).run(requests).requests] == ar_outputs
