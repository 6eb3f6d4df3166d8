"""The serving benchmark: AR and the systems under continuous batching, interleaved unit by unit.

Owns: its configuration (`ServingConfig`), the request pool, timed units, arrivals, warm-up, the
order in which AR and the systems run each unit, and the raw measurements (`UnitMeasurement`).

Protocol. One process, one loaded `Session` (as `runner.py`). The request pool is the deployment's
benchmark prompts, taken from the sets in turn (so every stretch of it mixes the sets). For each
concurrency level C, the pool is cut into *units* of `requests_per_slot` x C consecutive requests
(the first `units` of them, or all whole ones); a unit is served by a `ServingEngine` with C slots, closed loop
(C clients, each sending its next request when its last one returns, so a request is timed from
its admission) or, with `arrival_rate` R > 0, with Poisson arrivals at R requests per second (exponential
gaps, seeded by (seed, C, unit), the same for every engine). A unit's time runs from its first
admission to its last request's return, the device synchronised at both ends; graph capture and
padded prefill shapes run before it (warm-up: each engine serves C requests of `warmup_tokens`
tokens untimed). AR and each system serve each unit back to back, the order rotating by one place
per unit, as in the batch benchmark. The unit is the bootstrap's unit (`serving_results.py`).
Under a sampled `ServingConfig.sampling` every request samples with its prompt's seed
(`runner.prompt_seed`), the same for AR and every system, as in the batch benchmark.

Does not own the serving engine (`specpilot.engine.serving`) or statistics (`serving_results.py`).
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from specpilot.bench.prompts import BenchPrompt
from specpilot.bench.runner import AR_NAME, PromptInfo, check_shared_settings, prompt_seed
from specpilot.bench.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, IntervalMethod
from specpilot.config import Deployment, Sampling, System, load_system
from specpilot.errors import ConfigError
from specpilot.guard.divergence import first_divergence

@dataclass(frozen=True)
class ServingConfig:
    """The settings of one serving benchmark; `specpilot bench --regime serving` flags map onto these."""

    sets: tuple[str, ...]
    n_prompts: int  # per set; 0 = every prompt
    max_new_tokens: int
    concurrency: tuple[int, ...]  # slots (C) of each level, run one after the other
    arrival_rate: float = 0.0  # requests per second, Poisson; 0 = closed loop
    requests_per_slot: int = 4  # a timed unit serves this many requests per slot (x C in all)
    units: int = 0  # timed units per level, at most; 0 = every whole unit of the pool
    seed: int = 0  # chooses the prompt subsets and the arrival times
    warmup_tokens: int = 32
    resamples: int = DEFAULT_RESAMPLES
    level: float = DEFAULT_LEVEL
    interval: IntervalMethod = IntervalMethod.BCA
    bootstrap_seed: int = 0
    ignore_eos: bool = False
    sampling: Sampling = Sampling()  # greedy unless set (default: the deployment regime's)

    def __post_init__(self):
        check_shared_settings(self)
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {list(self.concurrency)}")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ConfigError(f"--concurrency repeats a level: {list(self.concurrency)}")
        if not self.arrival_rate >= 0:
            raise ConfigError(f"--arrival-rate must be >= 0 (0 = closed loop), got {self.arrival_rate}")
        if self.requests_per_slot < 1:
            raise ConfigError(f"--requests-per-slot must be >= 1, got {self.requests_per_slot}")
        if self.units < 0:
            raise ConfigError(f"--units must be >= 0 (0 = as many as the prompts give), got {self.units}")

    @classmethod
    def for_deployment(cls, deployment: Deployment, **overrides) -> "ServingConfig":
        """Defaults from the deployment (sets, n_prompts, max_new_tokens, concurrency = regime.batch)."""
        base = dict(sets=deployment.sets, n_prompts=deployment.n_prompts,
                    max_new_tokens=deployment.max_new_tokens, concurrency=(deployment.regime.batch,),
                    sampling=deployment.regime.sampling)
        base.update({k: v for k, v in overrides.items() if v is not None})
        base["sets"], base["concurrency"] = tuple(base["sets"]), tuple(base["concurrency"])
        return cls(**base)

    def unit_size(self, concurrency: int) -> int:
        return self.requests_per_slot * concurrency

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sets"], d["concurrency"] = list(self.sets), list(self.concurrency)
        d["interval"] = self.interval.value
        d["sampling"] = self.sampling.to_dict()
        return d

    def request_sampling(self, prompt: BenchPrompt):
        """The prompt's `SamplingParams` (its `prompt_seed`), None under greedy."""
        from specpilot.engine.runner import sampling_params

        return sampling_params(self.sampling, prompt_seed(self.seed, prompt.set_name, prompt.index))


@dataclass(frozen=True)
class ServedRequest:
    """One request of a unit as one engine served it, compared with AR's tokens."""

    tokens: int
    rounds: int
    latency: float  # seconds, arrival to return
    time_to_first_token: float
    time_per_output_token: float  # NaN for a one-token output
    identical: bool
    first_divergence: int | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class UnitRun:
    """One engine serving one unit."""

    name: str
    seconds: float  # first admission to the last return
    requests: tuple[ServedRequest, ...]
    saturated_seconds: float = 0.0  # of them, while a request waited for a slot (`ServingResult`)
    saturated_tokens: int = 0  # output tokens committed then

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def rounds(self) -> int:
        return sum(r.rounds for r in self.requests)

    def to_dict(self) -> dict:
        return {"name": self.name, "seconds": self.seconds, "saturated_seconds": self.saturated_seconds,
                "saturated_tokens": self.saturated_tokens, "requests": [r.to_dict() for r in self.requests]}


@dataclass(frozen=True)
class UnitMeasurement:
    concurrency: int
    unit_index: int
    prompts: tuple[PromptInfo, ...]
    arrivals: tuple[float | None, ...]  # seconds after the unit's start; None in a closed loop
    order: tuple[str, ...]  # engine names in the order they ran
    ar: UnitRun
    systems: tuple[UnitRun, ...]

    def run(self, name: str) -> UnitRun:
        if name == AR_NAME:
            return self.ar
        for r in self.systems:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"concurrency": self.concurrency, "unit": self.unit_index,
                "prompts": [asdict(p) for p in self.prompts], "arrivals": list(self.arrivals),
                "order": list(self.order), "ar": self.ar.to_dict(), "systems": [s.to_dict() for s in self.systems]}


def request_pool(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """The prompts of every set taken in turn (set 1's first, set 2's first, ...)."""
    by_set: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_set.setdefault(p.set_name, []).append(p)
    columns = list(by_set.values())
    return [col[i] for i in range(max(map(len, columns), default=0)) for col in columns if i < len(col)]


def units_of(pool: list[BenchPrompt], size: int, concurrency: int, limit: int = 0) -> list[list[BenchPrompt]]:
    """Consecutive units of `size` requests, at most `limit` of them (0: every whole one)."""
    if len(pool) < size:
        raise ConfigError(f"concurrency {concurrency}: a timed unit takes {size} requests but the sets give "
                          f"{len(pool)}; raise --n-prompts or lower --requests-per-slot")
    units = [pool[i : i + size] for i in range(0, len(pool) - len(pool) % size, size)]
    return units[:limit] if limit else units


def arrival_times(rate: float, n: int, seed: int, concurrency: int, unit: int) -> tuple[float | None, ...]:
    """Poisson arrivals at `rate` per second (the first at 0); None for a closed loop (rate 0)."""
    if rate <= 0:
        return (None,) * n
    gaps = np.random.default_rng([seed, concurrency, unit]).exponential(1.0 / rate, n)
    return tuple(float(t) for t in np.concatenate([[0.0], np.cumsum(gaps[1:])]))


def _served(name: str, result, reference: list[list[int]] | None) -> UnitRun:
    out = []
    for k, r in enumerate(result.requests):
        div = first_divergence(r.output, reference[k]) if reference is not None else None
        out.append(ServedRequest(len(r.output), r.rounds, r.latency, r.time_to_first_token,
                                 r.time_per_output_token, div is None, div))
    return UnitRun(name, result.seconds, tuple(out), result.saturated_seconds, result.saturated_tokens)


def _timed(engine, requests, stop_at_eos: bool):
    gc.collect()
    gc.disable()
    try:
        return engine.run(requests, stop_at_eos=stop_at_eos)
    finally:
        gc.enable()


def run_serving(session, systems: tuple[System, ...], prompts: list[BenchPrompt], config: ServingConfig,
                progress: Callable[[str], None] | None = None) -> tuple[UnitMeasurement, ...]:
    """Serve every unit at every concurrency level with AR and every system, interleaved."""
    from specpilot.engine.serving import Request, ServingEngine

    if not systems:
        raise ConfigError("no system to benchmark")
    pool = request_pool(prompts)
    plans = [(c, units_of(pool, config.unit_size(c), c, config.units)) for c in config.concurrency]  # fail early
    gens = [(AR_NAME, session.generator(load_system(AR_NAME, session.deployment)))]
    gens += [(s.name, session.generator(s)) for s in systems]
    longest = max(len(p.ids) for p in pool)
    stop = not config.ignore_eos
    out = []
    for c, units in plans:
        engines = []
        for name, gen in gens:
            engine = ServingEngine(gen, c)
            engine.reserve(longest, config.max_new_tokens)  # one workspace for the warm-up and every unit
            warm = [Request(p.ids, min(config.warmup_tokens, config.max_new_tokens), None, config.request_sampling(p))
                    for p in pool[:c]]
            engine.run(warm, stop_at_eos=stop)
            if progress:
                progress(f"c={c} warm-up {name}")
            engines.append((name, engine))
        for k, items in enumerate(units):
            arrivals = arrival_times(config.arrival_rate, len(items), config.seed, c, k)
            requests = [Request(p.ids, config.max_new_tokens, t, config.request_sampling(p))
                        for p, t in zip(items, arrivals)]
            shift = k % len(engines)
            order = engines[shift:] + engines[:shift]
            results = {}
            for name, engine in order:
                results[name] = _timed(engine, requests, stop)
                if progress:
                    progress(f"c={c}: {name}")
            reference = [r.output for r in results[AR_NAME].requests]
            info = tuple(PromptInfo(p.index, p.source_id, len(p.ids)) for p in items)
            out.append(UnitMeasurement(
                c, k, info, arrivals, tuple(n for n, _ in order), _served(AR_NAME, results[AR_NAME], reference),
                tuple(_served(s.name, results[s.name], reference) for s in systems),
            ))
    return tuple(out)


def count_runs(prompts: list[BenchPrompt], config: ServingConfig, systems: int) -> int:
    """`ServingEngine.run` calls `run_serving` makes (warm-ups included): the progress bar's total."""
    pool = len(prompts)
    units = [pool // config.unit_size(c) for c in config.concurrency]
    return sum((min(u, config.units or u) + 1) * (systems + 1) for u in units)
