"""The byte facts a profile records for the other target families, in exact arithmetic on tiny
configs: a mixture-of-experts forward reads the union of its tokens' experts (uniform routing's
expectation, or the curve measured from the model's routers), Gemma's K/V follows each layer's
shape (KV-shared layers own none) and a sliding layer reads at most its window; embedding lookups
(Gemma-4's per-layer inputs too) are rows, not streamed tables."""

from __future__ import annotations

import json

import torch

from specpilot.engine.experts import (expected_experts_read, experts_read_at, measure_experts_read, routed_experts,
                                      union_curve)
from specpilot.engine.profile import (StepProfile, expert_sizes, kv_bytes_per_token, sliding_kv_bytes, streamed_bytes,
                                      touched_params)
from specpilot.models.config import ModelConfig
from specpilot.models.moe import SparseMoE
from specpilot.models.random_checkpoint import tiny_config
from specpilot.models.registry import family

S, F = "sliding_attention", "full_attention"
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=(0,))
# Gemma-4 as tests/models/test_gemma.py's "gemma4_shared", with per-layer inputs: global layers of
# head dim 32 and one K/V head, the last two layers reading layers 2 and 3's K/V
GEMMA4 = dict(family="gemma4", num_layers=6, layer_types=(S, S, F, S, S, F), sliding_window=8, qk_norm=True,
              global_head_dim=32, global_kv_heads=1, num_kv_shared_layers=2, per_layer_input_size=4,
              per_layer_input_vocab=4096, query_pre_attn_scalar=1.0, tie_word_embeddings=True, sliding_rope_theta=1e4)


def random_model(config: ModelConfig, seed: int = 0):
    """The family's decoder with random weights (norms near 1, projections ~ 1/sqrt(fan-in))."""
    model = family(config).model(config, max_positions=256)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval()


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- experts read -----------------------------------------------------------------------------

def test_uniform_routing_expects_the_union_of_independent_top_k_sets():
    assert expected_experts_read(8, 2, 1) == 2.0  # one token: its k
    assert expected_experts_read(8, 2, 2) == 8 * (1 - 0.75**2) == 3.5
    assert expected_experts_read(8, 2, 3) == 8 * (1 - 0.75**3)
    assert expected_experts_read(8, 8, 1) == 8.0 and expected_experts_read(8, 2, 10_000) == 8.0
    assert expected_experts_read(0, 0, 5) == 0.0 and expected_experts_read(8, 2, 0) == 0.0


def test_the_union_curve_counts_distinct_experts_per_window_of_consecutive_tokens():
    a = torch.tensor([[0, 1], [0, 1], [2, 3], [4, 5]])  # layer a: the first two tokens agree
    b = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])  # layer b: all disjoint
    # T=1: 2 each; T=2: a's windows read 2 and 4, b's 4 and 4; T=3: one window each (a: 4, b: 6);
    # T=4: a 6, b 8; T=5: no full window
    assert union_curve([a, b], (1, 2, 3, 4, 5)) == {1: 2.0, 2: 3.5, 3: 5.0, 4: 7.0}
    assert union_curve([], (1, 2)) == {}


def test_between_and_past_measured_counts():
    curve = {1: 2.0, 4: 4.0, 16: 6.0}
    E, k = 8, 2
    assert experts_read_at(curve, E, k, 4) == 4.0 and experts_read_at(curve, E, k, 2) == 2.0 + 2.0 / 3
    assert experts_read_at(curve, E, k, 10) == 5.0
    # past the last count the unread experts are read at uniform routing's rate
    assert experts_read_at(curve, E, k, 18) == 8 - 2.0 * 0.75**2
    assert experts_read_at(curve, E, k, 10**6) == 8.0
    # below the first count: scaled with the uniform curve's shape
    assert experts_read_at({2: 3.0}, E, k, 1) == 3.0 * 2.0 / 3.5
    assert experts_read_at({}, E, k, 3) == expected_experts_read(E, k, 3)  # no curve: uniform routing


def test_routing_is_read_from_the_model_and_measured_on_text():
    model = random_model(tiny_config("qwen3_moe", num_layers=3, qk_norm=True, **MOE))
    tokens = torch.randint(1, 4096, (1, 12), generator=torch.Generator().manual_seed(0))
    ids = routed_experts(model, tokens)
    sparse = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert len(ids) == len(sparse) == 2 and all(i.shape == (1, 12, 2) for i in ids)
    # the same ids as each router on its layer's input
    inputs = []
    handles = [m.register_forward_pre_hook(lambda mod, args: inputs.append(args[0])) for m in sparse]
    with torch.no_grad():
        model.forward_causal(tokens)
    for h in handles:
        h.remove()
    for got, m, x in zip(ids, sparse, inputs):
        assert torch.equal(got[0], m.route(x[0])[1])
    rows = [tokens[0, :7].tolist(), tokens[0, 7:].tolist()]
    curve = measure_experts_read(model, rows, (1, 2, 4, 12, 13))
    assert set(curve) == {1, 2, 4, 12} and curve[1] == 2.0  # one token reads its k
    assert all(curve[a] <= curve[b] <= min(8, 2 * b) for a, b in ((1, 2), (2, 4), (4, 12)))
    joined = [torch.cat([r[i][0] for r in (routed_experts(model, torch.tensor([row])) for row in rows)])
              for i in range(2)]
    assert curve == union_curve(joined, (1, 2, 4, 12))
    dense = random_model(tiny_config())
    assert routed_experts(dense, tokens) == [] and measure_experts_read(dense, rows, (1, 2)) == {}


# ---- byte facts of the modules ------------------------------------------------------------------

def test_a_moe_model_counts_every_expert_stored_and_k_of_them_touched():
    c = tiny_config("qwen3_moe", num_layers=3, qk_norm=True, **MOE)
    model = random_model(c)
    per_expert = 3 * 64 * 32
    assert expert_sizes(model) == (2 * 8 * per_expert * 4, 2 * 8 * per_expert)  # layers 1 and 2, float32
    assert touched_params(model) == params(model) - 4096 * 64 - 2 * 6 * per_expert  # lookups, 6 of 8 unread
    assert streamed_bytes(model) == 4 * (params(model) - 4096 * 64 + 64)  # one embedding row
    assert expert_sizes(random_model(tiny_config())) == (0, 0)


def test_gemma_kv_follows_each_layer_and_its_window():
    c = tiny_config(**GEMMA4)
    model = random_model(c)
    # layers 0-3 keep K/V: sliding 0, 1, 3 at 2 heads x 16, global 2 at 1 head x 32; 4 and 5 own none
    assert kv_bytes_per_token(model) == 2 * (3 * 2 * 16 + 1 * 32) * 4 == 1024
    assert sliding_kv_bytes(model) == (2 * 3 * 2 * 16 * 4, 8)
    cache = model.new_cache(2, 32)
    assert kv_bytes_per_token(model) * 2 * 32 == cache.nbytes()  # what the cache stores per token
    dense = random_model(tiny_config())
    assert kv_bytes_per_token(dense) * 2 * 32 == dense.new_cache(2, 32).nbytes() == 2 * 32 * 2 * 3 * 2 * 16 * 4
    assert sliding_kv_bytes(dense) == (0, 0)


def test_per_layer_input_tables_are_lookups():
    c = tiny_config(**GEMMA4)
    model = random_model(c)
    ple = 4096 * 6 * 4  # rows x (layers x P)
    assert c.num_params == params(model)
    assert touched_params(model) == params(model) - ple  # the tied token table is the lm_head: touched
    assert streamed_bytes(model) == 4 * (params(model) - ple + 6 * 4)  # one row of the per-layer table


# ---- the profile's rules -----------------------------------------------------------------------

def profile(**changes) -> StepProfile:
    base = dict(device="cpu", batch=2, tokens_per_round=1.0, round_ms=1.0, draft_ms=0.0, verify_ms=1.0,
                verify_curve_ms={}, accept_at_depth=(), tree_nodes=1, target_bytes=1000, drafter_bytes=0,
                kv_bytes_per_token=100, bandwidth_gbps=1.0, matmul_tflops=1.0, target_params=500, drafter_params=0,
                draft_forwards=0, context=5.0)
    return StepProfile(**{**base, **changes})


def test_a_forward_streams_the_experts_its_tokens_read():
    p = profile(expert_bytes=800, expert_params=400, num_experts=8, experts_per_token=2)
    assert p.active_expert_params == 100.0
    assert p.weight_bytes(1) == 1000 - 800 * (1 - 2 / 8) == 400.0
    assert p.weight_bytes(2) == 1000 - 800 * (1 - 3.5 / 8) == 550.0
    assert p.weight_bytes(10**6) == 1000.0  # every expert
    measured = profile(expert_bytes=800, expert_params=400, num_experts=8, experts_per_token=2,
                       expert_union={1: 2.0, 2: 3.0})
    assert measured.weight_bytes(2) == 1000 - 800 * (1 - 3.0 / 8) == 500.0
    assert profile().weight_bytes(64) == 1000.0  # dense: the same at any count


def test_a_sliding_layer_reads_at_most_its_window():
    p = profile(sliding_kv_bytes_per_token=60, sliding_window=8)
    assert p.kv_bytes_read(5) == 100 * 5 == 500.0
    assert p.kv_bytes_read(20) == 40 * 20 + 60 * 8 == 1280.0
    assert profile().kv_bytes_read(20) == 2000.0


def test_the_profile_of_a_moe_target_measures_its_union_curve(monkeypatch):
    """`profile` on a MoE target records its experts and the curve its routers give on the decoded
    text, at the token counts of its verify forwards (node counts x rows)."""
    from specpilot.engine import profile as profiling
    from specpilot.engine.generator import Generator

    monkeypatch.setattr(profiling, "bandwidth_gbps", lambda device: 1.0)
    monkeypatch.setattr(profiling, "matmul_tflops", lambda device, dtype: 1.0)
    model = random_model(tiny_config("qwen3_moe", num_layers=3, qk_norm=True, **MOE))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    p = profiling.profile(Generator(model), prompts, 6, curve_nodes=(1, 2))
    assert (p.num_experts, p.experts_per_token) == (8, 2)
    assert (p.expert_bytes, p.expert_params) == expert_sizes(model)
    assert set(p.expert_union) == {1, 2, 4} and p.expert_union[1] == 2.0
    assert p.target_params == touched_params(model) and p.sliding_window == 0
    dense = profiling.profile(Generator(random_model(tiny_config())), prompts, 4, curve_nodes=(1,))
    assert (dense.num_experts, dense.expert_union, dense.expert_bytes) == (0, {}, 0)


def test_profiles_stored_before_read_back_dense():
    from specpilot.loop.cost_model import _profile_dict, profile_from_dict

    p = profile(expert_bytes=800, expert_params=400, num_experts=8, experts_per_token=2, expert_union={1: 2.0})
    assert profile_from_dict(json.loads(json.dumps(_profile_dict(p)))) == p
    old = {k: v for k, v in _profile_dict(profile()).items()
           if k not in ("expert_union", "expert_bytes", "sliding_window", "sliding_kv_bytes_per_token")}
    assert profile_from_dict(old) == profile()
