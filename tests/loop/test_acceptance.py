"""The positional acceptance model: trees it builds, expected lengths, and fitting measurements."""

import numpy as np
import pytest

from specpilot.loop.acceptance import (DEFAULT_RANK_DECAY, AcceptanceModel, TreeShape, depth_curve, node_values,
                                       rank_decay)


def test_a_chain_accepts_depth_d_with_probability_alpha_to_the_d():
    alpha = 0.6
    curve = depth_curve(TreeShape(4, 1, 4), alpha, 1.0)
    assert np.allclose(curve, [alpha ** d for d in range(1, 5)], rtol=0, atol=1e-15)
    model = AcceptanceModel(alpha, 1.0, TreeShape(4, 1, 4), (), 0.0)
    assert model.tokens_per_round(TreeShape(4, 1, 4)) == pytest.approx(1 + sum(alpha ** d for d in range(1, 5)))


def test_trees_follow_the_drafter_best_first_and_hold_budget_nodes():
    shape = TreeShape(5, 4, 7)
    values, depths = node_values(shape, 0.5, 0.9)
    assert len(values) == 7 == shape.nodes - 1
    assert list(values) == sorted(values, reverse=True)  # the budget's best nodes
    assert depths.min() == 1 and np.all(np.diff(sorted(depths)) <= 1)  # prefix-closed: no level skipped
    # depth-1 values: rank j is right with chance c_j = alpha r^(j-1) once the ranks above missed
    c = 0.5 * DEFAULT_RANK_DECAY ** np.arange(4)
    p = c * np.concatenate([[1.0], np.cumprod(1 - c)[:-1]])
    n1 = int((depths == 1).sum())
    assert n1 >= 2 and np.allclose(np.sort(values[depths == 1])[::-1], p[:n1], rtol=0, atol=1e-15)
    assert TreeShape(2, 2, 100).nodes == 2 + 4 + 1  # a budget above the candidates is capped by them


def test_more_nodes_never_accept_less_and_more_depth_helps_a_good_drafter():
    model = AcceptanceModel(0.7, 0.95, TreeShape(5, 4, 7), (), 0.0)
    taus = [model.tokens_per_round(TreeShape(6, 4, b)) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert taus == sorted(taus) and taus[0] == pytest.approx(1.7)
    assert model.tokens_per_round(TreeShape(8, 1, 8)) > model.tokens_per_round(TreeShape(3, 1, 3))


def test_fit_recovers_the_parameters_that_made_the_curve():
    shape = TreeShape(5, 4, 7)
    measured = tuple(depth_curve(shape, 0.62, 0.85))
    model = AcceptanceModel.fit(measured, shape)
    assert model.residual < 0.01
    assert model.alpha == pytest.approx(0.62, abs=0.03) and model.decay == pytest.approx(0.85, abs=0.06)
    assert model.curve(shape) == pytest.approx(measured, abs=0.02)


def test_fit_without_acceptance_is_plain_ar_and_round_trips():
    model = AcceptanceModel.fit((0.0, 0.0, 0.0), TreeShape(3, 2, 4))
    assert model.alpha == 0.0 and model.tokens_per_round(TreeShape(8, 8, 64)) == 1.0
    fitted = AcceptanceModel.fit((0.7, 0.4), TreeShape(2, 2, 3))
    assert AcceptanceModel.from_dict(fitted.to_dict()) == fitted
    with pytest.raises(ValueError):
        TreeShape(0, 1, 1)


def test_a_curve_whose_acceptance_rises_with_depth_does_not_extrapolate_to_free_deep_nodes():
    # P(accepted >= d) measured on the H200 with EAGLE-3 at depth 5, topk 4, 7 nodes, concurrency 8
    # (results/loop/fixture-x16-batch, round 2): going one deeper gets likelier with depth
    shape = TreeShape(5, 4, 7)
    measured = (0.846, 0.737, 0.666, 0.550, 0.506)
    model = AcceptanceModel.fit(measured, shape)
    assert model.decay <= 1.0
    assert model.residual < 0.1
    # the depth-16, topk-2, 32-node tree that measured 30.6% slower had been predicted 12 tokens a
    # round (decay 1.125: a_d at its clip from depth 4 on)
    assert model.tokens_per_round(TreeShape(16, 2, 32)) < 8.0


def test_a_lower_rank_is_worth_less_than_the_top_one_was():
    """Once rank 1 missed, rank 2 is right with a smaller chance than rank 1 had: widening a tree
    adds less than the geometric model (every rank as likely as the top one) said."""
    for r in (rank_decay("model"), rank_decay("eagle3"), rank_decay("ngram")):
        assert 0 < r < 1
        values, _ = node_values(TreeShape(1, 4, 4), 0.8, 1.0, r)
        # p_2 / p_1 = c_2 (1 - c_1) / c_1 = r (1 - alpha); the geometric model's was 1 - alpha
        assert values[1] / values[0] == pytest.approx(r * (1 - 0.8), rel=1e-12)
    # the fit keeps its drafter's r; a model stored before r existed was the geometric one
    model = AcceptanceModel.fit((0.8, 0.6, 0.45), TreeShape(3, 4, 7), rank_decay("eagle3"))
    assert model.rank == rank_decay("eagle3") and AcceptanceModel.from_dict(model.to_dict()) == model
    old = {k: v for k, v in model.to_dict().items() if k != "rank"}
    assert AcceptanceModel.from_dict(old).rank == 1.0
