"""Continuous batching on a CUDA GPU (`pytest -m gpu`): with CUDA graphs on and each batch mechanism
(segment admission, a shared node budget, per-request depth), rounds attending over spans of the
cache, every request's output equals its single-request AR output token for token in float32
(TF32 off), for the draft model and EAGLE-3."""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.generator import Generator
from specpilot.engine.serving import ServingEngine
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.loading import load_model

from tests.conftest import random_requests

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def requests():
    """10 requests, prompt lengths 1..60, token limits 8..40: most are admitted while others decode."""
    return random_requests(10, seed=9, max_len=60, new_tokens=(8, 40), one_token_at=4)


def drafter(kind, target, drafter_dir, shared, margin):
    if kind == "model":
        draft = load_model(drafter_dir, device="cuda", dtype=torch.float32)
        return DraftModelDrafter(draft, 4, 3, 12, window=9, shared_budget=shared, row_depth_margin=margin)
    vocab = torch.randperm(4096, generator=torch.Generator().manual_seed(1))[:1000].sort().values
    head = random_eagle3(target.config, draft_vocab=vocab, seed=3)
    head = head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    return Eagle3Drafter(head, target, 4, 3, 12, shared_budget=shared, row_depth_margin=margin)


@pytest.mark.parametrize("shared,margin,segment", [(0, 0, 8), (5, 0, 0), (0, 1, 0), (5, 1, 8)],
                         ids=["segments", "shared", "depth", "all"])
@pytest.mark.parametrize("kind", ["model", "eagle3"])
def test_graphed_serving_equals_ar(target_dir, drafter_dir, requests, full_precision, kind, shared, margin, segment):
    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    ar = Generator(target, cuda_graphs=False)
    expected = [ar.generate([list(r.prompt)], r.max_new).outputs[0] for r in requests]
    d = drafter(kind, target, drafter_dir, shared, margin)
    gen = Generator(target, {d.depth: d}, cuda_graphs=True, segment_tokens=segment, attention_span=64)
    assert gen.use_graphs
    result = ServingEngine(gen, 4, prefill_chunk=16, always_segments=bool(segment)).run(requests)
    assert [r.output for r in result.requests] == expected
    assert any(k != "all" for k in result.extra["attention_spans"])  # rounds replayed a span's graph
    if segment:
        assert result.extra["segment_admissions"] >= 3


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_packed_prefill_equals_rowwise_on_cuda(target_dir, full_precision, graphed):
    """Packed prefill on CUDA (bucket 64, the fused attention kernels over the packing cache), eager
    or replayed as CUDA graphs, writes each row's K/V as the one-row chunk forwards do, to float32
    rounding."""
    from specpilot.models.kv_cache import KVCache
    from specpilot.engine.packed_prefill import Chunk, PackingCache, packed_forward
    from specpilot.engine.steps import prefill_chunk

    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (90, 7, 40, 12)]
    chunks = [Chunk(0, tuple(prompts[0][:50]), 0), Chunk(1, tuple(prompts[1]), 0), Chunk(2, tuple(prompts[2]), 0),
              Chunk(3, tuple(prompts[3]), 0)]
    rest = [Chunk(0, tuple(prompts[0][50:]), 50)]
    caches = [KVCache.allocate(target.config, 4, 256, target.device, target.dtype) for _ in range(2)]
    for c in chunks + rest:
        prefill_chunk(target, caches[0].row(c.row), list(c.tokens), c.start, 64)
    packing = PackingCache(caches[1], 4, 64, graphed=graphed)
    packed_forward(target, caches[1], packing, chunks, 64)
    packed_forward(target, caches[1], packing, rest, 64)
    assert len(packing.graphs) == (2 if graphed else 0)  # 149 tokens pad to 192, 40 to 64
    for row, n in ((0, 90), (1, 7), (2, 40), (3, 12)):
        for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
            torch.testing.assert_close(b[row, :, :n], a[row, :, :n], rtol=1e-4, atol=1e-4)
