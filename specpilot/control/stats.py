"""The paired-timing statistics: gain, its interval, one-sided bounds, p-values, the noise floor.

Definitions (the controller, the rule and the memory all use exactly these):

* Per-block statistic. Block b yields x_b = log(T_A,b / T_B,b), A the incumbent, B the candidate,
  T the request-to-response time the controller measured around the worker round trips, summed
  over the block's requests (side-by-side blocks average the two device placements, see
  `blocks.py`). x_b > 0 means the candidate was faster.
* Gain. g = exp(mean_b x_b) - 1: the geometric-mean speed ratio minus one (0.05 = 5% faster).
* Interval. The hull of two intervals for mean(x), mapped through exp(.) - 1:
    - the BCa bootstrap interval (Efron 1987) from `scipy.stats.bootstrap` (`resamples`
      resamples, seeded) — transformation-respecting, corrects for median bias and skew;
    - the Student-t interval, mean +- t_{n-1} * sd / sqrt(n).
  Why both: with 20-40 blocks and rare large outliers (a request hit by another process, a GC
  pause) the jackknife acceleration of BCa is dominated by the one outlying block and BCa's lower
  bound is far too high: in `tests/control/test_rule_simulation.py` its one-sided 2.5% bound is
  exceeded by A/A data ~12% of the time. The t-interval is conservative under such symmetric heavy
  tails but only first-order accurate under skew. The hull covers at least as often as the better
  of the two in every regime simulated (<= 2.5% there), at a small cost in width on clean data.
* One-sided bound. `lower_bound(alpha)` = min(BCa bound, t bound) at one-sided error alpha; the
  BCa bound is scipy's alternative='greater' on the same bootstrap distribution (no new
  resampling: `bench.stats.bca_interval`, the package's one BCa), so every level is read off one
  distribution.
* p-value of H0: g <= theta. max(p_BCa, p_t): p_BCa is the smallest alpha whose BCa bound exceeds
  theta (the BCa percentile map inverted in closed form), p_t the one-sided t-test p-value. By
  construction p < alpha exactly when lower_bound(alpha) > theta (tested), so the multiplicity
  correction (which needs p-values) and the rule (which reads bounds) agree.
* Noise floor. See `NoiseFloor`.

Owns: these numbers and their plain-dict form. Does not own thresholds or decisions (`rule.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from specpilot.bench.stats import bca_interval


@dataclass(frozen=True)
class _Bootstrap:
    result: object  # scipy BootstrapResult (its bootstrap_distribution is reused for other levels)
    sorted_means: np.ndarray  # bootstrap distribution of mean(x), sorted
    z0: float  # BCa bias correction
    a: float  # BCa acceleration


@dataclass(frozen=True)
class GainEstimate:
    """Gain of the candidate over the incumbent from per-block log ratios (see module docstring)."""

    log_ratios: tuple[float, ...]  # x_b per timed block, in block order
    level: float = 0.95
    resamples: int = 9999
    seed: int = 0

    def __post_init__(self):
        if len(self.log_ratios) < 2:
            raise ValueError("a gain estimate needs at least two blocks")
        if not all(math.isfinite(x) for x in self.log_ratios):
            raise ValueError("log ratios must be finite")
        object.__setattr__(self, "log_ratios", tuple(float(x) for x in self.log_ratios))

    # ---- point and spread ----------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.log_ratios)

    @property
    def mean_log_ratio(self) -> float:
        return float(np.mean(self.log_ratios))

    @property
    def gain(self) -> float:
        return math.expm1(self.mean_log_ratio)

    @property
    def block_std(self) -> float:
        """Sample standard deviation of the per-block log ratios."""
        return float(np.std(self.log_ratios, ddof=1))

    @property
    def standard_error(self) -> float:
        """block_std / sqrt(n): the normal-theory standard error of the mean log ratio."""
        return self.block_std / math.sqrt(self.n)

    @property
    def degenerate(self) -> bool:
        """All blocks equal: no spread to bootstrap (the interval collapses to the point)."""
        return max(self.log_ratios) == min(self.log_ratios)

    # ---- the bootstrap ---------------------------------------------------------------------
    @cached_property
    def _boot(self) -> _Bootstrap | None:
        if self.degenerate:
            return None
        from scipy import stats

        x = np.asarray(self.log_ratios)
        res = stats.bootstrap((x,), np.mean, n_resamples=self.resamples, confidence_level=self.level,
                              method="BCa", vectorized=True, rng=np.random.default_rng(self.seed))
        dist = np.sort(np.asarray(res.bootstrap_distribution))
        # z0 and a exactly as scipy computes them (percentile-of-score 'mean' convention;
        # jackknife acceleration, which for the mean is sum(d^3) / (6 sum(d^2)^1.5), d = x - mean)
        theta = float(np.mean(x))
        below = (np.count_nonzero(dist < theta) + np.count_nonzero(dist <= theta)) / (2 * dist.size)
        z0 = float(stats.norm.ppf(below))
        d = x - theta
        a = float(np.sum(d**3) / (6 * np.sum(d**2) ** 1.5))
        return _Bootstrap(res, dist, z0, a)

    @cached_property
    def bca_interval(self) -> tuple[float, float]:
        """The two-sided `level` BCa bootstrap interval of the gain."""
        if self._boot is None:
            return (self.gain, self.gain)
        ci = self._boot.result.confidence_interval
        return (math.expm1(float(ci.low)), math.expm1(float(ci.high)))

    @property
    def t_interval(self) -> tuple[float, float]:
        """The two-sided `level` Student-t interval of the gain."""
        return (self._t_bound((1 - self.level) / 2, -1), self._t_bound((1 - self.level) / 2, +1))

    @property
    def interval(self) -> tuple[float, float]:
        """The reported two-sided `level` interval: the hull of the BCa and t intervals."""
        (b_lo, b_hi), (t_lo, t_hi) = self.bca_interval, self.t_interval
        return (min(b_lo, t_lo), max(b_hi, t_hi))

    @property
    def lower(self) -> float:
        return self.interval[0]

    @property
    def upper(self) -> float:
        return self.interval[1]

    @property
    def half_width(self) -> float:
        return (self.upper - self.lower) / 2

    def lower_bound(self, alpha: float) -> float:
        """One-sided lower confidence bound of the gain at confidence 1 - alpha (min of BCa and t)."""
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1) (got {alpha})")
        return min(self._bca_lower(alpha), self._t_bound(alpha, -1))

    def p_value(self, threshold: float) -> float:
        """One-sided p-value of H0: gain <= threshold (small = the candidate clears it)."""
        return max(self._bca_p(threshold), self._t_p(threshold))

    # ---- the two methods -------------------------------------------------------------------
    def _t_bound(self, alpha: float, side: int) -> float:
        from scipy import stats

        if self.degenerate:
            return self.gain
        q = float(stats.t.ppf(1 - alpha, self.n - 1))
        return math.expm1(self.mean_log_ratio + side * q * self.standard_error)

    def _t_p(self, threshold: float) -> float:
        from scipy import stats

        theta = math.log1p(threshold)
        if self.degenerate:
            return 0.0 if self.mean_log_ratio > theta else 1.0
        return float(stats.t.sf((self.mean_log_ratio - theta) / self.standard_error, self.n - 1))

    def _bca_lower(self, alpha: float) -> float:
        if self._boot is None:
            return self.gain
        low, _ = bca_interval((np.asarray(self.log_ratios),), np.mean, self._boot.result.bootstrap_distribution,
                              1 - alpha, alternative="greater")
        return math.expm1(low)

    def _bca_p(self, threshold: float) -> float:
        theta = math.log1p(threshold)
        boot = self._boot
        if boot is None:
            return 0.0 if self.mean_log_ratio > theta else 1.0
        dist = boot.sorted_means
        if theta < dist[0]:
            return 0.0
        if theta >= dist[-1]:
            return 1.0
        # q: the level at which scipy's linear-interpolated quantile of the distribution is theta
        q = float(np.interp(theta, dist, np.linspace(0.0, 1.0, dist.size)))
        from scipy.special import ndtr, ndtri

        # BCa: the quantile level for one-sided alpha is Phi(z0 + (z0 + z) / (1 - a (z0 + z))),
        # z = ndtri(alpha); solved here for z given the level q.
        w = float(ndtri(q)) - boot.z0
        if 1 + boot.a * w <= 0:  # outside the range the BCa map can reach
            return 0.0 if w < 0 else 1.0
        return float(ndtr(w / (1 + boot.a * w) - boot.z0))

    # ---- plain data ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Inputs plus the derived numbers (for people and the memory; from_dict recomputes)."""
        return {
            "log_ratios": list(self.log_ratios),
            "level": self.level,
            "resamples": self.resamples,
            "seed": self.seed,
            "n": self.n,
            "gain": self.gain,
            "lower": self.lower,
            "upper": self.upper,
            "bca_interval": list(self.bca_interval),
            "t_interval": list(self.t_interval),
            "block_std": self.block_std,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "GainEstimate":
        return cls(tuple(d["log_ratios"]), d["level"], d["resamples"], d["seed"])


@dataclass(frozen=True)
class NoiseFloor:
    """Stock-vs-stock noise of one deployment under one timing procedure.

    Measured by timing stock against a second copy of stock (two fresh workers) with the exact
    procedure candidates get. Defined as

        noise = max(|L|, |U|),  [L, U] the 95% interval of the A/A gain (`GainEstimate.interval`),

    i.e. the largest stock-vs-stock difference the A/A measurement cannot exclude — a 95% upper
    confidence bound on |systematic arm difference|. Why this and not the half-width (or
    std/sqrt(n)): the candidate's own sampling noise is already inside its lower bound; the
    margin of the promotion rule (lower > 1% + 2 * noise) exists for what that interval cannot
    see — differences between two *identical* arms that pairing and alternation leave behind
    (device slot, process placement, order effects) — and the half-width alone is blind to a
    systematic A/A offset. This definition covers both: it is ~ |A/A gain| + half-width, never
    smaller than the half-width, and shrinks to the true arm difference as blocks grow.
    """

    estimate: GainEstimate  # the A/A measurement
    procedure: str = ""  # ControllerConfig.procedure_key it was measured under

    @property
    def value(self) -> float:
        return max(abs(self.estimate.lower), abs(self.estimate.upper))

    def to_dict(self) -> dict:
        return {"value": self.value, "procedure": self.procedure, "estimate": self.estimate.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "NoiseFloor":
        return cls(GainEstimate.from_dict(d["estimate"]), d.get("procedure", ""))
