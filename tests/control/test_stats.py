"""GainEstimate and NoiseFloor: definitions, agreement with SciPy's BCa, p-value/bound consistency."""

import math

import numpy as np
import pytest
from scipy import stats

from specpilot.control.stats import GainEstimate, NoiseFloor


def ratios(n=25, loc=0.02, scale=0.01, seed=0):
    return tuple(np.random.default_rng(seed).standard_t(3, n) * scale + loc)


def test_gain_is_geometric_mean_ratio_minus_one():
    x = ratios()
    e = GainEstimate(x, resamples=2000)
    assert e.gain == pytest.approx(math.exp(np.mean(x)) - 1, rel=1e-12)
    assert e.lower < e.gain < e.upper
    assert e.standard_error == pytest.approx(np.std(x, ddof=1) / math.sqrt(len(x)))


def test_interval_is_the_hull_of_scipys_bca_and_the_t_interval():
    x = ratios(seed=3)
    e = GainEstimate(x, level=0.95, resamples=4999, seed=11)
    ref = stats.bootstrap((np.asarray(x),), np.mean, n_resamples=4999, method="BCa", vectorized=True,
                          rng=np.random.default_rng(11)).confidence_interval
    assert e.bca_interval == pytest.approx((math.expm1(ref.low), math.expm1(ref.high)), abs=1e-15)
    t = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=np.std(x, ddof=1) / math.sqrt(len(x)))
    assert e.t_interval == pytest.approx((math.expm1(t[0]), math.expm1(t[1])), abs=1e-12)
    assert e.interval == (min(e.bca_interval[0], e.t_interval[0]), max(e.bca_interval[1], e.t_interval[1]))


def test_one_sided_bound_at_half_alpha_is_the_two_sided_lower_end():
    e = GainEstimate(ratios(seed=5), resamples=3000)
    assert e.lower_bound(0.025) == pytest.approx(e.lower, abs=1e-15)
    assert e.lower_bound(0.01) < e.lower_bound(0.025) < e.lower_bound(0.2) < e.gain + 0.01


def test_one_spike_does_not_pull_the_lower_bound_up():
    """One outlying block dominates BCa's acceleration and lifts its lower bound; the t bound does not."""
    x = np.random.default_rng(0).normal(0.0, 0.003, 20)
    x[0] = 0.05
    e = GainEstimate(tuple(x), resamples=4000)
    assert e._bca_lower(0.0083) > e._t_bound(0.0083, -1)
    assert e.lower_bound(0.0083) == e._t_bound(0.0083, -1) < 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_p_value_inverts_the_bound(seed):
    """p(theta) is the alpha at which the BCa lower bound equals theta, so p < alpha <=> bound > theta."""
    e = GainEstimate(ratios(n=30, seed=seed), resamples=4000, seed=seed)
    for theta in np.linspace(e.lower_bound(0.002), e.gain, 7)[1:-1]:
        p = e.p_value(theta)
        assert 0 < p < 0.5
        assert e.lower_bound(p) == pytest.approx(theta, abs=2e-4)
        for alpha in (0.005, 0.0125, 0.025, 0.05, 0.1):
            if abs(alpha - p) > 1e-3:
                assert (p < alpha) == (e.lower_bound(alpha) > theta)
    assert e.p_value(-0.5) < 1e-12
    assert e.p_value(0.5) > 1 - 1e-12


def test_degenerate_blocks_collapse_the_interval():
    e = GainEstimate((0.01,) * 10)
    assert e.interval == (e.gain, e.gain)
    assert e.lower_bound(0.01) == e.gain
    assert e.p_value(0.0) == 0.0 and e.p_value(0.02) == 1.0


def test_round_trip_and_validation():
    e = GainEstimate(ratios(), resamples=1000, seed=4)
    again = GainEstimate.from_dict(e.to_dict())
    assert again == e and again.interval == e.interval
    with pytest.raises(ValueError):
        GainEstimate((0.1,))
    with pytest.raises(ValueError):
        GainEstimate((0.1, float("nan")))


def test_noise_floor_is_the_largest_excluded_aa_difference():
    centred = GainEstimate(ratios(loc=0.0, scale=0.002, seed=8), resamples=2000)
    offset = GainEstimate(ratios(loc=-0.004, scale=0.002, seed=8), resamples=2000)
    for e in (centred, offset):
        n = NoiseFloor(e, "p")
        assert n.value == max(abs(e.lower), abs(e.upper))
        assert n.value >= e.half_width
    # a systematic A/A offset raises the floor; the half-width alone would not see it
    assert NoiseFloor(offset).value > NoiseFloor(centred).value + 0.003
    assert NoiseFloor.from_dict(NoiseFloor(offset, "p").to_dict()) == NoiseFloor(offset, "p")
