import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from specpilot.bench.stats import (
    MIN_UNITS,
    IntervalMethod,
    Resampling,
    expanded_alpha,
    geometric_mean,
    geometric_mean_bootstrap,
    per_token_bootstrap,
    per_token_ratio,
)


def simulated_set(rng, n, ratio, length_sigma=0.3, noise=0.3, early=0.5):
    """Paired per-prompt (AR seconds, AR tokens, system seconds, system tokens) whose population
    per-token speedup is exactly `ratio`.

    Output lengths are lognormal; the system ends each output early by up to `early` of AR's length;
    both arms' per-prompt times are lognormal around (tokens x a time per token), AR's with 5% noise,
    the system's with `noise` (acceptance differs by prompt) and a mean 1/ratio of AR's.
    """
    ar_tokens = np.maximum(1.0, np.round(rng.lognormal(5.0, length_sigma, n)))
    tokens = np.maximum(1.0, np.round(ar_tokens * rng.uniform(1.0 - early, 1.0, n)))
    ar = ar_tokens * 0.01 * rng.lognormal(0.0, 0.05, n) / math.exp(0.05**2 / 2)
    system = tokens * 0.01 / ratio * rng.lognormal(0.0, noise, n) / math.exp(noise**2 / 2)
    return ar, ar_tokens, system, tokens


def same_length(ar_seconds, seconds):
    """Arguments of `per_token_bootstrap` for two arms that generate the same 100 tokens per unit."""
    ones = np.full(len(ar_seconds), 100.0)
    return ar_seconds, ones, seconds, ones


def test_per_token_ratio_and_geometric_mean():
    assert per_token_ratio([1.0, 3.0], [10, 10], [1.0, 1.0], [10, 10]) == 2.0
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        geometric_mean([1.0, 0.0])


def test_a_system_that_ends_early_is_not_faster_by_stopping():
    """Issue 27's numbers: 1,046 tokens in 3.63x less time than AR's 1,536 is 2.47x per token."""
    ar_seconds, ar_tokens = [3.63] * 4, [384] * 4
    seconds, tokens = [1.0] * 4, [300, 280, 250, 216]
    boot = per_token_bootstrap(ar_seconds, ar_tokens, seconds, tokens, Resampling.draw([4], 200).indices[0])
    assert boot.estimate == pytest.approx(3.63 * 1046 / 1536) == pytest.approx(2.472, abs=1e-3)
    assert boot.estimate != pytest.approx(sum(ar_seconds) / sum(seconds))  # the old total-time ratio, 3.63x


def test_estimates_are_per_token_ratios_and_geometric_mean_of_ratios():
    a1, b1 = np.array([10.0, 30.0]), np.array([5.0, 5.0])  # set 1: 40/10 = 4x, same tokens
    a2, b2 = np.array([1.0, 1.0]), np.array([1.0, 1.0])  # set 2: 1x, 20x shorter
    res = Resampling.draw([2, 2], 200, seed=0)
    s1 = per_token_bootstrap(*same_length(a1, b1), res.indices[0])
    s2 = per_token_bootstrap(*same_length(a2, b2), res.indices[1])
    assert s1.estimate == pytest.approx(4.0) and s2.estimate == pytest.approx(1.0)
    g = geometric_mean_bootstrap([s1, s2])
    assert g.estimate == pytest.approx(2.0)  # sqrt(4 * 1): on ratios...
    assert g.estimate != pytest.approx(np.sum([*a1, *a2]) / np.sum([*b1, *b2]))  # ...not pooled times (3.0x)
    assert g.estimate != pytest.approx(np.mean(np.concatenate([a1 / b1, a2 / b2])))  # nor mean of prompt ratios


def test_replicates_resample_units_in_pairs():
    a, n = np.array([1.0, 2.0, 4.0]), np.array([10.0, 10.0, 20.0])
    b, m = np.array([1.0, 1.0, 1.0]), np.array([10.0, 5.0, 10.0])
    idx = np.array([[0, 0, 0], [2, 2, 1], [0, 1, 2]])
    boot = per_token_bootstrap(a, n, b, m, idx)
    expected = [(3 / 30) / (3 / 30), (10 / 50) / (3 / 25), (7 / 40) / (3 / 25)]
    assert np.exp(boot.log_replicates) == pytest.approx(expected)


@pytest.mark.parametrize("method", list(IntervalMethod))
def test_interval_covers_the_known_ratio_on_a_large_sample(method):
    rng = np.random.default_rng(0)
    data = simulated_set(rng, 400, ratio=2.5)
    iv = per_token_bootstrap(*data, Resampling.draw([400], 2000, seed=1).indices[0]).interval(0.95, method)
    assert iv.contains(2.5) and iv.no_interval is None
    assert iv.high / iv.low < 1.15 and iv.low < iv.estimate < iv.high


def test_bca_coverage_is_near_nominal_in_simulation():
    """Over 200 simulated 10-prompt runs (systems ending early, lognormal times), the 95% BCa interval
    covers the true per-token speedup close to 95% of the time, per set and for the 5-set geometric
    mean (stratified). Fixed seeds: deterministic."""
    rng = np.random.default_rng(7)
    truths = [2.0, 3.0, 1.5, 4.0, 2.5]
    trials, set_hits, geo_hits = 200, 0, 0
    for t in range(trials):
        res = Resampling.draw([10] * len(truths), 1000, seed=t)
        boots = [per_token_bootstrap(*simulated_set(rng, 10, r), res.indices[k]) for k, r in enumerate(truths)]
        set_hits += boots[0].interval(0.95, IntervalMethod.BCA).contains(truths[0])
        geo_hits += geometric_mean_bootstrap(boots).interval(0.95, IntervalMethod.BCA).contains(geometric_mean(truths))
    # measured 91.0% and 97.0% (binomial sd at 200 trials: ~1.7 points); without the small-sample
    # expansion of the tails (stats.expanded_alpha) the per-set coverage was about 86% (see stats.py)
    assert 0.88 <= set_hits / trials <= 0.99
    assert 0.88 <= geo_hits / trials <= 0.99


def test_bca_matches_scipy_at_the_expanded_level():
    rng = np.random.default_rng(3)
    data = simulated_set(rng, 12, ratio=2.0)
    boot = per_token_bootstrap(*data, Resampling.draw([12], 20000, seed=0).indices[0])
    ours = boot.interval(0.95, IntervalMethod.BCA)
    assert ours.method is IntervalMethod.BCA

    def log_ratio(a, n, b, m, axis=-1):
        return np.log(a.sum(axis) / n.sum(axis)) - np.log(b.sum(axis) / m.sum(axis))

    ref = scipy_stats.bootstrap(data, log_ratio, paired=True, vectorized=True, n_resamples=20000, method="BCa",
                                confidence_level=1 - 2 * expanded_alpha(0.95, 12), random_state=0).confidence_interval
    assert ours.low == pytest.approx(math.exp(ref.low), rel=0.02)
    assert ours.high == pytest.approx(math.exp(ref.high), rel=0.02)


def test_expanded_alpha_widens_small_samples_only():
    assert expanded_alpha(0.95, 10) == pytest.approx(0.0085, abs=2e-4)
    assert expanded_alpha(0.95, 10) < expanded_alpha(0.95, 30) < expanded_alpha(0.95, 10_000) < 0.025
    assert expanded_alpha(0.95, 10_000) == pytest.approx(0.025, abs=1e-4)


@pytest.mark.parametrize("units", [1, 2, 3, MIN_UNITS - 1])
def test_fewer_than_five_units_give_no_interval(units):
    """The studentized bootstrap printed [1.34, 7.7e18] and [0.00, inf] on 4 and 2 prompts: now n/a."""
    res = Resampling.draw([units, 6], 200, seed=0)
    few = per_token_bootstrap(*same_length([2.0, 2.9, 1.1, 2.5][:units], [1.0, 1.2, 0.9, 1.0][:units]), res.indices[0])
    six = per_token_bootstrap(*same_length([2.0, 2.2, 1.9, 2.4, 2.1, 1.8], [1.0, 1.1, 1.0, 0.9, 1.0, 1.2]),
                              res.indices[1])
    for iv in (few.interval(), geometric_mean_bootstrap([few, six]).interval()):
        assert math.isnan(iv.low) and math.isnan(iv.high) and iv.no_interval == "n < 5"
        assert iv.estimate > 0 and "[n/a (n < 5)]" in iv.format()
        d = iv.to_dict()
        assert d["low"] is None and d["high"] is None and d["no_interval"] == "n < 5" and d["estimate"] > 0
    assert six.interval().no_interval is None


@pytest.mark.parametrize("method", list(IntervalMethod))
def test_five_units_give_finite_bounds_even_when_one_unit_dominates(method):
    boot = per_token_bootstrap(*same_length([2.0, 2.1, 1.9, 2.0, 40.0], [1.0, 1.0, 1.0, 1.0, 1.0]),
                               Resampling.draw([5], 2000, seed=0).indices[0])
    iv = boot.interval(0.95, method)
    assert 0 < iv.low <= iv.estimate <= iv.high < 100 and iv.no_interval is None


@pytest.mark.parametrize("method", list(IntervalMethod))
def test_constant_ratio_gives_a_point_interval(method):
    boot = per_token_bootstrap(*same_length([2.0, 4.0, 6.0, 8.0, 10.0], [1.0, 2.0, 3.0, 4.0, 5.0]),
                               Resampling.draw([5], 200, seed=0).indices[0])
    iv = boot.interval(0.95, method)
    assert iv.low == pytest.approx(2.0) and iv.high == pytest.approx(2.0) and iv.estimate == pytest.approx(2.0)
    assert iv.method is IntervalMethod.PERCENTILE  # no jackknife variance: BCa is undefined


def test_invalid_inputs_are_refused():
    idx = Resampling.draw([2], 200).indices[0]
    with pytest.raises(ValueError, match="positive"):
        per_token_bootstrap([1.0, 1.0], [10, 0], [1.0, 1.0], [10, 10], idx)
    with pytest.raises(ValueError, match="equal-length"):
        per_token_bootstrap([1.0, 1.0], [10], [1.0, 1.0], [10, 10], idx)


def test_resampling_is_seeded():
    a, b = Resampling.draw([5, 7], 300, seed=4), Resampling.draw([5, 7], 300, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))
    assert a.resamples == 300 and a.indices[1].shape == (300, 7)
