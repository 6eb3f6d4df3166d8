"""Sliding-window layers over a ring of R = window + slack slots equal transformers (CPU float32):
long prefill chunks (attending over the ring as it was plus their own keys), short chunks and trees
(write, then attend), commits along a path, a reused row, and whole generations; the ring's memory
follows the window."""

import pytest
import torch

from specpilot.engine.generator import Generator
from specpilot.engine.steps import chunk_forward, tree_forward
from specpilot.engine.tree import DraftTree
from specpilot.models.loading import load_model
from specpilot.models.ring_cache import RING_SLACK, ring_slots

pytest.importorskip("transformers")
from tests.models.test_gemma import VARIANTS, WINDOW, hf_checkpoint, path_logits  # noqa: E402

CAPACITY = 512


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a - b).abs().max() <= 1e-5 * b.abs().max()


def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(tokens[None]).logits[0]


def test_ring_size_and_memory(tmp_path):
    hf_checkpoint(tmp_path / "m", "gemma3")
    ours = load_model(tmp_path / "m")
    assert ring_slots(WINDOW, CAPACITY, 12) == WINDOW + RING_SLACK
    assert ring_slots(WINDOW, CAPACITY, 100) == WINDOW + 100
    assert ring_slots(WINDOW, 64, 12) == 0  # no smaller than the cache: no ring
    cache = ours.new_cache(2, CAPACITY, nodes=12)
    full = ours.new_cache(2, CAPACITY, nodes=CAPACITY)
    assert cache.ring is not None and full.ring is None and cache.capacity == full.capacity == CAPACITY
    R = WINDOW + RING_SLACK
    sliding = [j for j, i in enumerate(ours.config.kv_layers) if i in ours.config.sliding_layers]
    assert all(cache.k[j].shape[2] == R for j in sliding) and cache.k[2].shape[2] == CAPACITY  # layer 2 global
    assert not cache.packable and full.packable
    per_slot = full.nbytes() // CAPACITY  # 3 sliding layers of 4 keep R slots
    assert cache.nbytes() < full.nbytes() - 3 * (CAPACITY - R) * per_slot // 4 + 2 * R * 8 + 1


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chunks_trees_and_commits_through_the_ring(tmp_path, variant):
    """A 100-token chunk (longer than the slack), a 49-token chunk, a 12-node tree, its path
    committed, then a second tree: every logit as transformers computes it on the same tokens."""
    hf = hf_checkpoint(tmp_path / "m", variant)
    ours = load_model(tmp_path / "m")
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 4096, (150,), generator=g)
    cache = ours.new_cache(1, CAPACITY, nodes=12)
    assert cache.ring is not None and cache.ring.slack == RING_SLACK
    ref = hf_logits(hf, prompt)
    with torch.no_grad():
        first = chunk_forward(ours, cache, prompt[None, :100], torch.zeros(1, dtype=torch.long))[0]
        second = chunk_forward(ours, cache, prompt[None, 100:149], torch.tensor([100]))[0]
    close(first, ref[:100])
    close(second, ref[100:149])
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 5, 6, 8, 9, 10]])
    tokens = torch.randint(0, 4096, parents.shape, generator=g)
    tokens[0, 0] = prompt[-1]
    tree = DraftTree(tokens, parents, max_depth=7)
    with torch.no_grad():
        logits = tree_forward(ours, cache, tree, torch.tensor([149]))[0]  # [N,V]
    close(logits, path_logits(hf, prompt[:-1], tree))
    # accept the path 0 -> 1 -> 3 -> 6 -> 8: its nodes' entries move to slots 150.. (the root is at 149)
    path = torch.tensor([[0, 1, 3, 6, 8, -1, -1, -1]])
    cache.commit_path(torch.tensor([149]), path, torch.tensor([4]))
    committed = torch.cat([prompt, tokens[0, [1, 3, 6, 8]]])  # 154 tokens; the next root is the last
    tokens2 = torch.randint(0, 4096, parents.shape, generator=g)
    tokens2[0, 0] = committed[-1]
    tree2 = DraftTree(tokens2, parents, max_depth=7)
    with torch.no_grad():
        logits2 = tree_forward(ours, cache, tree2, torch.tensor([153]))[0]
    close(logits2, path_logits(hf, committed[:-1], tree2))


def test_a_reused_row_sees_nothing_of_its_earlier_request(tmp_path):
    hf = hf_checkpoint(tmp_path / "m", "gemma4_shared")
    ours = load_model(tmp_path / "m")
    g = torch.Generator().manual_seed(4)
    old, new = torch.randint(0, 4096, (100,), generator=g), torch.randint(0, 4096, (40,), generator=g)
    cache = ours.new_cache(1, CAPACITY, nodes=12)
    with torch.no_grad():
        chunk_forward(ours, cache, old[None], torch.zeros(1, dtype=torch.long))  # the ring holds slots 28..99
        short = chunk_forward(ours, cache, new[None, :30], torch.zeros(1, dtype=torch.long))[0]  # write mode
        chunk_forward(ours, cache, old[None], torch.zeros(1, dtype=torch.long))
        # 80 tokens from slot 0: the ring's entries of slots 28..79 are the old request's, not these
        long = chunk_forward(ours, cache, torch.cat([new, new])[None], torch.zeros(1, dtype=torch.long))[0]
    close(short, hf_logits(hf, new[:30]))
    close(long, hf_logits(hf, torch.cat([new, new])))


def test_generations_through_the_ring_equal_transformers(tmp_path):
    """AR and EAGLE-3-free speculation (a draft model of the same checkpoint) over prompts longer
    than the slack, twice through one generator (its workspace, ring included, reused)."""
    from specpilot.engine.drafters.draft_model import DraftModelDrafter

    hf = hf_checkpoint(tmp_path / "m", "gemma3")
    ours = load_model(tmp_path / "m")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (90, 20)]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None)[0, len(p):]
                .tolist() for p in prompts]
    ar = Generator(ours)
    spec = Generator(ours, {4: DraftModelDrafter(ours, depth=4, topk=2, tree_budget=8)})
    for gen in (ar, spec):
        for _ in range(2):
            assert gen.generate(prompts, 24, stop_at_eos=False).outputs == want
        (ws,) = gen.workspaces.values()
        assert ws.cache.ring is not None
