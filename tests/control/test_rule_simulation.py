"""Simulations of the promotion rule with fixed seeds (see timing_sim.py for the noise model).

The noise floor in each trial is measured like the controller does (A/A, `noise_blocks` blocks)
and the candidate then goes through the same sequential rule (`run_sequential`) with
K = 3 pre-declared looks. Trial counts keep the suite fast; bounds leave room for Monte Carlo
error (SE of a 2.5% rate over 300 trials is 0.9 points).
"""

import numpy as np
import pytest

from specpilot.control.config import ControllerConfig
from specpilot.control.rule import Reason, Outcome, decide, promotion_threshold, run_sequential
from specpilot.control.stats import GainEstimate, NoiseFloor

from timing_sim import SimulatedPair, TimingModel

CONFIG = ControllerConfig(resamples=1999)  # defaults: 20 blocks, +20 in steps of 10 (3 looks), 30 noise blocks


def trial(model: TimingModel, seed: int, threshold: float | None = None):
    rng = np.random.default_rng(seed)
    aa = SimulatedPair(TimingModel(0.0, model.noise, model.spike_rate, model.spike, model.drift), CONFIG, rng, "noise")
    noise = NoiseFloor(GainEstimate(tuple(aa.measure(0, CONFIG.noise_blocks)), resamples=CONFIG.resamples))
    thr = promotion_threshold(CONFIG, noise) if threshold is None else threshold
    pair = SimulatedPair(model, CONFIG, rng)
    return run_sequential(pair.measure, thr, CONFIG), noise


def rate(model, trials, threshold=None, seed0=0):
    verdicts = [trial(model, seed0 + i, threshold)[0][1].verdict for i in range(trials)]
    return sum(v is Outcome.PROMOTE for v in verdicts) / trials, verdicts


def test_aa_with_heavy_tails_and_drift_is_promoted_at_most_5_percent():
    promote, _ = rate(TimingModel(gain=0.0), 200)
    assert promote <= 0.05


def test_aa_lower_bound_alone_is_calibrated():
    """The rule's statistical core without its margin (threshold 0): the chance that the lower
    bound clears 0 on A/A data over all 3 looks stays at the nominal one-sided 2.5% (<= 5%)."""
    promote, _ = rate(TimingModel(gain=0.0), 300, threshold=0.0, seed0=1000)
    assert promote <= 0.05


def test_spikes_no_longer_make_bca_undercover():
    """With a ratio of sums per block, a spike made its block an outlier and BCa's 95% lower end
    cleared 0 on A/A data far more often than its nominal 2.5% (why the interval is the hull of BCa
    and t, see stats.py). The median of request-pair ratios keeps a spike out of the block value:
    on the same A/A data both BCa alone and the hull now stay within the nominal rate."""
    bca = hull = 0
    for seed in range(200):
        x = SimulatedPair(TimingModel(gain=0.0), CONFIG, np.random.default_rng(5000 + seed)).measure(0, CONFIG.blocks)
        e = GainEstimate(tuple(x), resamples=CONFIG.resamples)
        bca += e.bca_interval[0] > 0
        hull += e.lower > 0
    assert bca / 200 <= 0.05
    assert hull / 200 <= 0.035


def test_true_5_percent_gain_over_half_percent_noise_is_promoted():
    promote, verdicts = rate(TimingModel(gain=0.05, noise=0.005), 100, seed0=2000)
    assert promote >= 0.95


def test_gain_at_the_margin_is_not_promoted():
    """A true gain of exactly min_gain (1%) never clears 1% + 2 x noise."""
    promote, verdicts = rate(TimingModel(gain=0.01, noise=0.005), 60, seed0=3000)
    assert promote <= 0.05
    assert Outcome.REJECT in verdicts or Outcome.NEED_MORE_DATA in verdicts


def test_noise_floor_is_small_relative_to_the_request_noise():
    (_, _), noise = trial(TimingModel(gain=0.0, noise=0.005), 7)
    assert 0 < noise.value < 0.01


def test_undecided_candidates_use_exactly_the_declared_budget():
    """Interval straddling the threshold: need-more-data after max_blocks blocks, never more."""
    model = TimingModel(gain=0.0, noise=0.04, spike_rate=0.0, drift=0.0)
    undecided = 0
    for seed in range(10):
        (estimate, decision), _ = trial(model, 4000 + seed, threshold=0.0)
        assert estimate.n <= CONFIG.max_blocks
        if decision.verdict is Outcome.NEED_MORE_DATA:
            undecided += 1
            assert estimate.n == CONFIG.max_blocks and decision.look == CONFIG.looks
            assert decision.reasons == (Reason.UNDECIDED,)
    assert undecided >= 5


def test_looks_spend_alpha_bonferroni():
    e = GainEstimate(tuple(np.random.default_rng(0).normal(0.02, 0.01, 20)), resamples=1999)
    d = decide(e, 0.0, CONFIG, look=1)
    assert d.alpha_look == pytest.approx(CONFIG.alpha / 3)
    assert d.lower_bound == pytest.approx(e.lower_bound(CONFIG.alpha / 3))
    assert d.p_value == pytest.approx(min(1.0, 3 * e.p_value(0.0)))
    single = ControllerConfig(extra_blocks=0, resamples=1999)
    assert single.looks == 1 and decide(e, 0.0, single, 1).lower_bound == pytest.approx(e.lower)


@pytest.mark.parametrize("gain", [0.0, 0.05])
def test_interval_covers_the_true_gain_at_the_gpu_preset(gain):
    """Coverage of the reported 95% interval with the block statistic (median of request-pair log
    ratios) at the loop's GPU preset (10 blocks x 2 requests), heavy tails, spikes and drift included:
    the true gain lies inside in at least 90% of 200 seeded trials."""
    config = ControllerConfig(blocks=10, requests_per_block=2, resamples=999)
    covered = 0
    for seed in range(200):
        pair = SimulatedPair(TimingModel(gain=gain), config, np.random.default_rng(5000 + seed))
        lo, hi = GainEstimate(tuple(pair.measure(0, config.blocks)), resamples=config.resamples, seed=seed).interval
        covered += lo <= gain <= hi
    assert covered / 200 >= 0.90
