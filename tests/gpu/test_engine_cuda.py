"""The engine on a CUDA GPU, tiny random models (`pytest -m gpu`).

Invariants: a CUDA-graph replay of the decoding round runs the same kernels as the eager round, so
graph and eager decoding give identical tokens in any dtype; speculative decoding is
token-identical to AR decoding in float32 (TF32 off), where a divergence is reported with the
target's logit margin (a genuine near-tie shows a margin at float32 rounding level, ~1e-5).
"""

import pytest
import torch

from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.models.loading import load_model

pytestmark = pytest.mark.gpu

NEW_TOKENS = 48


@pytest.fixture
def prompts(make_prompts):
    return make_prompts(6, seed=11, lo=1, hi=40)


def first_divergence(target, prompt, expected, got) -> str:
    i = next(j for j, (a, b) in enumerate(zip(expected, got)) if a != b)
    with torch.no_grad():
        logits = target.forward_causal(torch.tensor([prompt + expected[:i]], device=target.device))[0, -1]
    return (f"first divergence at generated token {i}: AR {expected[i]} vs {got[i]}, "
            f"logit margin {float(logits[expected[i]] - logits[got[i]]):.3e}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_ar_decode_equals_eager(target_dir, prompts, full_precision, dtype):
    target = load_model(target_dir, device="cuda", dtype=dtype)
    graphed = Generator(target, cuda_graphs=True)
    assert graphed.use_graphs
    eager = Generator(target, cuda_graphs=False).generate(prompts, NEW_TOKENS).outputs
    assert graphed.generate(prompts, NEW_TOKENS).outputs == eager


@pytest.mark.parametrize("make_drafter", [
    pytest.param(lambda draft: DraftModelDrafter(draft, 4, topk=1, tree_budget=4), id="chain"),
    pytest.param(lambda draft: DraftModelDrafter(draft, 4, topk=3, tree_budget=12), id="tree"),
    pytest.param(lambda draft: NgramDrafter(4, 2, 8), id="ngram"),
])
def test_speculative_equals_ar_in_float32(target_dir, drafter_dir, prompts, full_precision, make_drafter):
    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    draft = load_model(drafter_dir, device="cuda", dtype=torch.float32)
    ar = Generator(target).generate(prompts, NEW_TOKENS).outputs
    drafter = make_drafter(draft)
    result = Generator(target, {drafter.depth: drafter}).generate(prompts, NEW_TOKENS)
    for p, e, g in zip(prompts, ar, result.outputs):
        if e != g:
            pytest.fail(first_divergence(target, p, e, g))
    assert result.mean_accepted_length >= 1.0



@pytest.fixture(scope="module")
def bf16_dirs(ckpt_root):
    """A target with exactly-BF16 weights (W12 encodes nothing else) and its truncated drafter."""
    from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint, write_truncated_drafter

    target = write_random_checkpoint(ckpt_root / "bf16-target", tiny_config(), seed=0, dtype=torch.bfloat16)
    return target, write_truncated_drafter(target, ckpt_root / "bf16-drafter", num_layers=2)


@pytest.mark.parametrize("w12", [False, True], ids=["triton", "w12"])
def test_compiled_rounds_over_the_triton_projections_equal_ar_in_float32(bf16_dirs, prompts, full_precision, w12):
    """draft_compile and verify_compile under inductor with the target's projections on our Triton
    kernels (each one `specpilot::linear` op, which inductor does not recompile): AR's tokens."""
    from specpilot.models.linear import swap_projections

    target = load_model(bf16_dirs[0], device="cuda", dtype=torch.float32)
    swap_projections(target, w12=w12)
    draft = load_model(bf16_dirs[1], device="cuda", dtype=torch.float32)
    ar = Generator(target).generate(prompts, NEW_TOKENS).outputs
    drafter = DraftModelDrafter(draft, 4, topk=3, tree_budget=12, compiled=True)
    result = Generator(target, {drafter.depth: drafter}, verify_compile=True).generate(prompts, NEW_TOKENS)
    for p, e, g in zip(prompts, ar, result.outputs):
        if e != g:
            pytest.fail(first_divergence(target, p, e, g))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_rounds_over_split_attention_equal_ar_over_sdpa_in_float32(target_dir, drafter_dir, prompts, full_precision,
                                                                  compiled):
    """Every cached attention of the target and the drafter on the split-KV kernel (compiled Triton,
    IEEE float32 dots; under inductor, one `specpilot::split_attention` op each): AR's tokens over SDPA,
    for AR itself and for speculative rounds, CUDA graphs on."""
    from specpilot.config import AttentionKernel
    from specpilot.models.transformer import use_attention

    target = load_model(target_dir, device="cuda", dtype=torch.float32)
    ar = Generator(target).generate(prompts, NEW_TOKENS).outputs
    use_attention(target, AttentionKernel.SPLIT_KV)
    draft = load_model(drafter_dir, device="cuda", dtype=torch.float32)
    use_attention(draft, AttentionKernel.SPLIT_KV)
    assert Generator(target).generate(prompts, NEW_TOKENS).outputs == ar
    drafter = DraftModelDrafter(draft, 4, topk=3, tree_budget=12, compiled=compiled)
    result = Generator(target, {drafter.depth: drafter}, verify_compile=compiled).generate(prompts, NEW_TOKENS)
    for p, e, g in zip(prompts, ar, result.outputs):
        if e != g:
            pytest.fail(first_divergence(target, p, e, g))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_kernels_launched_with_pdl_give_the_tokens_of_plain_launches(bf16_dirs, prompts, monkeypatch, compiled):
    """pdl (sm_90 and later): the Triton projections, the split-KV attention and, compiled,
    inductor's kernels start while the kernel before them finishes and wait for it before reading:
    BF16 AR and speculative rounds under CUDA graphs give the tokens of the same kernels launched
    plainly, bit for bit."""
    from specpilot.config import AttentionKernel
    from specpilot.kernels import launch
    from specpilot.models.linear import swap_projections
    from specpilot.models.transformer import use_attention

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    monkeypatch.delenv("SPECPILOT_PDL", raising=False)
    target = load_model(bf16_dirs[0], device="cuda", dtype=torch.bfloat16)
    swap_projections(target, w12=False)
    use_attention(target, AttentionKernel.SPLIT_KV)
    draft = load_model(bf16_dirs[1], device="cuda", dtype=torch.bfloat16)
    use_attention(draft, AttentionKernel.SPLIT_KV)

    def run(pdl: bool):
        with launch.knob_scope(pdl):  # as Session builds a system's drafters
            drafter = DraftModelDrafter(draft, 4, topk=3, tree_budget=12, compiled=compiled)
        ar = Generator(target, verify_compile=compiled, pdl=pdl).generate(prompts, NEW_TOKENS).outputs
        spec = Generator(target, {drafter.depth: drafter}, verify_compile=compiled, pdl=pdl)
        return ar, spec.generate(prompts, NEW_TOKENS).outputs

    plain = run(False)
    with launch.pdl_scope(True):
        assert launch.pdl(torch.device("cuda"))
    torch._dynamo.reset()
    assert run(True) == plain


@pytest.fixture(scope="module")
def drafter_dirs(bf16_dirs, ckpt_root):
    """The drafters with a model of their own for the BF16 target: its truncated draft model, an
    EAGLE-3 head and a DFlash drafter."""
    from specpilot.config import DrafterKind
    from specpilot.models.dflash import random_dflash
    from specpilot.models.dflash_checkpoint import write_dflash
    from specpilot.models.eagle3 import random_eagle3
    from specpilot.models.eagle3_checkpoint import write_eagle3
    from specpilot.models.loading import load_model

    config = load_model(bf16_dirs[0]).config
    eagle3 = random_eagle3(config, seed=5)
    dflash = random_dflash(config, num_layers=1, block_size=6, mask_token_id=3)
    return {DrafterKind.MODEL: bf16_dirs[1],
            DrafterKind.EAGLE3: write_eagle3(eagle3, ckpt_root / "bf16-eagle3", dtype=torch.float32),
            DrafterKind.DFLASH: write_dflash(dflash, ckpt_root / "bf16-dflash", dtype=torch.float32)}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
@pytest.mark.parametrize("kind", ["model", "eagle3", "dflash"])
def test_a_drafter_on_the_triton_kernels_keeps_the_ar_tokens_in_float32(bf16_dirs, drafter_dirs, prompts,
                                                                        full_precision, compiled, kind):
    """draft_kernel: the drafter's own projections, lm_head and fc on our Triton kernels (CUDA
    graphs; compiled, one `specpilot::linear` op each), the target on cuBLAS: AR's tokens."""
    import dataclasses

    from specpilot.config import Deployment, DrafterKind, Kernel, System
    from specpilot.engine.session import Session
    from specpilot.models.linear import TritonLinear

    kind = DrafterKind(kind)
    stock = System(drafter=kind, depth=4, topk=3, tree_budget=12, block_size=6)
    dep = Deployment(name="d", target=str(bf16_dirs[0]), drafter=str(drafter_dirs[kind]), stock=stock)
    session = Session.load(dep, device="cuda", dtype=torch.float32)
    ar = session.generator(stock.plain_ar()).generate(prompts, NEW_TOKENS).outputs
    system = dataclasses.replace(stock, name="d", draft_kernel=Kernel.TRITON, draft_compile=compiled)
    gen = session.generator(system)
    assert any(isinstance(m, TritonLinear) for m in next(iter(gen.drafters.values())).model.modules())
    for p, e, g in zip(prompts, ar, gen.generate(prompts, NEW_TOKENS).outputs):
        if e != g:
            pytest.fail(first_divergence(session.target, p, e, g))


@pytest.fixture(scope="module")
def d32_dirs(ckpt_root):
    """A BF16-exact target with heads of 32 (the fused draft layers' smallest) and its two-layer drafter."""
    from specpilot.models import random_checkpoint as rc

    target = rc.write_random_checkpoint(ckpt_root / "d32-target", rc.tiny_config(head_dim=32), seed=0,
                                        dtype=torch.bfloat16)
    return target, rc.write_truncated_drafter(target, ckpt_root / "d32-drafter", num_layers=2)


@pytest.mark.parametrize("attention", ["sdpa", "split_kv"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_the_fused_draft_layers_keep_the_ar_tokens_in_float32(d32_dirs, prompts, full_precision, compiled, attention):
    """draft_kernel = "fused": the draft model's layers in the fused kernels (CUDA graphs; compiled,
    one custom op each, the cache write a mutation inductor functionalizes), either attention: AR's
    tokens. The prompts' prefill (more than 16 rows) runs the plain forward."""
    import dataclasses

    from specpilot import config
    from specpilot.engine.session import Session
    from specpilot.models.fused_decoder import FusedDecoder

    System, Kernel = config.System, config.Kernel
    stock = System(drafter=config.DrafterKind.MODEL, depth=4, topk=3, tree_budget=12)
    dep = config.Deployment(name="f", target=str(d32_dirs[0]), drafter=str(d32_dirs[1]), stock=stock)
    session = Session.load(dep, device="cuda", dtype=torch.float32)
    ar = session.generator(stock.plain_ar()).generate(prompts, NEW_TOKENS).outputs
    system = dataclasses.replace(stock, name="f", draft_kernel=Kernel.FUSED, draft_compile=compiled,
                                 attention=config.AttentionKernel(attention))
    gen = session.generator(system)
    assert isinstance(next(iter(gen.drafters.values())).model, FusedDecoder)
    for p, e, g in zip(prompts, ar, gen.generate(prompts, NEW_TOKENS).outputs):
        if e != g:
            pytest.fail(first_divergence(session.target, p, e, g))
    torch._dynamo.reset()
