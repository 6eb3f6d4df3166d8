"""Size and power of the rate rule on simulated clustered mismatch counts (fixed seeds).

The issue's acceptance checks: with no real difference the rule rejects at most ~5% of the time;
with a real +1 pp at the article's sizes (tens of prompts x 2048 tokens) it rejects with high
power. Also checked: the size at the boundary of H0 (delta = the 0.5 pp margin), where a one-sided
95% test should reject about 5% of the time.
"""

from __future__ import annotations

import numpy as np
import pytest

from specpilot.guard.config import GuardConfig, RateTest
from specpilot.guard.simulation import Scenario, rejection_rate

CONFIG = GuardConfig(resamples=2000)


def test_the_simulated_stock_rate_and_clustering_are_as_specified():
    rng = np.random.default_rng(0)
    sc = Scenario(delta=0.0, sequences=4000)
    cand, stock = sc.sample(rng)
    assert stock.rate == pytest.approx(0.0072, rel=0.05)
    assert cand.rate == pytest.approx(0.0072, rel=0.05)
    # bursts of mean 3: counts are overdispersed well beyond binomial
    expected = stock.tokens * 0.0072
    assert ((stock.mismatches - expected) ** 2).mean() > 4 * expected.mean()


def test_no_real_difference_is_rejected_at_most_5_percent():
    assert rejection_rate(Scenario(delta=0.0), CONFIG, replicates=400, seed=1) <= 0.05


def test_size_at_the_margin_is_near_nominal():
    assert rejection_rate(Scenario(delta=0.005), CONFIG, replicates=400, seed=2) <= 0.075


def test_one_point_increase_is_rejected_with_high_power():
    assert rejection_rate(Scenario(delta=0.01), CONFIG, replicates=400, seed=3) >= 0.95


def test_unpaired_prompts_still_have_power_at_one_point():
    assert rejection_rate(Scenario(delta=0.01, paired=False), CONFIG, replicates=200, seed=4) >= 0.85


def test_non_inferiority_passes_equal_systems_and_rejects_the_boundary():
    config = GuardConfig(resamples=2000, rate_test=RateTest.NON_INFERIORITY)
    assert rejection_rate(Scenario(delta=0.0), config, replicates=200, seed=5) <= 0.05
    assert rejection_rate(Scenario(delta=0.005), config, replicates=200, seed=6) >= 0.9
