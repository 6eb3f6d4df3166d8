"""Interleaved timing of AR and the systems under test, prompt batch by prompt batch.

Owns: the benchmark's configuration (`BenchConfig`), grouping prompts into batches, warm-up, the
order in which AR and the systems run on each batch, and the raw measurements (`BatchMeasurement`):
wall times, token counts, accepted lengths, and whether each system's tokens equal AR's.

Does not own prompts (`prompts.py`), statistics (`stats.py`, `results.py`) or output files.

Protocol. Everything runs in one process on one loaded `Session`, so AR and every system share the
weights, the device and its clocks. AR is the deployment's stock with drafting off
(`load_system("ar")`): the same engine, kernels and CUDA graphs as stock, never a system's own
kernels, so a faster kernel in a system shows up in its speedup. First a warm-up: every generator decodes the first batch for
`warmup_tokens` tokens, untimed (allocator, kernel selection, CUDA graph capture). Then, for each
batch of B prompts of one set, AR and each system decode it once, back to back, and the order
rotates by one place per batch (AR first, then S1 first, ...) so no engine always runs first or
last. A time is `GenerationResult.seconds` of one `generate` call: prefill plus decoding of the
whole batch, until its last row finishes, with the device synchronised at both ends; graph capture
happens before the clock starts. The garbage collector is off during the call (as in `timeit`).
With --batch B the unit of timing, and of the bootstrap, is the batch, never a share of it.
Every engine stops a row at EOS unless `ignore_eos` (--ignore-eos): then every row decodes exactly
`max_new_tokens` tokens, a fixed-length run whose AR and system outputs have equal lengths.

Sampling. Under a sampled `BenchConfig.sampling` (the deployment regime's, or --temperature /
--top-k / --top-p / --min-p) every prompt samples with its own seed, `prompt_seed(seed, set,
index)`: the same for AR and every system (and the warm-up), so each engine decodes a prompt
with the same seed and the pairs stay comparable, run after run. Outputs then differ from AR's
by design (an exact system samples from the same distribution, not the same tokens): `identical`
is still recorded per output, but no report claims "identical to AR" under sampling.
"""

from __future__ import annotations

import gc
import hashlib
from dataclasses import asdict, dataclass
from typing import Callable

from specpilot.bench.datasets import check_set_names
from specpilot.bench.prompts import BenchPrompt
from specpilot.bench.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, IntervalMethod
from specpilot.config import Deployment, Sampling, System, load_system
from specpilot.errors import ConfigError
from specpilot.guard.divergence import first_divergence

AR_NAME = "ar"


def check_shared_settings(config) -> None:
    """The settings every benchmark config has (`BenchConfig`, `serving.ServingConfig`), each
    refused with one line naming its flag."""
    check_set_names(config.sets)
    if config.n_prompts < 0:
        raise ConfigError(f"--n-prompts must be >= 0 (0 = every prompt), got {config.n_prompts}")
    if config.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {config.max_new_tokens}")
    if config.warmup_tokens < 1:
        raise ConfigError(f"--warmup-tokens must be >= 1, got {config.warmup_tokens}")
    if not 0.5 <= config.level < 1:
        raise ConfigError(f"--level must be in [0.5, 1), got {config.level}")
    if config.resamples < 100:
        raise ConfigError(f"--resamples must be >= 100, got {config.resamples}")


@dataclass(frozen=True)
class BenchConfig:
    """The settings of one benchmark run; `specpilot bench` flags map onto these fields."""

    sets: tuple[str, ...]
    n_prompts: int  # per set; 0 = every prompt of the set (rounded down to a multiple of batch)
    max_new_tokens: int
    batch: int = 1
    seed: int = 0  # chooses the prompt subsets
    warmup_tokens: int = 32
    resamples: int = DEFAULT_RESAMPLES
    level: float = DEFAULT_LEVEL
    interval: IntervalMethod = IntervalMethod.BCA
    bootstrap_seed: int = 0
    ignore_eos: bool = False  # decode exactly max_new_tokens per prompt, through any EOS
    sampling: Sampling = Sampling()  # greedy unless set (default: the deployment regime's)

    def __post_init__(self):
        check_shared_settings(self)
        if self.batch < 1:
            raise ConfigError(f"--batch must be >= 1, got {self.batch}")
        if self.n_prompts and self.n_prompts % self.batch:
            raise ConfigError(f"--n-prompts {self.n_prompts} is not a multiple of --batch {self.batch}")

    @classmethod
    def for_deployment(cls, deployment: Deployment, **overrides) -> "BenchConfig":
        """Defaults from the deployment (sets, n_prompts, max_new_tokens, regime.batch, regime.sampling);
        None = default."""
        base = dict(sets=deployment.sets, n_prompts=deployment.n_prompts,
                    max_new_tokens=deployment.max_new_tokens, batch=deployment.regime.batch,
                    sampling=deployment.regime.sampling)
        base.update({k: v for k, v in overrides.items() if v is not None})
        base["sets"] = tuple(base["sets"])
        return cls(**base)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sets"] = list(self.sets)
        d["interval"] = self.interval.value
        d["sampling"] = self.sampling.to_dict()
        return d


def prompt_seed(seed: int, set_name: str, index: int) -> int:
    """The sampling seed of prompt `index` of `set_name` in a run seeded `seed`: one per prompt, the
    same for AR and every system (and across runs with the same seed)."""
    text = f"bench-sampling:{seed}:{set_name}:{index}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def sampling_of(config, prompts: list[BenchPrompt]):
    """Per-prompt `SamplingParams` (seeded by `prompt_seed`), or None under greedy."""
    if config.sampling.greedy:
        return None
    from specpilot.engine.runner import sampling_params

    return [sampling_params(config.sampling, prompt_seed(config.seed, p.set_name, p.index)) for p in prompts]


@dataclass(frozen=True)
class Output:
    """One engine's generation for one prompt of a batch, compared with AR's."""

    tokens: int
    rounds: int  # target forwards
    accept_histogram: tuple[int, ...]  # [j] = rounds that committed j + 1 tokens
    identical: bool  # the tokens equal AR's, all of them
    first_divergence: int | None  # index of the first token that differs from AR's; None if identical

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target forward (accepted drafts + the bonus token)."""
        return self.tokens / self.rounds if self.rounds else float("nan")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accept_histogram"] = list(self.accept_histogram)
        d["mean_accepted_length"] = self.mean_accepted_length
        return d


@dataclass(frozen=True)
class EngineRun:
    """One engine (AR or a system) decoding one batch."""

    name: str
    seconds: float  # wall time of the batch: prefill + decode, device synchronised
    prefill_seconds: float
    outputs: tuple[Output, ...]  # per prompt of the batch

    @property
    def tokens(self) -> int:
        return sum(o.tokens for o in self.outputs)

    @property
    def rounds(self) -> int:
        return sum(o.rounds for o in self.outputs)

    def to_dict(self) -> dict:
        return {"name": self.name, "seconds": self.seconds, "prefill_seconds": self.prefill_seconds,
                "outputs": [o.to_dict() for o in self.outputs]}


@dataclass(frozen=True)
class PromptInfo:
    index: int  # position in its set
    source_id: str
    prompt_tokens: int


@dataclass(frozen=True)
class BatchMeasurement:
    """AR and every system on one batch of prompts of one set: the unit of the statistics."""

    set_name: str
    batch_index: int  # within the set
    prompts: tuple[PromptInfo, ...]
    order: tuple[str, ...]  # engine names in the order they ran
    ar: EngineRun
    systems: tuple[EngineRun, ...]  # in the run's system order

    def system(self, name: str) -> EngineRun:
        for run in self.systems:
            if run.name == name:
                return run
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"set": self.set_name, "batch": self.batch_index,
                "prompts": [asdict(p) for p in self.prompts], "order": list(self.order),
                "ar": self.ar.to_dict(), "systems": [s.to_dict() for s in self.systems]}


def accept_histogram(accept_lengths: list[int]) -> tuple[int, ...]:
    if not accept_lengths:
        return ()
    counts = [0] * max(accept_lengths)
    for n in accept_lengths:
        counts[n - 1] += 1
    return tuple(counts)


def make_batches(prompts: list[BenchPrompt], batch: int) -> list[tuple[str, list[BenchPrompt]]]:
    """Consecutive prompts of one set grouped by `batch`; a set's remainder (< batch) is dropped."""
    by_set: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_set.setdefault(p.set_name, []).append(p)
    out = []
    for name, items in by_set.items():
        if len(items) < batch:
            raise ConfigError(f"set {name!r} has {len(items)} prompts, fewer than --batch {batch}")
        usable = len(items) - len(items) % batch
        out += [(name, items[i : i + batch]) for i in range(0, usable, batch)]
    return out


def systems_under_test(specs: list[str] | None, deployment: Deployment) -> tuple[System, ...]:
    """Systems named by `--system` (files, 'stock', 'ar'); default the deployment's stock.

    `ar` as a system under test is named "ar-control": AR timed against itself, whose speedup
    should be 1 within its interval (a check of the protocol and of the noise).
    """
    systems = []
    for spec in specs or ["stock"]:
        if spec == AR_NAME:
            systems.append(load_system(AR_NAME, deployment).with_changes(name="ar-control"))
            continue
        system = load_system(spec, deployment)
        if system.name == AR_NAME:
            raise ConfigError(f"system {spec!r} is named 'ar', the name of the reference; rename it")
        systems.append(system)
    names = [s.name for s in systems]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"systems under test need distinct names; repeated: {', '.join(dupes)}")
    return tuple(systems)


def _sampled(sampling) -> dict:
    """`generate`'s sampling argument where there is one (greedy calls stay as they always were)."""
    return {} if sampling is None else {"sampling": sampling}


def _timed(generator, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool, sampling=None):
    gc.collect()
    gc.disable()
    try:
        return generator.generate(prompts, max_new_tokens, stop_at_eos=stop_at_eos, **_sampled(sampling))
    finally:
        gc.enable()


def _engine_run(name: str, result, reference: list[list[int]]) -> EngineRun:
    outputs = []
    for row, tokens in enumerate(result.outputs):
        div = first_divergence(tokens, reference[row])
        outputs.append(Output(len(tokens), result.rounds[row], accept_histogram(result.accept_lengths[row]),
                              div is None, div))
    return EngineRun(name, result.seconds, result.prefill_seconds, tuple(outputs))


def run_benchmark(session, systems: tuple[System, ...], prompts: list[BenchPrompt], config: BenchConfig,
                  progress: Callable[[str], None] | None = None) -> tuple[BatchMeasurement, ...]:
    """Time AR and every system on every batch, interleaved; `progress(label)` after each decode."""
    if not systems:
        raise ConfigError("no system to benchmark")
    if AR_NAME in {s.name for s in systems}:
        raise ConfigError("a system under test cannot be named 'ar' (see systems_under_test)")
    ar_system = load_system(AR_NAME, session.deployment)
    engines = [(AR_NAME, session.generator(ar_system))] + [(s.name, session.generator(s)) for s in systems]
    batches = make_batches(prompts, config.batch)
    longest = max(len(p.ids) for p in prompts)
    for _, gen in engines:  # fail before any timing if a prompt cannot fit the context
        gen.capacity_for(longest, config.max_new_tokens)
    warm = [p.as_list() for p in batches[0][1]]
    warm_sampling = sampling_of(config, batches[0][1])  # sampled rounds (their graphs) warm up too
    for name, gen in engines:
        gen.generate(warm, min(config.warmup_tokens, config.max_new_tokens), stop_at_eos=not config.ignore_eos,
                     **_sampled(warm_sampling))
        if progress:
            progress(f"warm-up {name}")
    measurements = []
    counters: dict[str, int] = {}
    for k, (set_name, items) in enumerate(batches):
        ids = [p.as_list() for p in items]
        sampling = sampling_of(config, items)  # the same seeds for every engine
        shift = k % len(engines)
        order = engines[shift:] + engines[:shift]
        results = {}
        for name, gen in order:
            results[name] = _timed(gen, ids, config.max_new_tokens, stop_at_eos=not config.ignore_eos,
                                   sampling=sampling)
            if progress:
                progress(f"{set_name}: {name}")
        reference = results[AR_NAME].outputs
        ar_run = _engine_run(AR_NAME, results[AR_NAME], reference)
        runs = tuple(_engine_run(s.name, results[s.name], reference) for s in systems)
        index = counters.get(set_name, 0)
        counters[set_name] = index + 1
        info = tuple(PromptInfo(p.index, p.source_id, len(p.ids)) for p in items)
        measurements.append(BatchMeasurement(set_name, index, info, tuple(n for n, _ in order), ar_run, runs))
    return tuple(measurements)


def count_decodes(prompts: list[BenchPrompt], config: BenchConfig, systems: int) -> int:
    """`generate` calls `run_benchmark` makes (warm-up included): the progress bar's total."""
    return (len(make_batches(prompts, config.batch)) + 1) * (systems + 1)

