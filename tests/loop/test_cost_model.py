"""The cost model: floors, gaps, the ceiling and predictions, on synthetic GPU profiles and one measured on the H200."""

import json
import math
from pathlib import Path

import pytest
from loop_fixtures import SLOW_SWITCH, STOCK, cost_table, gpu_profile

from specpilot.config import DrafterKind
from specpilot.loop.acceptance import TreeShape
from specpilot.loop.cost_model import CostTable, GapKind, analyze, forward_floor_ms, interpolate, profile_from_dict

H200_LOOP_REPORT = Path(__file__).resolve().parents[2] / "results" / "loop" / "fixture-x16" / "report.json"


def test_floors_are_bytes_over_bandwidth_unless_compute_bound():
    p = gpu_profile()
    kv = p.kv_bytes_per_token * p.context
    assert forward_floor_ms(p.target_params, p.target_bytes, kv, 8, p) == pytest.approx(
        (p.target_bytes + kv) / 4e12 * 1e3, rel=1e-12)
    assert forward_floor_ms(p.target_params, p.target_bytes, kv, 100_000, p) == pytest.approx(
        2 * p.target_params * 100_000 / 500e12 * 1e3, rel=1e-12)


def test_floors_stay_below_what_the_h200_measured():
    """fixture-x16's stock profile as the loop measured it on the H200 (results/loop/fixture-x16/report.json):
    a floor is a lower bound, so neither the verify forward nor AR decoding may be measured below it."""
    before = json.loads(H200_LOOP_REPORT.read_text())["gaps"]["before"]
    p, ar_ms = profile_from_dict(before["profile"]), before["ar_ms_per_token"]
    assert before["system"] == "stock" and p.device.startswith("cuda") and p.target_params > 3e9  # the x16 target
    t = analyze(p, TreeShape(**before["shape"]), "stock", before["draft_kv_bytes_per_token"], ar_ms_per_token=ar_ms)
    assert t.verify_floor_ms(1) < ar_ms and t.verify_floor < p.verify_ms
    assert t.gap(GapKind.VERIFY_KERNELS).saving_ms_per_token > 0  # the gap W12 and kernels work on is seen
    assert t.verify_floor == pytest.approx(p.target_bytes / (p.bandwidth_gbps * 1e9) * 1e3, rel=0.01)


def test_gaps_add_up_to_measured_minus_ceiling_and_are_ranked():
    t = cost_table()
    assert t.ms_per_token == pytest.approx(10.0 / 2.6)
    assert [g.kind for g in t.gaps] == sorted((g.kind for g in t.gaps), key=lambda k: -t.gap(k).saving_ms_per_token)
    assert {g.kind for g in t.gaps} == set(GapKind)
    assert sum(g.saving_ms_per_token for g in t.gaps) == pytest.approx(t.ms_per_token - t.ceiling_ms_per_token,
                                                                      rel=1e-12)
    v = t.gap(GapKind.VERIFY_KERNELS)
    assert v.saving_ms_per_token == pytest.approx((5.0 - t.verify_floor) / 2.6, rel=1e-12)
    assert t.gap(GapKind.OVERHEAD).measured_ms == pytest.approx(2.0)
    # memory bound: a bigger tree costs little at floor and accepts more, so the ceiling's tree is bigger
    assert t.ceiling_shape is not None and t.ceiling_shape.nodes > 8
    assert t.gap(GapKind.ACCEPTANCE).estimated


def test_predictions_reproduce_the_measurement_and_follow_the_curve():
    t = cost_table()
    here = TreeShape.of(STOCK)
    assert t.predict_ms_per_token(here) == pytest.approx(t.ms_per_token, rel=1e-12)
    assert t.tokens_per_round_for(here) == pytest.approx(2.6, rel=1e-12)
    assert t.verify_ms_at(64) == pytest.approx(5.0 * 7.6 / 5.0)
    assert t.predict_ms_per_token(TreeShape(6, 8, 48)) < t.ms_per_token  # cheap verify: wider wins
    assert t.predict_ms_per_token(None) == pytest.approx(4.6 + 1.0)  # AR: one-node forward + half the overhead
    assert analyze(gpu_profile(), here, "x", ar_ms_per_token=3.25).predict_ms_per_token(None) == 3.25  # measured
    assert interpolate(((1, 1.0), (3, 3.0)), 2) == 2.0 and interpolate(((1, 1.0), (3, 3.0)), 5) == 5.0


def test_the_drafter_kind_sets_how_much_a_wider_tree_is_worth():
    """EAGLE-3's lower-ranked candidates are right less often than the draft model's
    (`results/loop/acceptance_check.md`): from the same measurement, a wide tree is predicted to
    accept less for it, and the stock shape the same."""
    here, wide = TreeShape.of(STOCK), TreeShape(7, 8, 128)
    model, eagle3 = (analyze(gpu_profile(), here, "x", drafter=d) for d in ("model", "eagle3"))
    assert model.acceptance.rank == 0.6 and eagle3.acceptance.rank == 0.3
    assert eagle3.tokens_per_round_for(here) == pytest.approx(model.tokens_per_round_for(here), rel=1e-12)
    assert eagle3.tokens_per_round_for(wide) < model.tokens_per_round_for(wide)


def test_ar_has_no_acceptance_gap_and_its_floor_is_the_ceiling():
    ar = STOCK.with_changes(name="ar", drafter=DrafterKind.NONE)
    t = analyze(gpu_profile(accept_at_depth=(), tree_nodes=1, draft_ms=0.0, draft_forwards=0, drafter_bytes=0,
                            tokens_per_round=1.0, round_ms=5.0), None, ar.name)
    assert {g.kind for g in t.gaps} == {GapKind.VERIFY_KERNELS, GapKind.OVERHEAD}
    assert t.ceiling_shape is None and t.ceiling_ms_per_token == pytest.approx(t.verify_floor_ms(1))


def test_round_trip_and_render():
    from dataclasses import replace

    t = replace(cost_table(), switch_ms_per_token={"eagle3": 2.5})
    again = CostTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.to_dict() == t.to_dict() and again.render() == t.render()
    text = t.render()
    assert "ceiling" in text and all(k.value in text for k in GapKind) and "(estimate)" in text
    assert "eagle3 drafter 2.500 ms/token" in text


def test_format_floors_show_the_room_of_every_weight_format():
    """W12 moves 12.01 of BF16's 16 bits per weight: its floors and ceiling are lower, whatever the
    measured system runs; the gaps stay those of the measured format."""
    from specpilot.loop.cost_model import FORMAT_BITS, CostTable

    t = cost_table(head_params=300_000_000)
    p = t.profile
    assert [f.format for f in t.format_floors] == list(FORMAT_BITS) == ["bf16", "w12"]
    bf16, w12 = t.format_floor("bf16"), t.format_floor("w12")
    kv = p.kv_bytes_per_token * p.context
    # the projections at 12.01 bits, the lm_head (which W12 leaves in BF16) at 16
    weights = 3_000_000_000 * 12.01 / 8 + 300_000_000 * 2
    assert w12.verify_floor_ms == pytest.approx((weights + kv) / 4e12 * 1e3, rel=1e-12)
    assert cost_table().format_floor("w12").verify_floor_ms < w12.verify_floor_ms  # a profile without it
    assert w12.draft_floor_ms == pytest.approx(
        t.draft_forward_floor_ms(t.shape.topk, 12.01) * p.draft_forwards, rel=1e-12)
    assert w12.verify_floor_ms < bf16.verify_floor_ms < t.verify_floor  # 6.6 GB of BF16 params < 6.7 GB measured
    assert w12.ceiling_ms_per_token < bf16.ceiling_ms_per_token <= t.ceiling_ms_per_token
    assert bf16.ceiling_ms_per_token == pytest.approx(t.ceiling_ms_per_token, rel=0.02)
    assert sum(g.saving_ms_per_token for g in t.gaps) == pytest.approx(t.ms_per_token - t.ceiling_ms_per_token)
    back = CostTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.format_floors == t.format_floors
    assert "w12 (12.01 bits)" in t.render()
    # what the measured system runs, beside them: its weight bytes per touched parameter
    assert t.bits_per_weight == 8 * p.target_bytes / p.target_params
    assert f"(this system: {t.bits_per_weight:.1f} bits)" in t.render()
    old = {k: v for k, v in t.to_dict().items() if k != "format_floors"}  # a table stored before formats
    assert CostTable.from_dict(old).format_floors == ()
    # the system in another format: its verify forward at today's distance from that format's floor
    verify = t.verify_ms * w12.verify_floor_ms / t.verify_floor
    assert t.predict_format_ms_per_token("w12") == (t.draft_ms + verify + t.overhead_ms) / t.tokens_per_round
    assert t.predict_format_ms_per_token("bf16") < t.ms_per_token  # measured 6.7 GB, 6.6 GB in bf16
    assert math.isnan(CostTable.from_dict(old).predict_format_ms_per_token("w12"))


def test_the_verify_curve_is_measured_as_far_as_the_search_reaches():
    from specpilot.engine.profile import CURVE_NODES
    from specpilot.loop.cost_model import BUDGETS

    assert max(CURVE_NODES) >= max(BUDGETS) and list(CURVE_NODES) == sorted(set(CURVE_NODES))


def test_a_switched_drafter_gets_a_table_of_its_own_from_its_measured_rounds():
    from dataclasses import replace

    t = replace(cost_table(), switch_ms_per_token={"eagle3": SLOW_SWITCH["ms_per_token"]},
                switch_rounds={"eagle3": SLOW_SWITCH})
    s = t.switched("eagle3")
    here = TreeShape.of(STOCK)
    assert s.shape == here and s.acceptance.rank == 0.3  # EAGLE-3's rank decay
    assert s.ms_per_token == pytest.approx(SLOW_SWITCH["ms_per_token"])
    assert s.predict_ms_per_token(here) == pytest.approx(s.ms_per_token, rel=1e-12)
    assert s.draft_ms == pytest.approx(15.0 - t.verify_ms - t.overhead_ms) and s.verify_ms == t.verify_ms
    assert s.predict_ms_per_token(TreeShape(3, 4, 10)) < t.ms_per_token < s.ms_per_token  # shallower pays for it
    assert t.switched("dflash") is None and cost_table().switched("eagle3") is None
    wrong_depth = replace(t, switch_rounds={"eagle3": {**SLOW_SWITCH, "accept_at_depth": [0.9]}})
    assert wrong_depth.switched("eagle3") is None
    again = CostTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.switch_rounds == t.switch_rounds and again.switched("eagle3").to_dict() == s.to_dict()


def test_two_level_verification_is_priced_from_the_views_agreement():
    """Union acceptance 1 - (1 - P_tree(>=d)) (1 - a^d), calibrated to the measured tokens per round;
    cost: `chain` view forwards (the one-node forward at the view's bytes) and `chain` more nodes."""
    import math
    from dataclasses import replace

    from loop_fixtures import cost_table

    table = cost_table()
    assert math.isnan(table.predict_tlv_ms_per_token(2))  # no agreement measured
    p = table.profile
    tree = list(p.accept_at_depth)
    for a, chain in ((0.9, 2), (0.6, 4)):
        t = replace(table, view_agreement=a)
        union = [1 - (1 - x) * (1 - (a ** d if d <= chain else 0.0)) for d, x in enumerate(tree, 1)]
        tokens = p.tokens_per_round * (1 + sum(union)) / (1 + sum(tree))
        kv = p.kv_bytes_read(p.context)
        view = t.verify_ms_at(1) * (p.target_params + kv) / (p.target_bytes + kv)
        round_ms = p.round_ms + chain * view + t.verify_ms_at(p.tree_nodes + chain) - t.verify_ms_at(p.tree_nodes)
        assert t.predict_tlv_ms_per_token(chain) == pytest.approx(round_ms / tokens)
    assert CostTable.from_dict(replace(table, view_agreement=0.9).to_dict()).view_agreement == 0.9
    # a view that never agrees adds cost and no tokens; one that always does pays for itself here
    assert replace(table, view_agreement=0.0).predict_tlv_ms_per_token(2) > table.ms_per_token
    assert replace(table, view_agreement=1.0).predict_tlv_ms_per_token(4) < table.ms_per_token
