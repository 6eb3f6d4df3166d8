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
