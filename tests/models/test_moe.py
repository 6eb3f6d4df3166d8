"""Mixture-of-experts targets equal transformers on checkpoints transformers saved: Qwen3-MoE (a dense
`mlp_only_layers` layer among sparse ones, both routing normalisations, `decoder_sparse_step`) and
Qwen3-Next with sparse layers (a sigmoid-gated shared expert), from the per-expert layout that
`save_pretrained` writes and from transformers' fused 3-D expert tensors (CPU float32).

transformers is a test-only dependency; the runtime never imports it.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.engine.generator import Generator
from specpilot.engine.steps import chunk_forward
from specpilot.errors import CheckpointError
from specpilot.models.config import ModelConfig
from specpilot.models.expand import expanded_config
from specpilot.models.loading import load_model, save_model
from specpilot.models.moe import MoEHybridTransformer, MoETransformer, SparseMoE, experts_read
from specpilot.models.random_checkpoint import copy_tokenizer
from tests.models.test_hybrid import spread_weights

transformers = pytest.importorskip("transformers")

DIMS = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512, eos_token_id=0, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32)
NEXT = dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, shared_expert_intermediate_size=48, mlp_only_layers=[1])
VARIANTS = {  # name -> (transformers class, config fields)
    "qwen3_moe": ("Qwen3Moe", dict(num_hidden_layers=3, mlp_only_layers=[0], norm_topk_prob=False)),
    "qwen3_moe_step2": ("Qwen3Moe", dict(num_hidden_layers=4, decoder_sparse_step=2, norm_topk_prob=True)),
    "qwen3_next_moe": ("Qwen3Next", NEXT),
}


def hf_checkpoint(path, variant: str = "qwen3_moe", seed: int = 0, sparse_scale: float = 1.0):
    """A tiny random MoE model saved by transformers, its weights spread so that logits and routing
    scores do not tie (as `test_hybrid.hf_checkpoint`); `sparse_scale` scales the token mixers' and the
    experts' output projections (the dense MLPs keep theirs), so that a drafter without them (a
    truncated or mixerless one) agrees with the target often."""
    kind, fields = VARIANTS[variant]
    config = getattr(transformers, f"{kind}Config")(**DIMS, **fields)
    model = getattr(transformers, f"{kind}ForCausalLM")(config)
    def scale(name):
        sparse = name.endswith(("o_proj.weight", "out_proj.weight")) or (
            "down_proj" in name and ("experts" in name or "shared_expert" in name))
        return sparse_scale if sparse else 1.0

    spread_weights(model, seed, scale)
    model.save_pretrained(path)
    copy_tokenizer(path)
    return model.eval()


def fuse_experts(src, dst):
    """The same checkpoint with its experts in transformers' fused 3-D layout (the module's own names)."""
    tensors = load_file(str(src / "model.safetensors"))
    cfg = ModelConfig.from_dir(src)
    for i in cfg.moe_layers:
        p = f"model.layers.{i}.mlp.experts."
        gate_up, down = [], []
        for e in range(cfg.num_experts):
            gate_up.append(torch.cat([tensors.pop(f"{p}{e}.gate_proj.weight"), tensors.pop(f"{p}{e}.up_proj.weight")]))
            down.append(tensors.pop(f"{p}{e}.down_proj.weight"))
        tensors[p + "gate_up_proj"], tensors[p + "down_proj"] = torch.stack(gate_up), torch.stack(down)
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (dst / f).write_bytes((src / f).read_bytes())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_and_greedy_tokens_match_transformers(tmp_path, variant):
    hf = hf_checkpoint(tmp_path / "m", variant)
    ours = load_model(tmp_path / "m")
    hybrid = variant == "qwen3_next_moe"
    assert isinstance(ours, MoEHybridTransformer if hybrid else MoETransformer)
    c = ours.config
    expect = {"qwen3_moe": (1, 2), "qwen3_moe_step2": (1, 3), "qwen3_next_moe": (0, 2, 3)}[variant]
    assert c.moe_layers == expect and c.num_params == sum(p.numel() for p in ours.parameters())
    for i, layer in enumerate(ours.layers):
        assert isinstance(layer.mlp, SparseMoE) == (i in expect)
    tokens = torch.randint(0, 4096, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(tokens).logits
        causal = ours.forward_causal(tokens)
        cached = chunk_forward(ours, ours.new_cache(2, 128), tokens, torch.zeros(2, dtype=torch.long))
    scale = ref.abs().max()
    # the same math in float32, experts summed in the same order; only summation orders inside
    # attention (SDPA) and the recurrence differ
    tol = 1e-4 if hybrid else 2e-6
    assert (causal - ref).abs().max() <= tol * scale
    assert (cached - ref).abs().max() <= tol * scale
    prompts = [[5, 17, 300, 2, 9, 44], [7], list(range(1, 30))]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None)[0, len(p):]
                .tolist() for p in prompts]
    assert Generator(ours).generate(prompts, 20, stop_at_eos=False).outputs == want


@pytest.mark.parametrize("variant", ["qwen3_moe", "qwen3_next_moe"])
def test_fused_expert_layout_loads_the_same_model(tmp_path, variant):
    hf_checkpoint(tmp_path / "m", variant)
    fuse_experts(tmp_path / "m", tmp_path / "fused")
    a, b = load_model(tmp_path / "m"), load_model(tmp_path / "fused")
    for name, p in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], p), name


@pytest.mark.parametrize("variant", ["qwen3_moe", "qwen3_next_moe"])
def test_saved_checkpoints_load_in_transformers(tmp_path, variant):
    """`save_model` writes the per-expert layout; transformers loads it into the same function."""
    hf_checkpoint(tmp_path / "m", variant)
    model = load_model(tmp_path / "m")
    save_model(model, tmp_path / "again", dtype=torch.float32)
    assert ModelConfig.from_dir(tmp_path / "again") == model.config
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float32).eval()
    tokens = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref, ours = hf(tokens).logits, model.forward_causal(tokens)
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()
    again = load_model(tmp_path / "again")
    for name, p in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], p), name


def small_moe(experts: int, per_token: int, intermediate: int, dtype=torch.float32) -> SparseMoE:
    """A sparse layer of hidden size 16 with N(0, 0.3) weights, drawn after torch.manual_seed(0)
    (so the caller's later torch.randn inputs are fixed too)."""
    cfg = ModelConfig(family="qwen3_moe", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, num_experts=experts, num_experts_per_tok=per_token,
                      moe_intermediate_size=intermediate)
    torch.manual_seed(0)
    moe = SparseMoE(cfg)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return moe.to(dtype)


def test_only_routed_experts_run(monkeypatch):
    """Each expert a token routes to runs once, over exactly its tokens; the others never run."""
    moe = small_moe(experts=6, per_token=2, intermediate=8)
    x = torch.randn(5, 16)
    weights, ids = moe.route(x)
    seen = []
    real = torch.nn.functional.linear

    def spy(inp, w, *a):
        seen.append((w.data_ptr(), inp.shape[0]))
        return real(inp, w, *a)

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    out = moe.experts(x, weights, ids)
    monkeypatch.undo()
    ran = {e: n for e in range(6) for ptr, n in seen if ptr == moe.experts.gate_up_proj[e].data_ptr()}
    assert ran == {e: int((ids == e).sum()) for e in ids.unique().tolist()}
    dense = sum(weights[:, j, None] * torch.stack([
        real(torch.nn.functional.silu(real(x[t], moe.experts.gate_up_proj[ids[t, j]][:8]))
             * real(x[t], moe.experts.gate_up_proj[ids[t, j]][8:]), moe.experts.down_proj[ids[t, j]])
        for t in range(5)]) for j in range(2))
    assert torch.allclose(out, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_gemm_path_gives_the_per_expert_loop(dtype):
    """The capturable path (two grouped GEMMs, device-side offsets, what CUDA graphs get in BF16)
    computes what the host-bounded loop does, the same sums in the same order; experts no token
    routes to leave empty groups."""
    moe = small_moe(experts=8, per_token=3, intermediate=16, dtype=dtype)
    for T in (1, 5, 16):
        x = torch.randn(T, 16, dtype=dtype)
        weights, ids = moe.route(x)
        loop = moe.experts(x, weights, ids, grouped=False)
        grouped = moe.experts(x, weights, ids, grouped=True)
        assert len(ids.unique()) < 8 or T == 16
        torch.testing.assert_close(grouped, loop, rtol=0 if dtype == torch.float32 else 1e-2, atol=1e-6)


def test_the_masked_path_gives_the_per_expert_loop():
    """The path a CUDA graph captures where there is no grouped GEMM (float32): every expert over
    every pair, each pair keeping its own expert's rows -- the loop's values, in its sum order."""
    moe = small_moe(experts=8, per_token=3, intermediate=16)
    for T in (1, 5, 16):
        x = torch.randn(T, 16)
        weights, ids = moe.route(x)
        loop = moe.experts(x, weights, ids, grouped=False, masked=False)
        masked = moe.experts(x, weights, ids, grouped=False, masked=True)
        torch.testing.assert_close(masked, loop, rtol=1e-6, atol=1e-6)
        assert not torch.equal(masked, torch.zeros_like(masked))


def test_experts_read_is_the_union_of_routed_experts():
    assert experts_read(torch.tensor([[0, 1]])) == 2
    assert experts_read(torch.tensor([[0, 1], [1, 0], [1, 2]])) == 3
    assert experts_read(torch.tensor([[3, 7], [7, 3]])) == 2
    assert experts_read(torch.arange(16).reshape(8, 2)) == 16
    assert experts_read(torch.zeros(0, 2, dtype=torch.long)) == 0


def test_config_fields_and_refusals():
    hf = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
          "intermediate_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "num_local_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 8,
          "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    c = ModelConfig.from_hf_dict(hf)
    assert c.family == "qwen3_moe" and c.qk_norm and c.num_experts == 16 and not c.norm_topk_prob
    assert c.moe_layers == (1, 5) and c.shared_expert_intermediate_size == 0
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    d = c.dense()
    assert d.family == "qwen3" and d.moe_layers == () and d.num_experts == 0
    with pytest.raises(CheckpointError, match="width expansion of mixture-of-experts"):
        expanded_config(c, 2)
    defaults = ModelConfig.from_hf_dict({k: v for k, v in hf.items() if k not in ("num_local_experts",
                                                                                  "moe_intermediate_size")})
    assert (defaults.num_experts, defaults.moe_intermediate_size) == (128, 768)  # transformers' defaults
    assert ModelConfig.from_hf_dict({**hf, "num_local_experts": 0}).moe_layers == ()
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        ModelConfig.from_hf_dict({**hf, "num_experts_per_tok": 17})
    nxt = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 64,
           "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
           "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2}
    n = ModelConfig.from_hf_dict(nxt)
    assert n.moe_layers == (0, 1, 2, 3) and n.norm_topk_prob and n.shared_expert_intermediate_size == 512
    assert ModelConfig.from_hf_dict(n.to_hf_dict()) == n
    with pytest.raises(CheckpointError, match="shared_expert_intermediate_size"):
        ModelConfig.from_hf_dict({**nxt, "shared_expert_intermediate_size": 0})
