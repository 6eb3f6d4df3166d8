"""Segment admission is lossless and leaves every cache as a chunk prefill would.

CPU float32. Requests admitted while others decode prefill inside the rounds (`engine.segments`);
their outputs must equal single-request AR token for token, for each drafter that drafts on the
device, and the caches a segment fills must match a chunk prefill's.
"""

import pytest
import torch

from specpilot.config import DrafterKind, System
from specpilot.engine.drafters.base import DrafterSettings
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.models.kv_cache import KVCache
from specpilot.engine.segments import segment_tree
from specpilot.engine.serving import ServingEngine
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill, verify_step
from specpilot.engine.tree import DraftTree
from specpilot.errors import ConfigError

from tests.conftest import random_requests


@pytest.fixture(scope="module")
def requests():
    """8 requests, prompt lengths 1..40 and token limits 4..20; most arrive while others decode."""
    return random_requests(8, seed=5, max_len=40, new_tokens=(4, 20), one_token_at=5)


@pytest.fixture(scope="module")
def ar_outputs(target, requests):
    return [Generator(target).generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]


def serve(gen, requests, slots=3):
    result = ServingEngine(gen, slots, prefill_chunk=16, always_segments=True).run(requests)
    by_segment = [r.by_segment for r in result.requests]
    assert result.extra["segment_admissions"] == sum(by_segment) >= 3  # admitted while rows decoded
    assert not any(by_segment[:slots])  # the first admissions find no row decoding: chunks
    for req, r in zip(requests, result.requests):
        assert len(r.accept_lengths) == r.rounds and sum(r.accept_lengths) >= len(r.output)  # decoding rounds only
        assert r.admitted <= r.first_token <= r.finished
    return result


@pytest.mark.parametrize("segment", [1, 4, 7])
@pytest.mark.parametrize("depth,topk,budget", [(4, 1, 4), (3, 3, 8)], ids=["chain", "tree"])
def test_draft_model_segments_equal_ar(target, draft, requests, ar_outputs, segment, depth, topk, budget):
    drafter = DraftModelDrafter(draft, depth, topk, budget, window=max(depth, segment) + 1)
    gen = Generator(target, {depth: drafter}, segment_tokens=segment)
    assert [r.output for r in serve(gen, requests).requests] == ar_outputs


def test_dflash_segments_equal_ar(target, requests, ar_outputs, tmp_path_factory):
    from specpilot.config import TreeConstruction
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import load_dflash, write_dflash

    out = tmp_path_factory.mktemp("dflash")
    write_dflash(random_dflash(target.config, num_layers=2, block_size=6, mask_token_id=5, seed=3), out,
                 dtype=torch.float32)
    for construction in (TreeConstruction.CHAIN, TreeConstruction.BEST_FIRST):
        drafter = DFlashDrafter(load_dflash(out, target), target, 6, 8, construction)
        gen = Generator(target, {5: drafter}, segment_tokens=6)
        assert [r.output for r in serve(gen, requests).requests] == ar_outputs


@pytest.mark.parametrize("shared,margin", [(0, 1), (4, 0), (3, 1)])
def test_batch_mechanisms_with_segments_equal_ar(target, draft, requests, ar_outputs, shared, margin):
    drafter = DraftModelDrafter(draft, 3, 3, 8, window=9, shared_budget=shared, row_depth_margin=margin)
    gen = Generator(target, {3: drafter}, segment_tokens=8)
    result = serve(gen, requests)
    assert [r.output for r in result.requests] == ar_outputs
    if shared:  # a prefilling row keeps its segment's nodes first: whole segments, never 1 token a round
        for req, r in zip(requests, result.requests):
            assert not r.by_segment or len(r.accept_lengths) == r.rounds


def test_a_shared_budget_keeps_a_segments_nodes_first(target, draft):
    """Under a shared budget a prefilling row gets the nodes its next segment needs, whatever its
    drafts score; its segment then fills them (the others share the rest)."""
    from specpilot.engine.selection import share_rows

    torch.manual_seed(2)
    prompts = [torch.randint(1, 4096, (n,)).tolist() for n in (20, 7, 9, 12)]
    drafter = DraftModelDrafter(draft, 3, 3, 8, window=9, shared_budget=2)
    drafter.configure(DrafterSettings(segment_tokens=6))
    state = DecodeState.allocate(4, 128, 8, "cpu")
    state.reset(prompts, (), 16)
    state.seq_lens[0] = 3  # row 0 in its prompt: 17 tokens to go, 6 per round
    state.done[3] = True
    assert share_rows(state, 6).tolist() == [6, 0, 0, -1]
    cache = KVCache.allocate(target.config, 4, 128, "cpu", torch.float32)
    prefill(target, cache, prompts)
    drafter.start(prompts, state)
    with torch.no_grad():
        tree = drafter.propose(state)
    counts = tree.valid.sum(1).tolist()
    assert counts[0] == 7 and counts[3] == 1 and sum(counts) <= tree.num_valid == 4 * 3
    seg, forced = segment_tree(tree, state, 6)
    assert forced.tolist() == [6, -1, -1, -1] and seg.valid[0].tolist() == [True] * 7 + [False] * 2


def _drafters(kind, target, draft, out, window):
    from specpilot.config import TreeConstruction
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import load_dflash, write_dflash
    from specpilot.models.eagle3 import random_eagle3
    from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3

    if kind == "model":
        return DraftModelDrafter(draft, 3, 2, 6, window=window)
    if kind == "dflash":
        write_dflash(random_dflash(target.config, num_layers=2, block_size=6, mask_token_id=5, seed=3), out,
                     dtype=torch.float32)
        return DFlashDrafter(load_dflash(out, target), target, 6, 8, TreeConstruction.BEST_FIRST)
    write_eagle3(random_eagle3(target.config, seed=3), out, dtype=torch.float32)
    return Eagle3Drafter(load_eagle3(out, target), target, 3, 2, 6)


def _draft_kv(drafter):
    cache = getattr(drafter.cache, "kv", drafter.cache)  # EAGLE-3 keeps its K/V beside the root hidden
    return cache.k, cache.v


@pytest.mark.parametrize("kind", ["model", "dflash", "eagle3"])
def test_drafter_caches_follow_the_prompt(target, draft, tmp_path, kind):
    """After a 30-token prompt went in by 8-token segments, the drafter's own cache holds the
    prompt's entries as its prefill of the prompt writes them (a draft model whose catch-up
    window misses segment tokens fails this)."""
    torch.manual_seed(1)
    prompt = torch.randint(1, 4096, (30,)).tolist()
    other = torch.randint(1, 4096, (9,)).tolist()
    drafter = _drafters(kind, target, draft, tmp_path, window=9)
    gen = Generator(target, {drafter.depth: drafter}, segment_tokens=8)
    ws = gen.rounds.workspace(2, gen.capacity_for(30, 16), 16)
    ws.state.reset([[prompt[0]], other], (), max_new=16)
    gen.rounds.start_drafter(drafter.depth, [[prompt[0]], other], ws.state, gen.rounds.prefill(ws, [[prompt[0]], other]))
    ws.state.tokens[0, :30] = torch.tensor(prompt)
    ws.state.prompt_lens[0] = 30  # row 0: admitted by segments, one token committed
    while int(ws.state.seq_lens[0]) <= 30:
        gen.rounds.step(ws, drafter.depth)
    gen.rounds.step(ws, drafter.depth)  # the draft model catches up at the start of a round
    seg_k, seg_v = [[t[0, :, :29].clone() for t in kv] for kv in _draft_kv(drafter)]

    ref = Generator(target, {drafter.depth: drafter})
    ws2 = ref.rounds.workspace(1, gen.capacity_for(30, 16) + 256, 16)
    ws2.state.reset([prompt], (), max_new=16)
    ref.rounds.start_drafter(drafter.depth, [prompt], ws2.state, ref.rounds.prefill(ws2, [prompt]))
    ref_k, ref_v = [[t[0, :, :29] for t in kv] for kv in _draft_kv(drafter)]
    for a, b in zip(seg_k + seg_v, ref_k + ref_v):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_segment_fills_the_cache_like_a_prefill(target):
    """One round of a 5-token segment writes the same K/V as a chunk prefill of those tokens, and
    advances the row by the segment plus the next prompt token; a decoding row beside it is verified
    as usual."""
    torch.manual_seed(0)
    prompt = torch.randint(1, 4096, (12,)).tolist()
    other = torch.randint(1, 4096, (6,)).tolist()
    cap = 64
    ref = KVCache.allocate(target.config, 1, cap, target.device, target.dtype)
    prefill(target, ref, [prompt])  # slots 0..10

    cache = KVCache.allocate(target.config, 2, cap, target.device, target.dtype)
    state = DecodeState.allocate(2, cap, 16, target.device)
    state.reset([prompt, other], (), max_new=8)
    prefill(target, cache, [[prompt[0]], other])
    state.seq_lens[0] = 1  # row 0 admitted by segments: only its first token committed
    tokens = torch.tensor([[prompt[0], 7, 8, 9, 10, 11, 12], [other[-1], 1, 2, 3, 4, 5, 6]])
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 2]] * 2)
    tree = DraftTree(tokens, parents, max_depth=2)
    seg_tree, forced = segment_tree(tree, state, 5)
    assert forced.tolist() == [5, -1] and seg_tree.max_depth == 5
    assert seg_tree.tokens[0, :6].tolist() == prompt[:6] and seg_tree.parents[0].tolist() == [-1, 0, 1, 2, 3, 4, 0]
    assert seg_tree.depths()[0].tolist() == [0, 1, 2, 3, 4, 5, 1]
    assert torch.equal(seg_tree.tokens[1], tokens[1]) and torch.equal(seg_tree.depths()[1], tree.depths()[1])
    acc = verify_step(target, cache, state, tree, segment=5)
    assert state.seq_lens.tolist()[0] == 7 and int(acc.accept_len[0]) == 5
    assert state.tokens[0, :12].tolist() == prompt  # the prompt is untouched
    assert state.rounds.tolist()[0] == 0 and int(state.rounds[1]) == 1  # a prompt-only round is not logged
    for k, k_ref in zip(cache.k, ref.k):
        torch.testing.assert_close(k[0, :, :6], k_ref[0, :, :6], rtol=1e-5, atol=1e-5)
    for _ in range(2):  # the next segment (tokens 6..11) ends the prompt: its last token is generated
        verify_step(target, cache, state, tree, segment=5)
    assert int(state.seq_lens[0]) >= 13 and int(state.rounds[0]) >= 1
    expected = Generator(target).generate([prompt], 8, stop_at_eos=False).outputs[0]
    assert int(state.tokens[0, 12]) == expected[0]


def test_the_admission_rule_weighs_the_stall_against_the_prompt():
    from specpilot.engine.serving import by_segments

    assert by_segments(40, 7, 8) and not by_segments(80, 7, 8)  # 39/8 < 8 rows stalled; 79/8 > 8
    assert by_segments(200, 64, 4) and not by_segments(200, 7, 4)
    assert not by_segments(10, 7, 0) and not by_segments(1, 7, 8) and not by_segments(10, 0, 8)


def test_segment_needs_a_device_drafter(target, draft):
    with pytest.raises(ConfigError):
        Generator(target, segment_tokens=4)
    with pytest.raises(ConfigError):
        Generator(target, {4: NgramDrafter(4, 2, 6)}, segment_tokens=4)
    with pytest.raises(ConfigError):
        System("x", drafter=DrafterKind.NONE, segment_tokens=4)
    with pytest.raises(ConfigError):
        System("x", segment_tokens=-1)
    assert System("x", depth=3, segment_tokens=8).window == 9 and System("x", depth=3).window == 4


def test_lazy_sync_tiers_eos_inside_prompts(target, draft, requests, ar_outputs):
    """Rows leave their prompt between host syncs, depth tiers share the segment, and an EOS id
    inside a prompt stops nothing (only generated tokens do)."""
    tiers = {d: DraftModelDrafter(draft, d, 2, 2 * d, window=9) for d in (2, 4)}
    gen = Generator(target, tiers, sync_every=3, segment_tokens=8)
    assert [r.output for r in serve(gen, requests).requests] == ar_outputs
    eos = requests[6].prompt[3]  # a token of a prompt admitted by segments
    expected = [Generator(target, eos_ids=(eos,)).generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]
    spec = Generator(target, {3: DraftModelDrafter(draft, 3, 2, 6, window=9)}, eos_ids=(eos,), segment_tokens=8)
    result = serve(spec, requests)
    assert result.requests[6].by_segment and [r.output for r in result.requests] == expected
