"""The sequence-level bootstrap: exact degenerate cases, determinism, and its SE vs the delta method."""

from __future__ import annotations

import numpy as np
import pytest

from specpilot.guard.statistics import SequenceCounts, bootstrap_differences, rate_difference


def counts(tokens, mismatches) -> SequenceCounts:
    return SequenceCounts(np.array(tokens, dtype=np.int64), np.array(mismatches, dtype=np.int64))


def test_identical_sides_give_an_exactly_zero_interval():
    c = counts([100, 50, 80], [3, 0, 1])
    d = rate_difference(c, c, paired=True, resamples=500)
    assert (d.difference, d.lower, d.upper, d.standard_error) == (0.0, 0.0, 0.0, 0.0)
    assert d.candidate_rate == d.stock_rate == 4 / 230


def test_no_mismatches_anywhere_gives_zero():
    d = rate_difference(counts([10, 20], [0, 0]), counts([15, 5, 9], [0, 0, 0]), paired=False, resamples=200)
    assert (d.lower, d.upper) == (0.0, 0.0) and not d.paired


def test_same_seed_same_bounds():
    rng = np.random.default_rng(0)
    n = rng.integers(500, 2049, 30)
    c, s = counts(n, rng.binomial(n, 0.02)), counts(n, rng.binomial(n, 0.01))
    a = rate_difference(c, s, paired=True, resamples=1000, seed=4)
    b = rate_difference(c, s, paired=True, resamples=1000, seed=4)
    assert a == b
    assert a.lower < a.difference < a.upper
    assert a.difference == pytest.approx(c.rate - s.rate, abs=0)


def test_resampling_in_blocks_matches_one_block(monkeypatch):
    import specpilot.guard.statistics as st

    c, s = counts([10, 20, 30, 40], [1, 2, 3, 4]), counts([10, 20, 30, 40], [0, 1, 0, 2])
    whole = bootstrap_differences(c, s, paired=False, resamples=300, seed=1)
    monkeypatch.setattr(st, "_BLOCK_ELEMENTS", 8)  # 2 resamples per block
    blocks = bootstrap_differences(c, s, paired=False, resamples=300, seed=1)
    assert whole.shape == blocks.shape == (300,)
    # different draws, same distribution: both centred on the true difference
    assert abs(whole.mean() - blocks.mean()) < 0.01


def test_paired_bootstrap_se_matches_the_delta_method():
    """For many prompts the bootstrap SE of a difference of ratios agrees with the linearised
    (cluster-robust) SE computed from per-prompt influence values."""
    rng = np.random.default_rng(11)
    n_c = rng.integers(200, 2049, 200)
    n_s = rng.integers(200, 2049, 200)
    p = rng.gamma(2.0, 0.01, 200)  # shared prompt difficulty
    c, s = counts(n_c, rng.binomial(n_c, np.minimum(p + 0.01, 1))), counts(n_s, rng.binomial(n_s, p))
    d = rate_difference(c, s, paired=True, resamples=4000, seed=0)
    u = (c.mismatches - c.rate * c.tokens) / c.tokens.sum() - (s.mismatches - s.rate * s.tokens) / s.tokens.sum()
    delta_se = np.sqrt((u**2).sum())
    assert d.standard_error == pytest.approx(delta_se, rel=0.06)
    # pairing removes the shared prompt difficulty: the unpaired SE is larger
    assert rate_difference(c, s, paired=False, resamples=4000).standard_error > 1.2 * d.standard_error


def test_input_validation():
    with pytest.raises(ValueError):
        counts([5], [6])
    with pytest.raises(ValueError):
        counts([5, 5], [1])
    with pytest.raises(ValueError, match="same number"):
        rate_difference(counts([5], [1]), counts([5, 5], [1, 1]), paired=True)
