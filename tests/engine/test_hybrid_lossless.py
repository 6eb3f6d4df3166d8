"""Speculative decoding on a hybrid Gated DeltaNet target is lossless (CPU float32).

1. Tree logits: for random trees over a committed prefix, every node's logits from one tree
   forward equal those of a plain sequential decode of its root path (to float32 rounding), and
   committing an accepted path leaves the cache as that sequential decode leaves it.
2. Every drafter gives AR's tokens: the draft model (chains, best-first trees, a shared budget,
   per-row depth caps), n-gram, EAGLE-3, DFlash with DDTree; batched and one request at a time.
   The draft model is the target without its token mixers (`write_mixerless_drafter`), so rounds
   accept several tokens and commits run over long paths.
3. Continuous batching: more requests than slots, prompts over several syncs, segment admission:
   every request's tokens equal its single-request decode (a reused row carries no state over).
"""

import pytest
import torch

from specpilot.config import TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.steps import ar_step, prefill, tree_forward
from specpilot.engine.state import DecodeState
from specpilot.engine.tree import DraftTree
from specpilot.engine.verify import Acceptance, commit
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import load_dflash, write_dflash
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_hybrid_config, write_mixerless_drafter, write_random_hybrid
from specpilot.models.recurrence import Recurrence

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    target = write_random_hybrid(root / "target", tiny_hybrid_config("qwen3_next"), seed=0, mixer_scale=0.3)
    return target, write_mixerless_drafter(target, root / "drafter")


@pytest.fixture(scope="module")
def target(dirs):
    return load_model(dirs[0])


@pytest.fixture(scope="module")
def draft(dirs):
    return load_model(dirs[1])


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(7)
    lens = [1, 2, 5, 9, 17, 30, 44, 3]
    return [torch.randint(1, 4096, (n,), generator=g).tolist() for n in lens]


@pytest.fixture(scope="module")
def ar_outputs(target, prompts):
    return Generator(target).generate(prompts, NEW_TOKENS).outputs


def random_tree(B: int, N: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, N), -1, dtype=torch.int64)
    for j in range(1, N):
        parents[:, j] = torch.randint(0, j, (B,), generator=g)
    tokens = torch.randint(1, 4096, (B, N), generator=g)
    return DraftTree(tokens, parents, max_depth=N - 1)


def root_path(parents, node):
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def sequential(target, body, path_tokens):
    """Logits [len, V] of each token of `path_tokens` decoded one at a time after the committed
    `body` (AR steps), and the cache they leave."""
    cache = target.new_cache(1, 128)
    prefill(target, cache, [body + [0]])  # puts `body` into the cache
    out = []
    for i, t in enumerate(path_tokens):
        pos = torch.tensor([[len(body) + i]])
        mask = (torch.arange(128)[None, :] <= pos)[:, None, None, :]
        out.append(target(torch.tensor([[t]]), pos, cache, pos, mask, recurrence=Recurrence.chunk(torch.tensor([0])))[0, 0])
    return torch.stack(out), cache


@pytest.mark.parametrize("N", [1, 8, 33])
def test_every_tree_node_sees_the_state_of_its_own_root_path(target, N):
    torch.manual_seed(0)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [7]]
    B = len(prompts)
    tree = random_tree(B, N, seed=N)
    cache = target.new_cache(B, 128, nodes=N)
    prefill(target, cache, prompts)
    tree.tokens[:, 0] = torch.tensor([p[-1] for p in prompts])  # the root: each prompt's last token
    prefix = torch.tensor([len(p) - 1 for p in prompts])
    with torch.no_grad():
        logits = tree_forward(target, cache, tree, prefix)  # [B,N,V]
    for b, p in enumerate(prompts):
        for j in range(N):
            path = root_path(tree.parents[b], j)
            want, _ = sequential(target, p[:-1], tree.tokens[b, path].tolist())
            # the same ops per node; attention reductions over other cache shapes round differently
            assert (logits[b, j] - want[-1]).abs().max() <= 1e-5 * want.abs().max(), (b, j)


def test_commit_leaves_the_cache_of_a_sequential_decode(target):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    N = 12
    tree = random_tree(1, N, seed=5)
    tree.tokens[0, 0] = prompt[-1]
    cache = target.new_cache(1, 128, nodes=N)
    prefill(target, cache, [prompt])
    prefix = torch.tensor([len(prompt) - 1])
    with torch.no_grad():
        tree_forward(target, cache, tree, prefix)
    node = N - 1
    path = root_path(tree.parents[0], node)
    K = tree.max_depth
    acc = Acceptance(torch.tensor([len(path) - 1]), torch.tensor([path + [-1] * (K + 1 - len(path))]),
                     torch.zeros(1, K + 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    commit(cache, prefix, acc, torch.tensor([True]))
    _, ref = sequential(target, prompt[:-1], tree.tokens[0, path].tolist())
    # a layer's inputs differ from the sequential decode's by the rounding of the layers below it
    assert (cache.state_stack - ref.state_stack).abs().max() <= 1e-5 * ref.state_stack.abs().max()
    assert (cache.window_stack - ref.window_stack).abs().max() <= 1e-5 * ref.window_stack.abs().max()
    L = len(prompt) + len(path) - 1
    for a, b in zip(cache.k + cache.v, ref.k + ref.v):
        assert (a[..., :L, :] - b[..., :L, :]).abs().max() <= 1e-5 * b.abs().max()


def test_an_inactive_row_keeps_its_state(target):
    cache = target.new_cache(2, 64, nodes=4)
    prefill(target, cache, [[1, 2, 3], [4, 5, 6]])
    before = cache.state_stack.clone(), cache.window_stack.clone()
    state = DecodeState.allocate(2, 64, 8, "cpu")
    state.reset([[1, 2, 3], [4, 5, 6]], (), 8)
    state.done[1] = True
    with torch.no_grad():
        ar_step(target, cache, state)
    assert torch.equal(cache.state_stack[:, 1], before[0][:, 1]) and torch.equal(cache.window_stack[:, 1], before[1][:, 1])
    assert not torch.equal(cache.state_stack[:, 0], before[0][:, 0])


def identical(expected, result):
    for i, (e, g) in enumerate(zip(expected, result.outputs)):
        assert e == g, f"prompt {i}: first divergence at {next(j for j, (a, b) in enumerate(zip(e, g)) if a != b)}"


@pytest.mark.parametrize("depth,topk,budget,shared,margin", [
    (1, 1, 1, 0, 0), (5, 1, 5, 0, 0), (3, 3, 12, 0, 0), (5, 4, 32, 0, 0), (5, 4, 16, 8, 0), (5, 4, 16, 0, 1)])
def test_draft_model_is_lossless(target, draft, prompts, ar_outputs, depth, topk, budget, shared, margin):
    gen = Generator(target, {depth: DraftModelDrafter(draft, depth, topk, budget, shared_budget=shared,
                                                      row_depth_margin=margin)})
    result = gen.generate(prompts, NEW_TOKENS)
    identical(ar_outputs, result)
    assert result.mean_accepted_length > 1.3  # rounds accept paths, so commits run over them


def test_single_requests_equal_the_batch(target, draft, prompts, ar_outputs):
    gen = Generator(target, {4: DraftModelDrafter(draft, 4, 3, 12)})
    for p, want in zip(prompts, ar_outputs):
        assert gen.generate([p], NEW_TOKENS).outputs[0] == want


def test_ngram_is_lossless(target, prompts, ar_outputs):
    identical(ar_outputs, Generator(target, {4: NgramDrafter(4, 2, 8)}).generate(prompts, NEW_TOKENS))


def test_eagle3_is_lossless(target, prompts, ar_outputs, tmp_path):
    write_eagle3(random_eagle3(target.config, seed=3), tmp_path / "e3", dtype=torch.float32)
    head = load_eagle3(tmp_path / "e3", target)
    for depth, topk, budget in [(1, 1, 1), (5, 4, 16)]:
        identical(ar_outputs, Generator(target, {depth: Eagle3Drafter(head, target, depth, topk, budget)})
                  .generate(prompts, NEW_TOKENS))


@pytest.mark.parametrize("construction", [TreeConstruction.CHAIN, TreeConstruction.BEST_FIRST])
def test_dflash_is_lossless(target, prompts, ar_outputs, tmp_path, construction):
    write_dflash(random_dflash(target.config, num_layers=1, block_size=8, mask_token_id=5, seed=3), tmp_path / "df",
                 dtype=torch.float32)
    dflash = load_dflash(tmp_path / "df", target)
    gen = Generator(target, {7: DFlashDrafter(dflash, target, 8, 16, construction)})
    identical(ar_outputs, gen.generate(prompts, NEW_TOKENS))


@pytest.mark.parametrize("drafted,segments", [(False, 0), (True, 0), (True, 4)])
def test_continuous_batching_reuses_rows_without_leaks(target, draft, prompts, drafted, segments):
    g = torch.Generator().manual_seed(3)
    requests = [Request(tuple(p), max_new=int(torch.randint(4, 20, (1,), generator=g))) for p in prompts]
    drafters = {4: DraftModelDrafter(draft, 4, 3, 12)} if drafted else None
    gen = Generator(target, drafters, segment_tokens=segments)
    want = [gen.generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]
    engine = ServingEngine(gen, 3, prefill_chunk=7, always_segments=bool(segments))
    got = engine.run(requests)
    assert [r.output for r in got.requests] == want
