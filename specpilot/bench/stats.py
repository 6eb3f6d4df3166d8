"""Speedup statistics: the per-token speedup, the geometric mean, and bootstrap intervals.

Owns the definitions below and their arithmetic, and `bca_interval`: SciPy's BCa interval read off
a bootstrap distribution already drawn, the one BCa implementation of the package (the controller's
`control.stats` uses it too). Does not own timing (`runner.py`) or what is summarised (`results.py`).

Definitions (a *unit* is one timed batch; with --batch 1 it is one prompt):
- A unit i of a set has AR time a_i and AR tokens n_i, system time b_i and system tokens m_i,
  measured back to back in one process.
- Per-set speedup S = (sum_i a_i / sum_i n_i) / (sum_i b_i / sum_i m_i): AR's time per generated
  token over the system's, i.e. the ratio of tokens per second over the set. Per *token*, because a
  system that ends its outputs early (a different EOS, a lossy change) would otherwise look faster
  by doing less work: two thirds of AR's tokens in a third of its time is twice AR's speed, not three
  times. When the system's tokens equal AR's, S = sum a_i / sum b_i. Totals over the set, not a mean of
  per-prompt ratios (biased upward by Jensen's inequality) nor their geometric mean (which lets a
  20-token answer weigh as much as a 2048-token one).
- Across sets: G = exp(mean_s log S_s), the geometric mean of the per-set *ratios* (never of times,
  never of times pooled over sets): each set counts once however long its outputs are.
- Intervals: a paired bootstrap over units. A replicate draws n_s units with replacement within
  each set, keeping a unit's AR and system measurements together, and recomputes S_s from the
  drawn units; G's replicate combines one such S_s per set (a stratified bootstrap: sets are never
  mixed and every replicate has every set). One `Resampling` (seeded indices per set) serves every
  system of a run, so the intervals of different systems are paired too.
- Interval method (default `bca`, Efron 1987): the bias-corrected and accelerated percentile
  interval as `scipy.stats.bootstrap` computes it (`bca_interval`) on the replicates drawn here: z0
  from the share of replicates below the estimate, the acceleration from the delete-one jackknife
  of each set's units (for G, the stratified form: each set is one of SciPy's samples). SciPy's own
  resampling is not used: it draws neither one `Resampling` shared by every system nor the
  stratified, paired draw of G. Where BCa is undefined — every replicate on one side of the
  estimate, or no jackknife variance — the percentile interval is used and the `Interval` says so.
  Both are transformation-invariant and their bounds are quantiles of the replicates, so they never
  run off to 0 or infinity the way the bootstrap-t did on 2-4 prompts ([0.00, inf]).
- Small samples: bootstrap percentiles are too narrow at small n (the plug-in variance divides by
  n, and they use normal rather than t tails): at n = 10, a nominal 95% BCa or percentile interval
  covered the true per-token ratio in only 83-88% of simulated runs. Both methods therefore start
  from Hesterberg's (2015) expanded tail, alpha' = Phi(-sqrt(n/(n-1)) t_{n-1, 1-alpha}) with n the
  smallest set's units (`expanded_alpha`); the expansion fades as n grows (alpha' -> alpha).
  Measured (400 runs, 10 prompts per set, lognormal lengths sigma 0.3-1, 30-50% per-token noise,
  systems ending 0-50% early): per-set coverage 88-92% (BCa) and 89-93% (percentile), 5-set
  geometric mean 93-96%; at 30 prompts 91-95%. tests/bench/test_stats.py keeps such a check.
- With fewer than MIN_UNITS units in a set there is no interval at all (NaN bounds, `no_interval`
  = "n < 5"), nor then for G: at such n no bootstrap interval means anything.
"""

from __future__ import annotations

import enum
import math
import warnings
from dataclasses import dataclass
from statistics import NormalDist
from types import SimpleNamespace
from typing import Callable

import numpy as np

from specpilot.errors import ConfigError

DEFAULT_RESAMPLES = 10_000
DEFAULT_LEVEL = 0.95
MIN_UNITS = 5  # fewer units in a set: no interval for it, nor for the geometric mean
TOO_FEW = f"n < {MIN_UNITS}"


class IntervalMethod(enum.Enum):
    BCA = "bca"  # bias-corrected and accelerated percentile (percentile where BCa is undefined)
    PERCENTILE = "percentile"


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval; `no_interval` says why bounds are missing."""

    estimate: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL
    method: IntervalMethod = IntervalMethod.BCA
    no_interval: str | None = None  # e.g. "n < 5"; None when low and high are bounds

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        def num(x):  # JSON has no NaN or Infinity: an unknown end is null
            return float(x) if math.isfinite(x) else None

        return {"estimate": num(self.estimate), "low": num(self.low), "high": num(self.high),
                "level": self.level, "method": self.method.value, "no_interval": self.no_interval}

    def format(self, digits: int = 2, unit: str = "x") -> str:
        est = f"{self.estimate:.{digits}f}{unit}"
        if self.no_interval or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{est} [n/a ({self.no_interval})]" if self.no_interval else f"{est} [n/a]"
        return f"{est} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


@dataclass(frozen=True)
class Resampling:
    """Bootstrap draws: for each set, an [R, n_s] array of unit indices drawn with replacement."""

    indices: tuple[np.ndarray, ...]
    seed: int

    @classmethod
    def draw(cls, sizes: list[int], resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> "Resampling":
        if resamples < 100:
            raise ConfigError(f"bootstrap needs at least 100 resamples (got {resamples})")
        rng = np.random.default_rng(seed)
        return cls(tuple(rng.integers(0, n, size=(resamples, n), dtype=np.int32) for n in sizes), seed)

    @property
    def resamples(self) -> int:
        return int(self.indices[0].shape[0]) if self.indices else 0


# The log statistic of the units drawn from each sample (one index array per sample, [..., n_drawn]),
# vectorized over leading axes: what SciPy's jackknife recomputes for BCa's acceleration.
Statistic = Callable[..., np.ndarray]


@dataclass(frozen=True)
class LogBootstrap:
    """A positive statistic on the log scale: its estimate, its bootstrap replicates, and how to
    recompute it from drawn units (for BCa's jackknife); `units` is the smallest set's number of units.

    `samples` are the unit indices of each independently resampled sample (`arange(n_s)`, one per
    set), and `statistic(*drawn_indices)` the log statistic of the units drawn from each."""

    log_estimate: float
    log_replicates: np.ndarray  # [R]
    samples: tuple[np.ndarray, ...]  # [n_s] unit indices per resampled sample
    statistic: Statistic
    units: int

    @property
    def estimate(self) -> float:
        return math.exp(self.log_estimate)

    def interval(self, level: float = DEFAULT_LEVEL, method: IntervalMethod = IntervalMethod.BCA) -> Interval:
        est = self.estimate
        if self.units < MIN_UNITS:
            return Interval(est, math.nan, math.nan, level, method, TOO_FEW)
        alpha = expanded_alpha(level, self.units)
        reps, est_log = self.log_replicates, self.log_estimate
        low = high = math.nan
        # BCa is undefined with every replicate on one side of the estimate (z0 infinite) or all of
        # them at one point (no jackknife variance either, up to rounding)
        spread = float(reps.max() - reps.min()) > 1e-12 * max(1.0, abs(est_log))
        if method is IntervalMethod.BCA and spread and np.any(reps <= est_log) and np.any(reps >= est_log):
            low, high = bca_interval(self.samples, self.statistic, reps, 1.0 - 2.0 * alpha)
        if math.isnan(low) or math.isnan(high):  # percentile asked for, or BCa undefined here
            method = IntervalMethod.PERCENTILE
            low, high = (float(q) for q in np.quantile(reps, (alpha, 1.0 - alpha)))
        return Interval(est, math.exp(low), math.exp(high), level, method)


def bca_interval(samples, statistic: Statistic, replicates: np.ndarray, confidence_level: float,
                 alternative: str = "two-sided") -> tuple[float, float]:
    """SciPy's BCa interval (`scipy.stats.bootstrap`, Efron 1987) of `statistic` on `samples`, read
    off `replicates`, a bootstrap distribution already drawn: no new resampling. `statistic` takes
    one array per sample and reduces along the last axis. NaN bounds where BCa is undefined."""
    from scipy import stats

    drawn = SimpleNamespace(bootstrap_distribution=np.asarray(replicates))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate jackknife warns and gives NaN; extreme levels clip
        ci = stats.bootstrap(tuple(samples), statistic, n_resamples=0, bootstrap_result=drawn,
                             confidence_level=confidence_level, alternative=alternative, method="BCa",
                             vectorized=True, paired=False).confidence_interval
    return float(ci.low), float(ci.high)


def expanded_alpha(level: float, units: int) -> float:
    """The one-sided tail the bootstrap quantiles use for a `level` interval from `units` units:
    Phi(-sqrt(n / (n - 1)) t_{n-1}), Hesterberg's small-sample expansion (0.025 -> 0.0085 at n = 10)."""
    from scipy import stats

    tail = (1.0 - level) / 2.0
    return NormalDist().cdf(-math.sqrt(units / (units - 1)) * float(stats.t.ppf(1.0 - tail, units - 1)))


def geometric_mean(values) -> float:
    """exp(mean(log v)); every value must be positive."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.any(~(v > 0)):
        raise ValueError(f"geometric mean needs positive values, got {v.tolist()}")
    return float(np.exp(np.mean(np.log(v))))


def per_token_ratio(numerator_seconds, numerator_tokens, denominator_seconds, denominator_tokens) -> float:
    """(sum numerator seconds / sum numerator tokens) / (sum denominator seconds / sum denominator tokens)."""
    return (float(np.sum(numerator_seconds)) / float(np.sum(numerator_tokens))
            / (float(np.sum(denominator_seconds)) / float(np.sum(denominator_tokens))))


def _log_ratio(a: np.ndarray, n: np.ndarray, b: np.ndarray, m: np.ndarray) -> np.ndarray:
    """log of the per-token ratio from sums along the last axis."""
    return (np.log(a.sum(axis=-1)) - np.log(n.sum(axis=-1))) - (np.log(b.sum(axis=-1)) - np.log(m.sum(axis=-1)))


def per_token_bootstrap(numerator_seconds, numerator_tokens, denominator_seconds, denominator_tokens,
                        indices: np.ndarray) -> LogBootstrap:
    """S = (numerator time per token) / (denominator time per token) over paired units, e.g. AR over
    a system: the ratio of the system's tokens per second to AR's.

    `indices` [R, n]: the units of each replicate (one set's entry of a `Resampling`).
    """
    cols = [np.asarray(x, dtype=np.float64) for x in
            (numerator_seconds, numerator_tokens, denominator_seconds, denominator_tokens)]  # 4 x [n]
    if any(c.shape != cols[0].shape for c in cols) or cols[0].ndim != 1 or cols[0].size == 0:
        raise ValueError("paired times and tokens must be equal-length, non-empty 1-D sequences")
    if any(np.any(~(c > 0)) for c in cols):
        raise ValueError("times and token counts must be positive")
    if indices.ndim != 2 or indices.shape[1] != cols[0].size:
        raise ValueError(f"indices of shape {indices.shape} do not resample {cols[0].size} units")

    def statistic(drawn: np.ndarray, axis: int = -1) -> np.ndarray:  # drawn [..., k] unit indices
        return _log_ratio(*(c[drawn] for c in cols))

    n = int(cols[0].size)
    return LogBootstrap(float(_log_ratio(*cols)), statistic(indices), (np.arange(n),), statistic, n)


def geometric_mean_bootstrap(per_set: list[LogBootstrap]) -> LogBootstrap:
    """G = exp(mean_s log S_s) with every set resampled on its own (stratified)."""
    if not per_set:
        raise ValueError("no sets")
    parts = _split([s.samples for s in per_set])

    def statistic(*drawn: np.ndarray, axis: int = -1) -> np.ndarray:  # one index array per set's sample
        return np.mean([s.statistic(*drawn[part]) for s, part in zip(per_set, parts)], axis=0)

    return LogBootstrap(
        float(np.mean([s.log_estimate for s in per_set])),
        np.mean([s.log_replicates for s in per_set], axis=0),
        tuple(x for s in per_set for x in s.samples),  # each set resampled on its own (stratified)
        statistic,
        min(s.units for s in per_set),
    )


def _split(groups: list[tuple]) -> list[slice]:
    """The slice of each group's samples in their concatenation."""
    ends = np.cumsum([0] + [len(g) for g in groups])
    return [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]


# ---- serving statistics (`serving_results.py`): a unit is one timed closed-loop run of requests ----
QUANTILE_RESAMPLES = 2000
def throughput_bootstrap(seconds, tokens, indices: np.ndarray) -> LogBootstrap:
    """Tokens per second, sum of tokens / sum of seconds over the units, bootstrapped on `indices`."""
    ones = np.ones(len(seconds))
    return per_token_bootstrap(ones, ones, seconds, tokens, indices)


def quantile_bootstrap(values: np.ndarray, q: float, indices: np.ndarray,
                       replicates: int = QUANTILE_RESAMPLES) -> LogBootstrap:
    """The q-quantile of positive values pooled over units, `values [n, m]` (m per unit, NaN = none),
    resampled by whole units (a cluster bootstrap: requests served together are not independent),
    on the first `replicates` rows of `indices` (a pooled quantile per replicate costs far more
    than a ratio of sums)."""
    n = values.shape[0]
    if np.any(~(values[~np.isnan(values)] > 0)):
        raise ValueError("quantiles are bootstrapped on the log scale: values must be positive")
    quantile = np.nanquantile if np.isnan(values).any() else np.quantile

    def statistic(drawn: np.ndarray, axis: int = -1) -> np.ndarray:  # drawn [..., k] unit indices
        pooled = values[drawn].reshape(*drawn.shape[:-1], -1)  # [..., k * m]
        return np.log(quantile(pooled, q, axis=-1))

    est = float(np.log(quantile(values, q)))
    return LogBootstrap(est, statistic(indices[:replicates]), (np.arange(n),), statistic, n)


def ratio_of_independent(a: LogBootstrap, b: LogBootstrap) -> LogBootstrap:
    """a / b for statistics of independently resampled units (e.g. two concurrency levels); both
    must have as many replicates."""
    k = len(a.samples)

    def statistic(*drawn: np.ndarray, axis: int = -1) -> np.ndarray:  # a's samples, then b's
        return a.statistic(*drawn[:k]) - b.statistic(*drawn[k:])

    return LogBootstrap(a.log_estimate - b.log_estimate, a.log_replicates - b.log_replicates,
                        a.samples + b.samples, statistic, min(a.units, b.units))
