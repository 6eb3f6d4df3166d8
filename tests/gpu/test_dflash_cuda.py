"""DFlash drafting on a CUDA GPU (`pytest -m gpu`): the graphed round (draft, DDTree build,
verify with feature capture, context update) replays the eager one token for token, and in
float32 (TF32 off) it equals AR decoding."""

import pytest
import torch

from specpilot.config import TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.generator import Generator
from specpilot.models.dflash import random_dflash
from specpilot.models.loading import load_model

pytestmark = pytest.mark.gpu

NEW_TOKENS = 48


def drafter(target, construction, shared=0, margin=0):
    model = random_dflash(target.config, num_layers=2, block_size=8, mask_token_id=5, seed=3)
    model = model.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
    return DFlashDrafter(model, target, 8, 16, construction, shared_budget=shared, row_depth_margin=margin)


# every construction, then the batch mechanisms: a shared budget (packed verify forward with
# feature capture) and per-request block depth (-inf beyond each row's tier)
CASES = [(c, 0, 0) for c in TreeConstruction] + [(TreeConstruction.BEST_FIRST, 6, 1), (TreeConstruction.CHAIN, 4, 1),
                                                  (TreeConstruction.SPINE_FIRST, 0, 1)]


@pytest.mark.parametrize("construction,shared,margin", CASES)
def test_graphed_dflash_equals_eager_and_ar(target_dir, make_prompts, full_precision, construction, shared, margin):
    prompts = make_prompts(6, seed=11, lo=1, hi=40)
    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    graphed = Generator(target, {7: drafter(target, construction, shared, margin)}, cuda_graphs=True)
    assert graphed.use_graphs
    eager = Generator(target, {7: drafter(target, construction, shared, margin)}, cuda_graphs=False)
    ar = Generator(target, cuda_graphs=False).generate(prompts, NEW_TOKENS).outputs
    g = graphed.generate(prompts, NEW_TOKENS)
    assert g.outputs == eager.generate(prompts, NEW_TOKENS).outputs
    assert g.outputs == ar
    assert graphed.generate(prompts[:2], NEW_TOKENS).outputs == ar[:2]  # a second workspace, replayed
