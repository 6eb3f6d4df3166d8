"""The serving benchmark's results: per-level summaries, the results.json document, the tables.

Definitions (a *unit* is one timed serving run of a unit's requests, `serving.py`), per
concurrency level and engine:
- throughput = sum of output tokens / sum of unit times over the level's units (tokens per second
  while serving, admissions and prefills included);
- speedup = a system's throughput / AR's, paired unit by unit (AR's time per token over the
  system's, `stats.per_token_bootstrap`), i.e. what the batch benchmark reports, per unit of
  requests instead of per batch; *gain* = a later system's throughput / the first system's (the
  baseline, e.g. stock), paired the same way; *scaling* = an engine's throughput / AR's at the
  run's lowest concurrency (e.g. AR at 8 slots over single-request AR), from independent resamples;
- saturated throughput = output tokens / seconds over the stretches of the units in which a request
  waited for a slot, so every slot was taken (`engine.serving.ServingResult`): the rate at
  concurrency C, without a unit's ramp-down as its last requests finish alone; *saturated speedup*
  pairs it with AR's by unit as above; absent when some unit never saturated (at most C requests);
- latency (arrival to return, queueing included), time to first token, and time per output token
  ((return - first token) / (tokens - 1)) at the 50/90/99th percentiles of the level's requests.
Intervals: bootstrap over units (one `Resampling` per level shared by its engines, so speedups are
paired); quantiles by a cluster bootstrap of whole units (`stats.quantile_bootstrap`); BCa or
percentile as the batch benchmark, none with fewer than MIN_UNITS units.

Does not own timing (`serving.py`) or the output directory (`report.py`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specpilot.bench.report import _markdown_table, _text_table, finite, write_text_atomic
from specpilot.bench.runner import AR_NAME
from specpilot.bench.serving import ServingConfig, UnitMeasurement
from specpilot.bench.stats import (
    MIN_UNITS,
    Interval,
    LogBootstrap,
    Resampling,
    per_token_bootstrap,
    quantile_bootstrap,
    ratio_of_independent,
    throughput_bootstrap,
)
from specpilot.config import Deployment, System

SCHEMA = "specpilot.serving/1"
QUANTILES = {"latency": (0.5, 0.9, 0.99), "time_to_first_token": (0.5, 0.99), "time_per_output_token": (0.5, 0.9)}


@dataclass(frozen=True)
class EngineSummary:
    """One engine (AR or a system) at one concurrency level."""

    name: str
    system: System | None  # None for AR
    requests: int
    tokens: int
    seconds: float
    rounds: int
    identical: int  # requests whose tokens equal AR's
    throughput: Interval  # tokens per second
    speedup: Interval | None  # over AR at this level; None for AR
    gain: Interval | None  # throughput over the baseline's (the first system), paired by unit; None for AR and it
    scaling: Interval | None  # throughput over AR's at the run's lowest concurrency; None there for AR
    quantiles: dict  # metric -> {q: Interval} (seconds), see QUANTILES
    baseline: str | None = None  # the system `gain` is over
    saturated: Interval | None = None  # tokens per second while every slot was taken; None: a unit never was
    saturated_speedup: Interval | None = None  # that over AR's, paired by unit; None for AR
    saturated_gain: Interval | None = None  # that over the baseline's, paired by unit; None where `gain` is

    @property
    def mean_accepted_length(self) -> float:
        return self.tokens / self.rounds if self.rounds else float("nan")

    def to_dict(self) -> dict:
        return {
            "name": self.name, "fingerprint": self.system.fingerprint() if self.system else None,
            "knobs": self.system.knobs() if self.system else None, "requests": self.requests,
            "tokens": self.tokens, "seconds": self.seconds, "rounds": self.rounds, "identical": self.identical,
            "mean_accepted_length": self.mean_accepted_length, "tokens_per_second": self.throughput.to_dict(),
            "speedup": self.speedup.to_dict() if self.speedup else None,
            "gain": self.gain.to_dict() if self.gain else None, "baseline": self.baseline,
            "scaling": self.scaling.to_dict() if self.scaling else None,
            "saturated_tokens_per_second": self.saturated.to_dict() if self.saturated else None,
            "saturated_speedup": self.saturated_speedup.to_dict() if self.saturated_speedup else None,
            "saturated_gain": self.saturated_gain.to_dict() if self.saturated_gain else None,
            **{m: {f"p{round(100 * q)}": iv.to_dict() for q, iv in qs.items()} for m, qs in self.quantiles.items()},
        }


@dataclass(frozen=True)
class LevelSummary:
    concurrency: int
    unit_requests: int
    units: int
    dropped: int  # requests of the pool left out (not a whole unit)
    engines: tuple[EngineSummary, ...]  # AR first

    def engine(self, name: str) -> EngineSummary:
        for e in self.engines:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"concurrency": self.concurrency, "unit_requests": self.unit_requests, "units": self.units,
                "dropped_requests": self.dropped, "engines": [e.to_dict() for e in self.engines]}


def _matrix(runs, metric: str) -> np.ndarray:
    """[units, requests per unit] of one per-request metric."""
    return np.array([[getattr(r, metric) for r in run.requests] for run in runs], dtype=np.float64)


def paired_throughput_ratio(reference: list, runs: list, indices) -> LogBootstrap:
    """The runs' throughput over the reference's (`UnitRun`s of the same units, in order), paired by
    unit and bootstrapped on `indices`: the reference's time per token over the runs'."""
    return per_token_bootstrap([r.seconds for r in reference], [r.tokens for r in reference],
                               [r.seconds for r in runs], [r.tokens for r in runs], indices)


def saturated_rates(ar: list, runs: list, indices) -> tuple[LogBootstrap, LogBootstrap | None] | None:
    """(saturated throughput, its ratio over AR's paired by unit, None for AR itself) of the runs; None
    when some unit of either never saturated."""
    if not _all_saturated(ar, runs):
        return None
    seconds, tokens = [r.saturated_seconds for r in runs], [r.saturated_tokens for r in runs]
    ratio = None if runs is ar else saturated_ratio(ar, runs, indices)
    return throughput_bootstrap(seconds, tokens, indices), ratio


def saturated_ratio(reference: list, runs: list, indices) -> LogBootstrap | None:
    """The runs' saturated throughput over the reference's, paired by unit; None when some unit of
    either never saturated."""
    if not _all_saturated(reference, runs):
        return None
    return per_token_bootstrap([r.saturated_seconds for r in reference], [r.saturated_tokens for r in reference],
                               [r.saturated_seconds for r in runs], [r.saturated_tokens for r in runs], indices)


def _all_saturated(*groups: list) -> bool:
    """Every unit run of every group had a saturated stretch (seconds and tokens)."""
    return all(r.saturated_seconds > 0 and r.saturated_tokens > 0 for g in groups for r in g)


def summarise(measurements: tuple[UnitMeasurement, ...], systems: tuple[System, ...], config: ServingConfig,
              pool_size: int) -> tuple[LevelSummary, ...]:
    """Every engine's throughput, speedup (and gain over systems[0]), scaling and latency percentiles
    per level, with intervals."""
    names = [AR_NAME] + [s.name for s in systems]
    baseline = systems[0].name if systems else None
    by_name = {s.name: s for s in systems}
    levels, base = [], None
    for i, c in enumerate(config.concurrency):
        ms = [m for m in measurements if m.concurrency == c]
        resampling = Resampling.draw([len(ms)], config.resamples, config.bootstrap_seed + 7919 * i)
        idx = resampling.indices[0]

        def interval(b: LogBootstrap) -> Interval:
            return b.interval(config.level, config.interval)

        ar = [m.ar for m in ms]
        rates = {}
        engines = []
        for name in names:
            runs = [m.run(name) for m in ms]
            seconds, tokens = [r.seconds for r in runs], [r.tokens for r in runs]
            rates[name] = throughput_bootstrap(seconds, tokens, idx)
            speedup = gain = sat_gain = None
            if name != AR_NAME:
                speedup = interval(paired_throughput_ratio(ar, runs, idx))
            if name not in (AR_NAME, baseline):
                base_runs = [m.run(baseline) for m in ms]
                gain = interval(paired_throughput_ratio(base_runs, runs, idx))
                sat_gain = saturated_ratio(base_runs, runs, idx)
            scaling = None
            if base is not None:
                scaling = interval(ratio_of_independent(rates[name], base))
            elif name != AR_NAME:
                scaling = speedup
            quantiles = {metric: {q: interval(quantile_bootstrap(_matrix(runs, metric), q, idx)) for q in qs}
                         for metric, qs in QUANTILES.items()}
            requests = [q for r in runs for q in r.requests]
            sat = saturated_rates(ar, ar if name == AR_NAME else runs, idx)
            engines.append(EngineSummary(
                name, by_name.get(name), len(requests), sum(tokens), sum(seconds), sum(r.rounds for r in runs),
                sum(q.identical for q in requests), interval(rates[name]), speedup, gain, scaling, quantiles,
                baseline if gain else None, interval(sat[0]) if sat else None,
                interval(sat[1]) if sat and sat[1] is not None else None,
                interval(sat_gain) if sat_gain is not None else None,
            ))
        if base is None:
            base = rates[AR_NAME]
        size = config.unit_size(c)
        levels.append(LevelSummary(c, size, len(ms), pool_size - len(ms) * size, tuple(engines)))
    return tuple(levels)


@dataclass(frozen=True)
class ServingBenchResult:
    """Everything one serving benchmark produced; `to_dict` is its results.json document."""

    deployment: Deployment
    config: ServingConfig
    levels: tuple[LevelSummary, ...]
    measurements: tuple[UnitMeasurement, ...]
    environment: dict
    created: str
    command: tuple[str, ...]
    chat_template: bool
    wall_seconds: float = 0.0

    def to_dict(self) -> dict:
        dep = self.deployment.fingerprint_fields()
        dep["source"] = self.deployment.source
        return {
            "schema": SCHEMA, "created": self.created, "command": list(self.command),
            "environment": self.environment, "deployment": dep,
            "config": {**self.config.to_dict(), "regime": "serving", "chat_template": self.chat_template},
            "wall_seconds": self.wall_seconds,
            "levels": [_unclaimed(lv.to_dict()) if not self.config.sampling.greedy else lv.to_dict()
                       for lv in self.levels],
            "units": [m.to_dict() for m in self.measurements],
        }


def _unclaimed(level: dict) -> dict:
    """A sampled level's summary with no "identical" count (the outputs differ from AR's by design;
    each request's own `identical` stays in "units")."""
    for engine in level.get("engines", []):
        engine["identical"] = None
    return level


def describe(result: ServingBenchResult) -> list[str]:
    env_ = result.environment
    c = result.config
    commit = (env_.get("git_commit") or "unknown")[:12] + (" (dirty)" if env_.get("git_dirty") else "")
    where = env_.get("gpu") or f"CPU ({env_.get('cpu') or 'unknown'}, {env_.get('torch_threads')} threads)"
    arrivals = (f"Poisson arrivals at {c.arrival_rate:g} requests/s" if c.arrival_rate > 0
                else "closed loop (each finished request replaced at once)")
    length = (f"exactly {c.max_new_tokens} new tokens (EOS ignored)" if c.ignore_eos
              else f"up to {c.max_new_tokens} new tokens (stopping at EOS)")
    prompts = "every prompt" if c.n_prompts == 0 else f"{c.n_prompts} prompts"
    return [
        f"deployment `{result.deployment.name}` on {where}, {env_.get('dtype')}; commit {commit}; {result.created}",
        f"continuous batching, {arrivals}; {prompts} per set (seed {c.seed}), the sets in turn; {length}, "
        + ("greedy" if c.sampling.greedy else f"{c.sampling.describe()} (one seed per prompt, the same for AR "
                                             "and every system)"),
        f"throughput = output tokens / serving time over the level's units; speedup = a system's throughput / AR's "
        f"(paired by unit), and over the first system likewise; scaling = throughput / AR's at concurrency "
        f"{c.concurrency[0]}; saturated = while a request waited for a slot (no ramp-down); latency from arrival; "
        f"[{round(100 * c.level)}% {c.interval.value} bootstrap intervals over units; n/a under {MIN_UNITS} units]",
    ]


def _fmt(iv: Interval | None, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    if iv is None:
        return ""
    est = f"{iv.estimate * scale:.{digits}f}{unit}"
    if iv.no_interval or not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return f"{est} [n/a]"
    return f"{est} [{iv.low * scale:.{digits}f}, {iv.high * scale:.{digits}f}]"


def level_rows(level: LevelSummary, sampled: bool = False) -> tuple[list[str], list[list[str]]]:
    baseline = next((e.baseline for e in level.engines if e.baseline), None)  # a column only with two systems
    saturated = any(e.saturated for e in level.engines)
    header = ["engine", "tok/s", "speedup", *([f"over {baseline}"] if baseline else []), "scaling",
              *(["saturated tok/s", "saturated speedup"] if saturated else []), "latency p50 s",
              "p90 s", "p99 s", "TTFT p50 s", "TPOT p50 ms", "accepted length", "identical"]
    rows = []
    for e in level.engines:
        q = e.quantiles
        rows.append([e.name, _fmt(e.throughput, 0), _fmt(e.speedup), *([_fmt(e.gain)] if baseline else []),
                     _fmt(e.scaling), *([_fmt(e.saturated, 0), _fmt(e.saturated_speedup)] if saturated else []),
                     _fmt(q["latency"][0.5]), _fmt(q["latency"][0.9]), _fmt(q["latency"][0.99]),
                     _fmt(q["time_to_first_token"][0.5], 3), _fmt(q["time_per_output_token"][0.5], 1, 1e3),
                     f"{e.mean_accepted_length:.2f}", "n/a (sampled)" if sampled else f"{e.identical}/{e.requests}"])
    return header, rows


def _title(level: LevelSummary) -> str:
    dropped = f", {level.dropped} left out" if level.dropped else ""
    return f"concurrency {level.concurrency}: {level.units} units of {level.unit_requests} requests{dropped}"


def render_markdown(result: ServingBenchResult) -> str:
    parts = [f"# Serving benchmark: {result.deployment.name}", ""] + [f"{line}  " for line in describe(result)]
    for level in result.levels:
        parts += ["", f"## {_title(level)}", "", _markdown_table(*level_rows(level, not result.config.sampling.greedy))]
    parts += ["", "Written by `specpilot bench --regime serving`; every number comes from results.json here.", ""]
    return "\n".join(parts)


def render_terminal(result: ServingBenchResult) -> str:
    lines = describe(result)
    for level in result.levels:
        lines += ["", _title(level), _text_table(*level_rows(level, not result.config.sampling.greedy))]
    return "\n".join(lines)


def write_outputs(result: ServingBenchResult, out_dir: Path) -> list[Path]:
    """results.json and results.md in `out_dir`."""
    doc = out_dir / "results.json"
    write_text_atomic(doc, json.dumps(finite(result.to_dict()), indent=1, allow_nan=False) + "\n")
    md = out_dir / "results.md"
    write_text_atomic(md, render_markdown(result))
    return [doc, md]
