"""The cost model's floors for the other target families, in exact arithmetic on synthetic profiles:
a mixture-of-experts verify floor streams the experts its N x B tokens read (so it grows with N, and
the best tree is smaller than on a dense target of the same stored bytes), FLOPs count k of E
experts, a weight format leaves the experts at EXPERT_BITS; a sliding-window target's KV read stops
at its window."""

import json

import pytest
from loop_fixtures import STOCK, gpu_profile

from specpilot.engine.experts import expected_experts_read
from specpilot.loop.acceptance import TreeShape
from specpilot.loop.cost_model import EXPERT_BITS, HEAD_BITS, CostTable, analyze, forward_floor_ms

E, K = 128, 8
EXPERT_PARAMS = 3_000_000_000  # of the 3.3B: routed experts, 6 GB of the 6.7 GB stored


def moe_profile(**changes):
    """`gpu_profile`'s target as a mixture of experts: the same stored bytes, 6 GB of them experts,
    a token touching k = 8 of E = 128."""
    active = 300_000_000 + EXPERT_PARAMS * K // E
    return gpu_profile(expert_bytes=6_000_000_000, expert_params=EXPERT_PARAMS, num_experts=E, experts_per_token=K,
                       target_params=active, **changes)


def test_the_moe_verify_floor_streams_the_experts_its_tokens_read():
    p = moe_profile(batch=2)
    t = analyze(p, TreeShape.of(STOCK), "stock")
    kv = p.kv_bytes_per_token * p.context * 2
    for nodes in (1, 4, 16, 64):
        read = expected_experts_read(E, K, nodes * 2)  # the whole batch's tokens route together
        weights = 700_000_000 + 6_000_000_000 * read / E
        assert t.verify_floor_ms(nodes) == pytest.approx((weights + kv) / 4e12 * 1e3, rel=1e-12)
    floors = [t.verify_floor_ms(n) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert floors == sorted(floors) and floors[-1] > 4 * floors[0]  # grows with N: up to every expert
    assert t.verify_floor_ms(1) < analyze(gpu_profile(batch=2), TreeShape.of(STOCK)).verify_floor_ms(1)
    # compute: 2 x the k experts' params a token touches (plus the rest) per token
    assert forward_floor_ms(p.target_params, 0, 0, 10**6, p) == pytest.approx(
        2 * (300_000_000 + EXPERT_PARAMS * K / E) * 10**6 / 500e12 * 1e3, rel=1e-12)


def test_a_measured_union_curve_sets_the_floor():
    p = moe_profile(expert_union={1: 8.0, 8: 20.0, 64: 60.0})
    t = analyze(p, TreeShape.of(STOCK), "stock")
    kv = p.kv_bytes_per_token * p.context
    assert t.verify_floor_ms(8) == pytest.approx((700_000_000 + 6_000_000_000 * 20 / E + kv) / 4e12 * 1e3, rel=1e-12)
    uniform = analyze(moe_profile(), TreeShape.of(STOCK), "stock")
    assert t.verify_floor_ms(8) < uniform.verify_floor_ms(8)  # real routers share experts between tokens
    again = CostTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.profile == p and again.to_dict() == t.to_dict()


def test_formats_leave_the_experts_alone():
    t = analyze(moe_profile(head_params=300_000_000), TreeShape.of(STOCK), "stock")
    p = t.profile
    kv = p.kv_bytes_per_token * p.context
    read = EXPERT_PARAMS * expected_experts_read(E, K, 8) / E
    dense = p.target_params - EXPERT_PARAMS * K / E - 300_000_000  # projections W12 encodes
    weights = (dense * 12.01 + 300_000_000 * HEAD_BITS + read * EXPERT_BITS) / 8
    assert t.format_floor("w12").verify_floor_ms == pytest.approx((weights + kv) / 4e12 * 1e3, rel=1e-12)
    # the measured format's bits per weight: the non-expert bytes over the non-expert params
    assert t.bits_per_weight == pytest.approx(8 * 700_000_000 / 300_000_000, rel=1e-12)


def test_the_best_tree_is_smaller_on_a_moe_target():
    """Same stored bytes, same acceptance: a dense target's verify floor is flat in N (memory bound),
    a MoE target's grows with the experts read, so its ceiling's tree has fewer nodes."""
    here = TreeShape.of(STOCK)
    dense, moe = analyze(gpu_profile(), here, "stock"), analyze(moe_profile(), here, "stock")
    assert moe.ceiling_shape is not None and dense.ceiling_shape is not None
    assert moe.ceiling_shape.nodes < dense.ceiling_shape.nodes
    assert moe.ceiling_ms_per_token < dense.ceiling_ms_per_token  # fewer bytes per token at any tree


def test_a_sliding_window_target_reads_at_most_its_window():
    # 60% of the KV per token in sliding layers of window 128; the profile's context is 600
    p = gpu_profile(sliding_kv_bytes_per_token=63_896, sliding_window=128)
    t = analyze(p, TreeShape.of(STOCK), "stock")
    kv = (106_496 - 63_896) * 600 + 63_896 * 128
    assert t.verify_floor_ms(8) == pytest.approx((6_700_000_000 + kv) / 4e12 * 1e3, rel=1e-12)
    assert t.verify_floor_ms(8) < analyze(gpu_profile(), TreeShape.of(STOCK)).verify_floor_ms(8)
    short = analyze(gpu_profile(sliding_kv_bytes_per_token=63_896, sliding_window=1024), TreeShape.of(STOCK))
    assert short.verify_floor_ms(8) == analyze(gpu_profile(), TreeShape.of(STOCK)).verify_floor_ms(8)  # 600 < window
