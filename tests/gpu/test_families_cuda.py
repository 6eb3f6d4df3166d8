"""The new target families on a CUDA GPU (`pytest -m gpu`): a mixture-of-experts target's sparse
layers run the grouped-GEMM path in BF16 (no host read), so CUDA graphs capture the round; graph and
eager decoding give identical tokens, and speculation gives AR's tokens, on Qwen3-MoE and Gemma-4."""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import write_truncated_drafter
from tests.models.test_gemma import hf_checkpoint as gemma_checkpoint
from tests.models.test_moe import hf_checkpoint as moe_checkpoint

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


@pytest.fixture(params=["qwen3_moe", "gemma4"])
def target_dir(request, tmp_path):
    if request.param == "qwen3_moe":
        moe_checkpoint(tmp_path / "target", "qwen3_moe", sparse_scale=0.3)
    else:
        gemma_checkpoint(tmp_path / "target", "gemma4")
    return tmp_path / "target"


def test_graphs_equal_eager_in_bf16(target_dir, make_prompts):
    prompts = make_prompts(4, seed=3, lo=1, hi=40)
    target = load_model(target_dir, device="cuda", dtype=torch.bfloat16)
    eager = Generator(target, cuda_graphs=False).generate(prompts, 32).outputs
    graphed = Generator(target, cuda_graphs=True)
    assert graphed.use_graphs and graphed.generate(prompts, 32).outputs == eager


def test_speculation_equals_ar_in_float32(target_dir, tmp_path, make_prompts, full_precision):
    prompts = make_prompts(4, seed=3, lo=1, hi=40)
    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    draft = load_model(write_truncated_drafter(target_dir, tmp_path / "drafter", num_layers=1), device="cuda",
                       dtype=torch.float32)
    ar = Generator(target).generate(prompts, 32).outputs
    drafter = DraftModelDrafter(draft, 4, topk=3, tree_budget=12)
    assert Generator(target, {drafter.depth: drafter}).generate(prompts, 32).outputs == ar
