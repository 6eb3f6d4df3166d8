"""EAGLE-3 drafting is token-identical to AR decoding on CPU float32.

Randomly initialised heads, written in the public checkpoint layout and loaded back — one over
the full vocabulary without d2t/t2d, one over a reduced draft vocabulary with them — draft chains
and best-first trees at budgets 1, 8, 32 and 64; 20 prompts x 128 new tokens, batched and one
request at a time (the larger budgets are marked slow).

A random head is rarely right, and verification keeps the output exact whatever it drafts, so
`test_catch_up_equals_from_scratch` checks the feature path itself: after a run, the head's cache
and root hidden state built round by round from the accepted paths' features equal those built
from scratch from the target's features of the committed sequence; `test_long_accepted_paths_...`
does the same when an oracle makes rounds accept long paths.
"""

import pytest
import torch

from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.generator import Generator
from specpilot.models.kv_cache import KVCache
from specpilot.engine.steps import prefill
from specpilot.engine.tree import DraftTree
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3

from tests.engine.test_lossless import N_PROMPTS, NEW_TOKENS, assert_identical


@pytest.fixture(scope="module")
def heads(target, tmp_path_factory):
    """{"full": no d2t/t2d in the files, "reduced": a 1000-token draft vocabulary}, loaded back."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("eagle3")
    vocab = torch.randperm(4096, generator=torch.Generator().manual_seed(1))[:1000].sort().values
    write_eagle3(random_eagle3(target.config, seed=3), out / "full", dtype=torch.float32)
    file = str(out / "full" / "model.safetensors")
    save_file({k: v for k, v in load_file(file).items() if k not in ("d2t", "t2d")}, file)
    write_eagle3(random_eagle3(target.config, draft_vocab=vocab, seed=4), out / "reduced", dtype=torch.float32)
    return {name: load_eagle3(out / name, target) for name in ("full", "reduced")}


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 48, (N_PROMPTS,), generator=g)
    return [torch.randint(1, 4096, (int(L),), generator=g).tolist() for L in lens]


@pytest.fixture(scope="module")
def ar_outputs(target, prompts):
    return Generator(target).generate(prompts, NEW_TOKENS).outputs


SHAPES = [(1, 1, 1), (6, 1, 6), (5, 4, 8), (6, 4, 32), (5, 4, 64)]  # (depth, topk, budget)
CASES = [
    pytest.param(h, *shape, marks=[] if (h, shape) in (("full", (1, 1, 1)), ("reduced", (5, 4, 8))) else [pytest.mark.slow],
                 id=f"{h}-d{shape[0]}k{shape[1]}n{shape[2]}")
    for h in ("full", "reduced") for shape in SHAPES
    # the two widest trees once each, one per head: the cross of both adds CI time, not a new case
    if (h, shape) not in (("full", (6, 4, 32)), ("reduced", (5, 4, 64)))
]


@pytest.mark.parametrize("head,depth,topk,budget", CASES)
def test_eagle3_batched_equals_ar(target, heads, prompts, ar_outputs, head, depth, topk, budget):
    gen = Generator(target, {depth: Eagle3Drafter(heads[head], target, depth, topk, budget)})
    result = gen.generate(prompts, NEW_TOKENS)
    assert_identical(target, prompts, ar_outputs, result)
    assert max(a for row in result.accept_lengths for a in row) <= depth + 1


@pytest.mark.parametrize("head", ["full", "reduced"])
def test_eagle3_single_requests_equal_ar(target, heads, prompts, ar_outputs, head):
    gen = Generator(target, {4: Eagle3Drafter(heads[head], target, 4, 3, 10)})
    for p, e in zip(prompts[:3], ar_outputs[:3]):
        assert gen.generate([p], NEW_TOKENS).outputs == [e]


def assert_matches_scratch(target, head, drafter, state):
    """The head's committed K/V (every row) and root hidden (rows still active in the last round:
    a finished row's state is no longer maintained) equal those built from the committed tokens."""
    L = state.seq_lens.tolist()
    committed = [state.tokens[b, : L[b]].tolist() for b in range(state.batch)]
    fresh = KVCache.allocate(target.config, state.batch, state.capacity, "cpu", torch.float32)
    scratch = Eagle3Drafter(head, target, 1, 1, 1)
    with torch.inference_mode():
        scratch.start(committed, state, prefill(target, fresh, committed, capture=head.feature_layers))
        for b, n in enumerate(L):
            for ours, ref in ((drafter.cache.kv.k[0], scratch.cache.kv.k[0]), (drafter.cache.kv.v[0], scratch.cache.kv.v[0])):
                assert (ours[b, :, : n - 1] - ref[b, :, : n - 1]).abs().max() < 1e-4
        last = state.rounds == state.rounds.max()
        ours = torch.log_softmax(head.logits(drafter.cache.root_hidden[last]), -1)
        ref = torch.log_softmax(head.logits(scratch.cache.root_hidden[last]), -1)
    assert (ours - ref).abs().max() < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_catch_up_equals_from_scratch(target, heads, prompts):
    drafter = Eagle3Drafter(heads["reduced"], target, 4, 2, 6)
    gen = Generator(target, {4: drafter})
    gen.generate(prompts[:4], 60)
    assert_matches_scratch(target, heads["reduced"], drafter, next(iter(gen.workspaces.values())).state)


class OracleDrafter(Eagle3Drafter):
    """Runs the real expansion, then proposes the AR continuation (known in advance) as a chain,
    so rounds accept long paths; the head's cache is still filled by the real `observe`."""

    def __init__(self, *args, continuation, **kw):
        super().__init__(*args, **kw)
        self.continuation = continuation  # per row: prompt + AR output

    def propose(self, state, host_tokens=None):
        super().propose(state)
        K = self.depth
        rows = []
        for b in range(state.batch):
            L = int(state.seq_lens[b])
            nxt = (self.continuation[b][L : L + K] + [0] * K)[:K]
            if b % 2:  # odd rows: the last depth is wrong
                nxt[-1] = (nxt[-1] + 1) % 4096
            rows.append([int(state.tokens[b, L - 1])] + nxt)
        return DraftTree.chain(torch.tensor(rows))


def test_long_accepted_paths_stay_exact_and_keep_the_cache_right(target, heads, prompts, ar_outputs):
    rows = prompts[:6]
    full = [p + o for p, o in zip(rows, ar_outputs[:6])]
    drafter = OracleDrafter(heads["full"], target, 6, 2, 6, continuation=full)
    gen = Generator(target, {6: drafter})
    result = gen.generate(rows, NEW_TOKENS)
    assert_identical(target, rows, ar_outputs[:6], result)
    assert result.mean_accepted_length > 5
    assert_matches_scratch(target, heads["full"], drafter, next(iter(gen.workspaces.values())).state)


def test_bucketed_prompt_forwards_fill_the_head_as_unpadded_ones(target, heads, prompts, ar_outputs):
    """With prompt forwards padded to a bucket (as on a GPU: a bounded set of attention shapes), the
    head's prompt slots and root hidden equal the unpadded ones, and outputs stay AR's, batched
    and under continuous batching (prompts admitted in chunks mid-decode)."""
    from specpilot.engine.serving import Request, ServingEngine

    head = heads["reduced"]
    few = prompts[:6]
    states = []
    for bucket in (0, 16):
        d = Eagle3Drafter(head, target, 4, 3, 12)
        gen = Generator(target, {4: d}, prefill_bucket=bucket)
        assert d.settings.prefill_bucket == bucket
        ws = gen.rounds.workspace(len(few), gen.capacity_for(max(map(len, few)), 8), 8)
        ws.state.reset(few, (), max_new=8)
        gen.rounds.start_drafter(4, few, ws.state, gen.rounds.prefill(ws, few))
        L = [len(p) - 1 for p in few]  # filled slots per row
        states.append(([d.cache.kv.k[0][b, :, : L[b]].clone() for b in range(len(few))], d.cache.root_hidden.clone()))
        assert gen.generate(prompts, NEW_TOKENS).outputs == ar_outputs
        served = ServingEngine(gen, 3, prefill_chunk=5).run([Request(tuple(p), NEW_TOKENS) for p in prompts[:8]])
        assert [r.output for r in served.requests] == ar_outputs[:8]
    (k0, h0), (k1, h1) = states
    for a, b in zip(k0, k1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h0, h1, rtol=1e-5, atol=1e-5)
