"""Two-level verification and sampled rounds on a CUDA GPU (`pytest -m gpu`): the FP8 view runs the
Triton FP8 kernels inside captured rounds and stays lossless; sampled rounds replay as CUDA graphs
with the same tokens as eager ones, and a seed gives the same tokens alone or in a batch."""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.two_level import TwoLevelDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.sampling import SamplingParams
from specpilot.models.fp8_linear import FP8Linear
from specpilot.models.loading import load_model
from specpilot.models.view import fp8_view

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def models(target_dir, drafter_dir):
    return (load_model(target_dir, device="cuda", dtype=torch.float32),
            load_model(drafter_dir, device="cuda", dtype=torch.float32))


def test_tlv_is_lossless_in_captured_rounds(models, make_prompts, full_precision):
    target, draft = models
    prompts = make_prompts(4, seed=5, lo=1, hi=40)
    ar = Generator(target).generate(prompts, 40).outputs
    view = fp8_view(target)
    assert all(m.kernel.value == "auto" for m in view.modules() if isinstance(m, FP8Linear))
    drafter = TwoLevelDrafter(DraftModelDrafter(draft, 4, 2, 8), view, 3)
    graphed = Generator(target, {drafter.depth: drafter}, cuda_graphs=True)
    result = graphed.generate(prompts, 40)
    assert graphed.use_graphs and result.outputs == ar
    assert result.mean_accepted_length > 2.0  # the view's chain is accepted


def test_sampled_rounds_replay_as_graphs_and_ignore_the_batch(models, make_prompts):
    target, draft = models
    prompts = make_prompts(3, seed=6, lo=1, hi=40)
    params = [SamplingParams(0.8, top_p=0.9, seed=s) for s in (11, 12, 13)]
    for make in (dict, lambda: {4: DraftModelDrafter(draft, 4, 2, 8)}):  # AR, then a draft-model tree
        eager = Generator(target, make(), cuda_graphs=False).generate(prompts, 32, sampling=params).outputs
        graphed = Generator(target, make(), cuda_graphs=True)
        assert graphed.generate(prompts, 32, sampling=params).outputs == eager
        alone = graphed.generate(prompts[1:2], 32, sampling=params[1:2]).outputs
        assert alone == eager[1:2]
