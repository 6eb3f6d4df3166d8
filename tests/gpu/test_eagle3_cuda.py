"""EAGLE-3 drafting on a CUDA GPU (`pytest -m gpu`): the graphed round (best-first expansion over
the head, verify with feature capture, catch-up) replays the eager one token for token, and in
float32 (TF32 off) it equals AR decoding."""

import pytest
import torch

from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.generator import Generator
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.loading import load_model

pytestmark = pytest.mark.gpu

NEW_TOKENS = 48


def drafters(target, depth, topk, budget, shared=0, margin=0):
    vocab = torch.randperm(4096, generator=torch.Generator().manual_seed(1))[:1000].sort().values
    head = random_eagle3(target.config, draft_vocab=vocab, seed=3)
    head = head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    return {depth: Eagle3Drafter(head, target, depth, topk, budget, shared_budget=shared, row_depth_margin=margin)}


# (depth, topk, budget, shared_budget, row_depth_margin): the last case packs the verify forward
# and captures features from it (a shared budget), with per-request depth caps
@pytest.mark.parametrize("depth,topk,budget,shared,margin", [(6, 1, 6, 0, 0), (5, 4, 16, 0, 0), (5, 4, 16, 7, 1)])
def test_graphed_eagle3_equals_eager_and_ar(target_dir, make_prompts, full_precision, depth, topk, budget, shared,
                                            margin):
    prompts = make_prompts(6, seed=11, lo=1, hi=40)
    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    graphed = Generator(target, drafters(target, depth, topk, budget, shared, margin), cuda_graphs=True)
    assert graphed.use_graphs
    eager = Generator(target, drafters(target, depth, topk, budget, shared, margin), cuda_graphs=False)
    ar = Generator(target, cuda_graphs=False).generate(prompts, NEW_TOKENS).outputs
    g = graphed.generate(prompts, NEW_TOKENS)
    assert g.outputs == eager.generate(prompts, NEW_TOKENS).outputs
    assert g.outputs == ar
    assert graphed.generate(prompts[:2], NEW_TOKENS).outputs == ar[:2]  # a second workspace, replayed
