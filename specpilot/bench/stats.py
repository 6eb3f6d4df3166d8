"""Speedup statistics: the ratio-of-sums speedup, the geometric mean, and bootstrap intervals.

Owns the definitions below and their arithmetic. Does not own timing (`runner.py`) or what is
summarised (`results.py`).

Definitions (a *unit* is one timed batch; with --batch 1 it is one prompt):
- A unit i of a set has AR time a_i and system time b_i, measured back to back in one process.
- Per-set speedup S = sum_i a_i / sum_i b_i: how much less time the system needs to serve the set's
  prompts. Chosen over the arithmetic mean of per-prompt ratios (biased upward by Jensen's
  inequality: a system twice as fast on one prompt and twice as slow on another of equal length
  would score 1.25x) and over their geometric mean (which answers "the typical prompt", not "the
  workload", and lets a 20-token answer weigh as much as a 2048-token one). When the system's tokens
  equal AR's, S is also the ratio of tokens per second over the set.
- Across sets: G = exp(mean_s log S_s), the geometric mean of the per-set *ratios* (never of times,
  never of times pooled over sets): each set counts once however long its outputs are.
- Intervals: a paired bootstrap over units. A replicate draws n_s units with replacement within
  each set, keeping every a_i with its own b_i, and recomputes S_s from the drawn units; G's
  replicate combines one such S_s per set (a stratified bootstrap: sets are never mixed and every
  replicate has every set). One `Resampling` (seeded indices per set) serves every system of a
  run, so the intervals of different systems are paired too.
- Interval method (default `studentized`, the bootstrap-t on the log scale): t* = (log S* - log S)
  / se*, interval exp(log S - t*_hi se) .. exp(log S - t*_lo se), with se the delta-method standard
  error of log S: se^2 = n/(n-1) sum_i (a_i/A - b_i/B)^2 (A, B the sums), and for G,
  se_G^2 = sum_s se_s^2 / m^2. Why not BCa or percentile: in a simulation with 10 prompts per set,
  output lengths lognormal(sigma = 1) and 30% per-prompt speed noise, the per-set 95% interval
  covered the true ratio in 92% of 400 runs (BCa 84%, percentile 85%) and the 5-set geometric
  mean's in 89% (percentile 91%); with lengths near the token cap, 93% and 94%. Small samples
  weighted by length are where all of them undercover; the studentized one undercovers least on
  the per-set ratio. tests/bench/test_stats.py keeps a coverage check. `bca` (Efron 1987,
  acceleration from the same influence values) and `percentile` remain selectable.
- A set with fewer than two units has no interval (NaN bounds), nor then has G. A replicate that
  drew one unit n times has se* = 0 and t* = +-inf: with 2-3 units the interval can be unbounded,
  which is the honest answer.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from specpilot.errors import ConfigError

DEFAULT_RESAMPLES = 10_000
DEFAULT_LEVEL = 0.95


class IntervalMethod(enum.Enum):
    STUDENTIZED = "studentized"  # bootstrap-t on log S with the delta-method standard error
    BCA = "bca"  # bias-corrected and accelerated percentile
    PERCENTILE = "percentile"


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL
    method: IntervalMethod = IntervalMethod.STUDENTIZED

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        def num(x):  # JSON has no NaN or Infinity: an unknown or unbounded end is null
            return float(x) if math.isfinite(x) else None

        return {"estimate": num(self.estimate), "low": num(self.low), "high": num(self.high),
                "level": self.level, "method": self.method.value}

    def format(self, digits: int = 2, unit: str = "x") -> str:
        est = f"{self.estimate:.{digits}f}{unit}"
        if math.isnan(self.low):
            return f"{est} [n/a]"
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


@dataclass(frozen=True)
class LogBootstrap:
    """A positive statistic on the log scale: estimate, bootstrap replicates, standard errors, and
    each unit's influence (d log S / d weight of the unit), enough for all three interval methods."""

    log_estimate: float
    log_replicates: np.ndarray  # [R]
    se: float  # delta-method standard error of log_estimate
    replicate_se: np.ndarray  # [R] the same standard error computed inside each replicate
    influence: np.ndarray  # [n] per unit

    @property
    def estimate(self) -> float:
        return math.exp(self.log_estimate)

    @property
    def units(self) -> int:
        return int(self.influence.size)

    def interval(self, level: float = DEFAULT_LEVEL,
                 method: IntervalMethod = IntervalMethod.STUDENTIZED) -> Interval:
        est = self.estimate
        if self.units < 2:
            return Interval(est, math.nan, math.nan, level, method)
        alpha = (1.0 - level) / 2.0
        if method is IntervalMethod.STUDENTIZED:
            if self.se == 0:  # every unit has the same ratio: nothing varies
                return Interval(est, est, est, level, method)
            diff = self.log_replicates - self.log_estimate
            with np.errstate(divide="ignore", invalid="ignore"):
                t = np.where(self.replicate_se > 0, diff / self.replicate_se, np.sign(diff) * np.inf)  # [R]
            t_lo, t_hi = np.quantile(t, (alpha, 1.0 - alpha), method="inverted_cdf")
            with np.errstate(over="ignore", invalid="ignore"):
                low, high = np.exp(self.log_estimate - np.array([t_hi, t_lo]) * self.se)
            return Interval(est, float(low), float(high), level, method)
        q = (alpha, 1.0 - alpha) if method is IntervalMethod.PERCENTILE else self._bca_levels(alpha)
        low, high = np.exp(np.quantile(self.log_replicates, q))
        return Interval(est, float(low), float(high), level, method)

    def _bca_levels(self, alpha: float) -> tuple[float, float]:
        normal = NormalDist()
        reps, est = self.log_replicates, self.log_estimate
        R = reps.size
        below = (np.count_nonzero(reps < est) + 0.5 * np.count_nonzero(reps == est)) / R
        below = min(max(below, 0.5 / R), 1.0 - 0.5 / R)  # keeps z0 finite when all replicates are on one side
        z0 = normal.inv_cdf(below)
        d = self.influence
        ss = float(np.sum(d * d))
        a = float(np.sum(d**3)) / (6.0 * ss**1.5) if ss > 0 else 0.0
        levels = []
        for z in (normal.inv_cdf(alpha), normal.inv_cdf(1.0 - alpha)):
            w = z0 + z
            levels.append(normal.cdf(z0 + w / (1.0 - a * w)))
        return levels[0], levels[1]


def ratio_of_sums(numerator, denominator) -> float:
    """sum(numerator) / sum(denominator)."""
    return float(np.sum(numerator)) / float(np.sum(denominator))


def geometric_mean(values) -> float:
    """exp(mean(log v)); every value must be positive."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.any(~(v > 0)):
        raise ValueError(f"geometric mean needs positive values, got {v.tolist()}")
    return float(np.exp(np.mean(np.log(v))))


def _influence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """d log(sum a / sum b) per unit, along the last axis."""
    return a / a.sum(axis=-1, keepdims=True) - b / b.sum(axis=-1, keepdims=True)


def _se(influence: np.ndarray) -> np.ndarray:
    n = influence.shape[-1]
    return np.sqrt(np.sum(influence * influence, axis=-1) * n / max(n - 1, 1))


def ratio_bootstrap(numerator_seconds, denominator_seconds, indices: np.ndarray) -> LogBootstrap:
    """S = sum(numerator) / sum(denominator) over paired units, e.g. AR over system times.

    `indices` [R, n]: the units of each replicate (one set's entry of a `Resampling`).
    """
    a = np.asarray(numerator_seconds, dtype=np.float64)  # [n]
    b = np.asarray(denominator_seconds, dtype=np.float64)  # [n]
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("paired times must be equal-length, non-empty 1-D sequences")
    if np.any(~(a > 0)) or np.any(~(b > 0)):
        raise ValueError("times must be positive")
    if indices.ndim != 2 or indices.shape[1] != a.size:
        raise ValueError(f"indices of shape {indices.shape} do not resample {a.size} units")
    aa, bb = a[indices], b[indices]  # [R, n]
    log_reps = np.log(aa.sum(axis=1)) - np.log(bb.sum(axis=1))  # [R]
    d = _influence(a, b)  # [n]
    return LogBootstrap(math.log(a.sum()) - math.log(b.sum()), log_reps, float(_se(d)),
                        _se(_influence(aa, bb)), d)


def geometric_mean_bootstrap(per_set: list[LogBootstrap]) -> LogBootstrap:
    """G = exp(mean_s log S_s) with every set resampled on its own (stratified)."""
    if not per_set:
        raise ValueError("no sets")
    m = len(per_set)
    influence = np.concatenate([s.influence for s in per_set]) / m
    if any(s.units < 2 for s in per_set):  # a set of one unit has no spread: no interval for G either
        influence = influence[:1]
    return LogBootstrap(
        float(np.mean([s.log_estimate for s in per_set])),
        np.mean([s.log_replicates for s in per_set], axis=0),
        float(math.sqrt(sum(s.se**2 for s in per_set)) / m),
        np.sqrt(np.sum([s.replicate_se**2 for s in per_set], axis=0)) / m,
        influence,
    )
