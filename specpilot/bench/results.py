"""The benchmark's results: per-set and across-set summaries of the raw measurements.

Owns: `SetSummary`, `SystemSummary` and `BenchResult` (dataclasses with methods, serialised by
`to_dict`, never parsed back from text), and `summarise`, which applies the definitions of
`stats.py` to the measurements of `runner.py`: per-set speedup = AR time per generated token /
system time per generated token (each from the set's totals over its timed units), reported with
both arms' total tokens; across sets their geometric mean; both with paired bootstrap intervals
from one shared `Resampling`. With two or more systems, each later system also gets its *gain*
over the first (the baseline, e.g. stock): per set the baseline's time per token / its own, which
is its speedup divided by the baseline's since both share the AR measurements, and the geometric
mean of those, with intervals from the same resamples.

Schema history: `specpilot.bench/1` defined the speedup as total AR time / total system time (equal
to the per-token ratio only where the tokens are AR's) with studentized intervals; `/2` is per
token, with BCa intervals, `no_interval` on every interval and the tokens beside each speedup.
Both carry the same keys where they overlap, so readers of `/1` files (`loop/final.py`,
`loop/report.py`) read `/2` unchanged.

Does not own timing, rendering or files (`report.py`, `plots.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.bench.runner import BatchMeasurement, BenchConfig, EngineRun
from specpilot.bench.stats import (
    MIN_UNITS,
    Interval,
    LogBootstrap,
    Resampling,
    geometric_mean_bootstrap,
    per_token_bootstrap,
)
from specpilot.config import Deployment, System

SCHEMA = "specpilot.bench/2"

SPEEDUP_DEFINITION = (
    "per set: (sum of AR seconds / sum of AR tokens) / (sum of system seconds / sum of system tokens) over "
    "the set's timed units (a unit = one batch of --batch prompts, prefill + decode), i.e. the ratio of "
    "tokens per second; across sets: geometric mean of the per-set ratios; intervals: paired bootstrap "
    f"over units, stratified by set; none for a set of fewer than {MIN_UNITS} units (nor then for the "
    "geometric mean)"
)


def add_histograms(histograms) -> tuple[int, ...]:
    out: list[int] = []
    for h in histograms:
        if len(h) > len(out):
            out += [0] * (len(h) - len(out))
        for j, c in enumerate(h):
            out[j] += c
    return tuple(out)


@dataclass(frozen=True)
class SetSummary:
    """One system on one set."""

    set_name: str
    prompts: int
    batches: int  # timed units
    ar_seconds: float
    seconds: float
    ar_tokens: int
    tokens: int
    rounds: int
    identical: int  # prompts whose tokens equal AR's
    accept_histogram: tuple[int, ...]  # [j] = rounds that committed j + 1 tokens
    speedup: Interval  # AR time per token / system time per token
    gain: Interval | None = None  # over the baseline system; None for the baseline itself

    @property
    def mean_accepted_length(self) -> float:
        return self.tokens / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def ar_tokens_per_second(self) -> float:
        return self.ar_tokens / self.ar_seconds

    def to_dict(self) -> dict:
        return {
            "set": self.set_name, "prompts": self.prompts, "batches": self.batches,
            "speedup": self.speedup.to_dict(), "ar_tokens": self.ar_tokens, "tokens": self.tokens,
            "gain": self.gain.to_dict() if self.gain else None,
            "ar_seconds": self.ar_seconds, "seconds": self.seconds, "rounds": self.rounds,
            "ar_tokens_per_second": self.ar_tokens_per_second, "tokens_per_second": self.tokens_per_second,
            "mean_accepted_length": self.mean_accepted_length,
            "identical": self.identical, "accept_histogram": list(self.accept_histogram),
        }


@dataclass(frozen=True)
class SystemSummary:
    """One system across the run's sets."""

    system: System
    sets: tuple[SetSummary, ...]
    geomean: Interval  # geometric mean over sets of the per-set speedups
    gain: Interval | None = None  # geometric mean over sets of the gain over the baseline
    baseline: str | None = None

    @property
    def name(self) -> str:
        return self.system.name

    @property
    def prompts(self) -> int:
        return sum(s.prompts for s in self.sets)

    @property
    def identical(self) -> int:
        return sum(s.identical for s in self.sets)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sets)

    @property
    def ar_tokens(self) -> int:
        return sum(s.ar_tokens for s in self.sets)

    @property
    def mean_accepted_length(self) -> float:
        rounds = sum(s.rounds for s in self.sets)
        return sum(s.tokens for s in self.sets) / rounds if rounds else float("nan")

    @property
    def accept_histogram(self) -> tuple[int, ...]:
        return add_histograms(s.accept_histogram for s in self.sets)

    def set(self, name: str) -> SetSummary:
        for s in self.sets:
            if s.set_name == name:
                return s
        raise KeyError(name)

    def to_dict(self, stock: System | None = None) -> dict:
        return {
            "name": self.name, "fingerprint": self.system.fingerprint(), "knobs": self.system.knobs(),
            "diff_vs_stock": self.system.diff(stock) if stock is not None else None,
            "geomean_speedup": self.geomean.to_dict(), "ar_tokens": self.ar_tokens, "tokens": self.tokens,
            "baseline": self.baseline, "geomean_gain": self.gain.to_dict() if self.gain else None,
            "prompts": self.prompts, "identical": self.identical,
            "mean_accepted_length": self.mean_accepted_length,
            "accept_histogram": list(self.accept_histogram),
            "sets": [s.to_dict() for s in self.sets],
        }


def _set_summary(runs: list[EngineRun], ar_runs: list[EngineRun], set_name: str, speedup: Interval,
                 gain: Interval | None) -> SetSummary:
    outputs = [o for r in runs for o in r.outputs]
    return SetSummary(
        set_name, len(outputs), len(runs),
        sum(r.seconds for r in ar_runs), sum(r.seconds for r in runs),
        sum(r.tokens for r in ar_runs), sum(r.tokens for r in runs), sum(r.rounds for r in runs),
        sum(o.identical for o in outputs), add_histograms(o.accept_histogram for o in outputs),
        speedup, gain,
    )


def _per_token(reference: list[EngineRun], runs: list[EngineRun], indices) -> LogBootstrap:
    """The reference's time per token over the runs', per unit paired, bootstrapped on `indices`."""
    return per_token_bootstrap([r.seconds for r in reference], [r.tokens for r in reference],
                               [r.seconds for r in runs], [r.tokens for r in runs], indices)


def summarise(measurements: tuple[BatchMeasurement, ...], systems: tuple[System, ...],
              config: BenchConfig) -> tuple[SystemSummary, ...]:
    """Per-set and geometric-mean speedups (and gains over systems[0]) with their intervals, all
    ratios of time per generated token."""
    sets = [s for s in config.sets if any(m.set_name == s for m in measurements)]
    by_set = {s: [m for m in measurements if m.set_name == s] for s in sets}
    resampling = Resampling.draw([len(by_set[s]) for s in sets], config.resamples, config.bootstrap_seed)

    def interval(b: LogBootstrap) -> Interval:
        return b.interval(config.level, config.interval)

    baseline = systems[0].name
    out = []
    for system in systems:
        set_summaries, speedups, gains = [], [], []
        for k, s in enumerate(sets):
            ms = by_set[s]
            runs = [m.system(system.name) for m in ms]
            ar_runs = [m.ar for m in ms]
            speedup = _per_token(ar_runs, runs, resampling.indices[k])
            speedups.append(speedup)
            gain = None
            if system.name != baseline:
                g = _per_token([m.system(baseline) for m in ms], runs, resampling.indices[k])
                gains.append(g)
                gain = interval(g)
            set_summaries.append(_set_summary(runs, ar_runs, s, interval(speedup), gain))
        out.append(SystemSummary(
            system, tuple(set_summaries), interval(geometric_mean_bootstrap(speedups)),
            interval(geometric_mean_bootstrap(gains)) if gains else None,
            baseline if gains else None,
        ))
    return tuple(out)


def _unclaimed(system: dict) -> dict:
    """A sampled run's system summary with no "identical" counts: sampled outputs differ from AR's
    by design, so none is claimed (each output's own `identical` stays in "batches")."""
    system["identical"] = None
    for s in system["sets"]:
        s["identical"] = None
    return system


@dataclass(frozen=True)
class BenchResult:
    """Everything one `specpilot bench` run produced; `to_dict` is the results.json document."""

    deployment: Deployment
    config: BenchConfig
    systems: tuple[SystemSummary, ...]
    measurements: tuple[BatchMeasurement, ...]
    environment: dict  # see provenance.capture
    created: str  # ISO 8601, UTC
    command: tuple[str, ...]
    chat_template: bool  # prompts were rendered with the tokenizer's chat template
    dropped_prompts: int = 0  # remainders of sets whose size is not a multiple of the batch
    wall_seconds: float = 0.0  # the whole run, loading and warm-up included

    def system(self, name: str) -> SystemSummary:
        for s in self.systems:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict:
        dep = self.deployment.fingerprint_fields()
        dep["source"] = self.deployment.source
        return {
            "schema": SCHEMA,
            "created": self.created,
            "command": list(self.command),
            "environment": self.environment,
            "deployment": dep,
            "config": {**self.config.to_dict(), "chat_template": self.chat_template,
                       "dropped_prompts": self.dropped_prompts, "speedup_definition": SPEEDUP_DEFINITION},
            "wall_seconds": self.wall_seconds,
            "systems": [_unclaimed(s.to_dict(self.deployment.stock)) if not self.config.sampling.greedy
                        else s.to_dict(self.deployment.stock) for s in self.systems],
            "batches": [m.to_dict() for m in self.measurements],
        }
