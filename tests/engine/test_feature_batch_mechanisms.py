"""The batch mechanisms with the feature-conditioned drafters: a shared node budget and per-request
depth for EAGLE-3 and DFlash (per-request block depth among 1/2, 3/4 and all of the block).

CPU float32 on the shipped fixture target with its trained drafters (`fixture-eagle3`,
`fixture-dflash`), so drafts are often right and the mechanisms change what is accepted:
- lossless: batched prompts of mixed lengths decode to AR's tokens with each knob on, both as a
  static batch (`Generator.generate`) and under continuous batching (`ServingEngine.run`);
- a shared budget as large as the tree budget keeps every node but still packs the verify
  forward, capturing features from it: it must accept exactly as the unshared drafter does (wrong
  or missing features of the packed nodes would change what the drafter drafts next);
- the depth cap changes the trees: a row that accepted little drafts no deeper than its cap
  (EAGLE-3: ceil(mean) + margin; DFlash: that rounded up to a tier), the same row without a cap
  drafts deeper.
"""

import pytest
import torch

from specpilot.config import DrafterKind, System, TreeConstruction, load_deployment, load_system
from specpilot.engine.drafters.dflash import DFlashDrafter, depth_tiers
from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.generator import Generator
from specpilot.models.kv_cache import KVCache
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.session import Session
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import prefill
from specpilot.errors import ConfigError
from specpilot.models.dflash_checkpoint import load_dflash
from specpilot.models.eagle3_checkpoint import load_eagle3
from specpilot.models.fixture import fixture_path, resolve_checkpoint
from specpilot.models.loading import load_model
from specpilot.models.tokenizer import Tokenizer

NEW_TOKENS = 40
TEXTS = (
    "def add(a, b):",
    "Question: what is 12 times 7?\nAnswer:",
    "The history of the city begins in the",
    "import numpy as np\n\ndef mean(xs):\n    return",
    "Once upon a time there was a little girl who lived in a village near the forest. One day her mother",
)


@pytest.fixture(scope="module")
def target():
    return load_model(fixture_path("target"))


@pytest.fixture(scope="module")
def head(target):
    return load_eagle3(resolve_checkpoint("fixture-eagle3", "drafter"), target)


@pytest.fixture(scope="module")
def dflash(target):
    return load_dflash(resolve_checkpoint("fixture-dflash", "drafter"), target)


@pytest.fixture(scope="module")
def prompts():
    tok = Tokenizer.from_dir(fixture_path("target"))
    return [tok.encode(t) for t in TEXTS]  # 7 to 32 tokens


@pytest.fixture(scope="module")
def ar_outputs(target, prompts):
    return Generator(target).generate(prompts, NEW_TOKENS).outputs


def make(kind, target, head, dflash, shared=0, margin=0, budget=None, construction=TreeConstruction.BEST_FIRST):
    if kind is DrafterKind.EAGLE3:
        return Eagle3Drafter(head, target, 4, 2, budget or 8, shared_budget=shared, row_depth_margin=margin)
    return DFlashDrafter(dflash, target, 16, budget or 16, construction, shared_budget=shared, row_depth_margin=margin)


CASES = [
    pytest.param(DrafterKind.EAGLE3, 3, 0, TreeConstruction.BEST_FIRST, id="eagle3-shared"),
    pytest.param(DrafterKind.EAGLE3, 0, 1, TreeConstruction.BEST_FIRST, id="eagle3-depth"),
    pytest.param(DrafterKind.DFLASH, 6, 0, TreeConstruction.BEST_FIRST, id="dflash-shared"),
    pytest.param(DrafterKind.DFLASH, 0, 1, TreeConstruction.BEST_FIRST, id="dflash-depth"),
    pytest.param(DrafterKind.DFLASH, 5, 1, TreeConstruction.CHAIN, id="dflash-chain-shared-depth"),
]


@pytest.mark.parametrize("kind,shared,margin,construction", CASES)
def test_static_and_continuous_batching_are_lossless(target, head, dflash, prompts, ar_outputs, kind, shared,
                                                     margin, construction):
    budget = 15 if construction is TreeConstruction.CHAIN else None
    drafter = make(kind, target, head, dflash, shared, margin, budget, construction)
    gen = Generator(target, {drafter.depth: drafter})
    result = gen.generate(prompts, NEW_TOKENS)
    assert result.outputs == ar_outputs
    assert result.mean_accepted_length > 1.5  # the drafter is right often: the mechanism had work to do
    requests = [Request(tuple(p), NEW_TOKENS - 8 * (i % 3)) for i, p in enumerate(prompts + prompts[:2])]
    served = ServingEngine(gen, 3, prefill_chunk=8).run(requests)  # admissions mid-decode
    expected = [ar_outputs[i % len(prompts)][: r.max_new] for i, r in enumerate(requests)]
    assert [r.output for r in served.requests] == expected
    if margin:  # no round accepted more drafts than its row's cap allowed, and some were capped
        tiers = depth_tiers(16) if kind is DrafterKind.DFLASH else (drafter.depth,)
        logs = result.accept_lengths + [r.accept_lengths for r in served.requests]
        assert all(within_caps(log, margin, tiers) for log in logs)
        assert any(cap < drafter.depth for log in logs for cap in caps_of(log, margin, tiers))


def caps_of(log: list[int], margin: int, tiers: tuple[int, ...]) -> list[int]:
    """Each round's depth cap from the row's previous rounds (the rule, re-derived on the host)."""
    caps = []
    for r in range(len(log)):
        prev = [c - 1 for c in log[max(0, r - 4): r]]
        need = min(tiers[-1], max(1, -(-sum(prev) // len(prev)) + margin)) if prev else tiers[-1]
        caps.append(min(t for t in tiers if t >= need) if len(tiers) > 1 else need)
    return caps


def within_caps(log: list[int], margin: int, tiers: tuple[int, ...]) -> bool:
    return all(c - 1 <= cap for c, cap in zip(log, caps_of(log, margin, tiers)))


@pytest.mark.parametrize("kind", [DrafterKind.EAGLE3, DrafterKind.DFLASH])
def test_a_full_shared_budget_packs_and_captures_like_the_unpacked_forward(target, head, dflash, prompts, kind):
    plain = make(kind, target, head, dflash)
    full = make(kind, target, head, dflash, shared=plain.budget)  # every node kept, the forward still packed
    a = Generator(target, {plain.depth: plain}).generate(prompts, NEW_TOKENS)
    b = Generator(target, {full.depth: full}).generate(prompts, NEW_TOKENS)
    assert a.outputs == b.outputs and a.accept_lengths == b.accept_lengths


def test_packed_forward_captures_the_packed_rows_features(target):
    B, T, S = 2, 4, 16
    tokens = torch.randint(1, 4096, (B, T), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [3]])
    mask = torch.arange(S)[None, None, None, :] <= pos[:, None, :, None]
    layers = (-1, 2, target.config.num_layers - 1)
    with torch.no_grad():
        _, full = target(tokens, pos, KVCache.allocate(target.config, B, S, "cpu", torch.float32), pos, mask,
                         capture=layers)
        keep = torch.tensor([0, 1, 4])  # row 0: two tokens, row 1: one
        logits, packed = target(tokens, pos, KVCache.allocate(target.config, B, S, "cpu", torch.float32), pos, mask,
                                capture=layers, pack=keep)
    assert logits.shape[:2] == (1, 3) and packed.shape == full.shape
    flat_full, flat_packed = full.reshape(B * T, -1), packed.reshape(B * T, -1)
    torch.testing.assert_close(flat_packed[keep], flat_full[keep], rtol=1e-5, atol=1e-5)
    assert not flat_packed[[2, 3, 5, 6, 7]].any()  # rows left out: zeros


def propose(target, drafter, prompts, logs):
    """One round's tree with the acceptance log `logs` {row: tokens committed per past round}."""
    B = len(prompts)
    state = DecodeState.allocate(B, 128, 16, "cpu")
    state.reset(prompts, (), 16)
    for b, counts in logs.items():
        state.rounds[b] = len(counts)
        state.accept_log[b, : len(counts)] = torch.tensor(counts)
    cache = KVCache.allocate(target.config, B, 128, "cpu", torch.float32)
    with torch.no_grad():
        features = prefill(target, cache, prompts, capture=drafter.feature_layers)
        drafter.start(prompts, state, features)
        return drafter.propose(state)


def deepest_valid(tree) -> list[int]:
    valid = tree.valid if tree.valid is not None else torch.ones_like(tree.tokens, dtype=torch.bool)
    return torch.where(valid, tree.depths(), torch.zeros_like(tree.depths())).max(1).values.tolist()


LOGS = {0: [1, 1, 1, 1], 1: [2, 1, 2, 1]}  # row 0 accepted no draft lately, row 1 half a draft; row 2: no round


def test_dflash_block_depth_follows_each_rows_acceptance(target, head, dflash, prompts):
    """(Best-first block trees under a cap: tests/engine/test_ddtree.py; in decoding: the lossless test.)"""
    rows = prompts[:3]
    capped = make(DrafterKind.DFLASH, target, head, dflash, margin=1, budget=15, construction=TreeConstruction.CHAIN)
    free = make(DrafterKind.DFLASH, target, head, dflash, budget=15, construction=TreeConstruction.CHAIN)
    assert depth_tiers(16) == (7, 11, 15)
    got, ref = deepest_valid(propose(target, capped, rows, LOGS)), deepest_valid(propose(target, free, rows, LOGS))
    # row 0: ceil(0) + 1 = 1 -> tier 7; row 1: ceil(0.5) + 1 = 2 -> tier 7; row 2 (no round) the whole block
    assert got == [7, 7, 15] and ref == [15, 15, 15]  # the chain stops at the tier; its tail is padding
    many = {0: [9, 9, 9, 9], 1: [7, 8, 9, 9]}  # 8 and 7.25 -> 9 and 9 -> tier 11
    assert capped.depth_caps(state_with(many, 3)).tolist() == [11, 11, 15]


def state_with(logs: dict, B: int) -> DecodeState:
    state = DecodeState.allocate(B, 64, 16, "cpu")
    state.reset([[1, 2]] * B, (), 16)
    for b, counts in logs.items():
        state.rounds[b] = len(counts)
        state.accept_log[b, : len(counts)] = torch.tensor(counts)
    return state


def test_eagle3_depth_follows_each_rows_acceptance(target, head, dflash, prompts):
    rows = prompts[:3]
    capped = propose(target, make(DrafterKind.EAGLE3, target, head, dflash, margin=1), rows, LOGS)
    free = propose(target, make(DrafterKind.EAGLE3, target, head, dflash), rows, LOGS)
    got, ref = deepest_valid(capped), deepest_valid(free)
    assert got[:2] == [1, 2] and ref[0] > 1 and ref[1] > 2  # 8 nodes of topk 2 cannot all sit at depth 1
    assert got[2] == ref[2]
    shared = propose(target, make(DrafterKind.EAGLE3, target, head, dflash, shared=3, margin=1), rows, LOGS)
    assert deepest_valid(shared)[0] <= 1 and int(shared.valid.sum()) == 3 * (1 + 3)


def test_the_session_passes_the_knobs_to_the_feature_drafters():
    dep = load_deployment("fixture-dflash")  # loads the DFlash drafter and the EAGLE-3 head
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    for kind in (DrafterKind.EAGLE3, DrafterKind.DFLASH):
        system = load_system("stock", dep).with_changes(drafter=kind, tree_budget=8, shared_budget=3, row_depth_margin=2)
        (drafter,) = session.generator(system).drafters.values()
        assert (drafter.shared, drafter.row_depth_margin) == (3, 2), kind


def test_knobs_are_accepted_for_feature_drafters_only_where_they_apply():
    for kind in (DrafterKind.EAGLE3, DrafterKind.DFLASH):
        System(drafter=kind, shared_budget=4, row_depth_margin=1)
    System(drafter=DrafterKind.DFLASH, tree_construction=TreeConstruction.SPINE_FIRST, row_depth_margin=1)
    with pytest.raises(ConfigError, match="shared_budget needs .* got drafter = 'dflash', tree_construction"):
        System(drafter=DrafterKind.DFLASH, tree_construction=TreeConstruction.SPINE_FIRST, shared_budget=4)
    with pytest.raises(ConfigError, match="row_depth_margin needs drafter"):
        System(drafter=DrafterKind.NGRAM, row_depth_margin=1)
