"""The rope_store kernel on a CUDA GPU (`pytest -m gpu`): against inductor's compiled
`ops.qkv_norm_rope` and the indexed cache writes it replaces (BF16, Qwen3-8B's head layout: within
one BF16 ulp of each head's largest value, the norm's summation order being the only difference by
the rule; the share of bit-equal values is printed), and lossless in captured, compiled rounds
(float32: speculative tokens are AR's with the same knob)."""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.kernels import rope_store as R
from specpilot.models import ops
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import (
    tiny_config,
    write_random_checkpoint,
    write_truncated_drafter,
)
from specpilot.models.transformer import use_rope_store

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qwen3", "llama"])
def test_the_kernel_rounds_as_the_compiled_op(qk_norm):
    B, T, H, Hkv, D, S = 2, 8, 32, 8, 128, 64
    g = torch.Generator().manual_seed(0)
    qkv = (torch.randn(B, T, (H + 2 * Hkv) * D, generator=g) * 2).bfloat16().cuda()
    qw, kw = ((1 + 0.1 * torch.randn(D, generator=g)).bfloat16().cuda() for _ in "qk") if qk_norm else (None, None)
    inv = 1.0 / 1e6 ** (torch.arange(0, D, 2).float() / D)
    emb = torch.outer(torch.arange(4096).float(), inv).repeat(1, 2)
    cos, sin = emb.cos().cuda(), emb.sin().cuda()
    positions = torch.randint(0, 4096, (B, T), generator=g).cuda()
    slots = torch.stack([torch.randperm(S, generator=g)[:T] for _ in range(B)]).cuda()
    k_cache = torch.randn(B, Hkv, S, D, generator=g).bfloat16().cuda()
    v_cache = torch.randn(B, Hkv, S, D, generator=g).bfloat16().cuda()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q = R.qk_norm_rope_store(qkv, qw, kw, cos, sin, positions, k_cache, v_cache, slots, H, Hkv, D, 1e-6)
    c, s = cos[positions].bfloat16().unsqueeze(2), sin[positions].bfloat16().unsqueeze(2)
    q_ref, k, v = ops.fused("qkv_norm_rope", qkv.device)(qkv, qw, kw, c, s, H, Hkv, D, 1e-6)
    rows = torch.arange(B, device="cuda")[:, None].expand(B, T)
    k_ref[rows, :, slots] = k
    v_ref[rows, :, slots] = v
    assert torch.equal(v_cache, v_ref)
    for out, ref in ((q, q_ref), (k_cache, k_ref)):
        top = ref.float().abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
        ulp = torch.exp2(torch.floor(torch.log2(top)) - 7)
        err = (out.float() - ref.float()).abs()
        print(f"bit-equal to the compiled op: {(out == ref).float().mean().item():.4%}")
        assert (err <= ulp).all(), f"{err.max()}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("rope_store_cuda")
    target = write_random_checkpoint(root / "t", tiny_config(num_layers=2, head_dim=64), seed=0)
    drafter = write_truncated_drafter(target, root / "d", num_layers=1)
    out = []
    for path in (target, drafter):
        model = load_model(path, device="cuda", dtype=torch.float32)
        use_rope_store(model, True)
        out.append(model)
    return out


def test_captured_compiled_rounds_with_the_kernel_are_lossless(models, make_prompts, full_precision):
    target, draft = models
    prompts = make_prompts(3, seed=7, lo=1, hi=40)
    ar = Generator(target, cuda_graphs=True).generate(prompts, 24).outputs
    gen = Generator(target, {4: DraftModelDrafter(draft, 4, 2, 8, compiled=True)}, cuda_graphs=True,
                    verify_compile=True)
    assert gen.use_graphs and gen.generate(prompts, 24).outputs == ar
