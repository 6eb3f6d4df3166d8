"""The 8-bit view: FP8 per-channel projections over the model's own other tensors, its bytes, what
it refuses, and how often its argmax agrees with the model's."""

import pytest
import torch

from specpilot.errors import ConfigError
from specpilot.models.fp8_checkpoint import quantize_per_channel
from specpilot.models.fp8_linear import FP8Linear
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint
from specpilot.models.view import agreement, fp8_view, view_bytes


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir)


def test_projections_become_fp8_and_everything_else_is_shared(target):
    view = fp8_view(target)
    assert type(view) is type(target) and view.config == target.config
    ours = {id(t) for t in target.parameters()}
    assert all(id(t) in ours for t in view.parameters())  # every tensor but the FP8 codes and scales is shared
    fp8 = {n: m for n, m in view.named_modules() if isinstance(m, FP8Linear)}
    linears = {n: m for n, m in target.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(fp8) == set(linears) and "lm_head" in fp8
    codes, scale = quantize_per_channel(target.lm_head.weight)
    assert torch.equal(fp8["lm_head"].weight_e4m3.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(fp8["lm_head"].weight_scale, scale)
    assert view_bytes(view) == sum(m.weight.numel() + 4 * m.weight.shape[0] for m in linears.values())
    assert not any(isinstance(m, FP8Linear) for m in target.modules())  # the model is untouched


def test_a_w12_model_is_quantized_from_its_exact_weights(tmp_path):
    from specpilot.models.convert import convert_checkpoint
    from specpilot.models.w12_linear import W12Linear

    src = write_random_checkpoint(tmp_path / "bf16", tiny_config(num_layers=1), seed=3, dtype=torch.bfloat16)
    convert_checkpoint(src, tmp_path / "w12")
    plain = load_model(src, dtype=torch.bfloat16)
    with pytest.warns(Warning):  # W12 projections off a GPU
        packed = load_model(tmp_path / "w12", dtype=torch.bfloat16)
    assert any(isinstance(m, W12Linear) for m in packed.modules())
    a, b = fp8_view(plain), fp8_view(packed)
    for (n, m), (_, k) in zip(a.named_modules(), b.named_modules()):
        if isinstance(m, FP8Linear):
            assert torch.equal(m.weight_e4m3.view(torch.uint8), k.weight_e4m3.view(torch.uint8)), n


def test_the_view_mostly_agrees_with_its_model(target):
    tokens = torch.randint(1, 4096, (2, 48), generator=torch.Generator().manual_seed(0))
    assert agreement(fp8_view(target), target, tokens) > 0.8


def test_refusals(tmp_path, target):
    with pytest.raises(ConfigError, match="FP8 already"):
        fp8_view(fp8_view(target))
    from specpilot.models.random_checkpoint import tiny_hybrid_config, write_random_hybrid

    hybrid = write_random_hybrid(tmp_path / "h", tiny_hybrid_config("qwen3_5"))
    with pytest.raises(ConfigError, match="recurrent layers"):
        fp8_view(load_model(hybrid))
