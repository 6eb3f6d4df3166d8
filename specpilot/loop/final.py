"""The final measurement: stock and the final system against AR, in one benchmark run, with intervals.

The controller measured each promotion as a gain over its incumbent; users care about speedup over
AR. At the end of a run the benchmark procedure of `specpilot.bench` times AR, stock and the final
system in one process, so both speedups — and the final system's gain over stock — come from the
same run, with intervals. Which procedure is the deployment's regime's:

- static batches (`regime.continuous` false): the batch benchmark (AR and the systems interleaved
  batch by batch, paired stratified bootstrap intervals; `specpilot.bench.runner`, `.stats`);
- continuous batching: the serving benchmark at concurrency `regime.batch`, closed loop, as the
  controller timed its blocks (`specpilot.bench.serving`, `.serving_results`): AR and the systems
  serve the same units of requests back to back; speedups are throughputs over AR's and the gain
  final / stock is final's throughput over stock's, each paired by unit. A timed unit is
  `FINAL_REQUESTS_PER_SLOT` requests per slot, and there are at least MIN_UNITS units (an
  interval needs them), more when the loop's `final_prompts` per set ask for more requests.

A knob-only final system is measured in this process on the loop's loaded session. A final system
carrying a patch is measured by `specpilot bench` (with `--regime serving` for a continuous
deployment) in a subprocess that imports its worktree, so its code is what runs; AR and stock then
run on the patched code too (noted in the result).

The held-out run. The loop tuned the final system on the deployment's sets; whether its gain holds
elsewhere is measured on the project's own held-out prompts (`datasets.HELDOUT_SET`), which no
deployment lists and the loop never sees. When the final system is not stock, the same procedure
runs a second time, the same way (here or in the worktree), on the held-out set alone
(`heldout_config`): the batch benchmark for static batches, and for continuous batching the
serving benchmark at the same concurrency (not skipped: the gain the loop optimised is the
served one). Its batches or units are as many as the loop option `final_heldout_prompts` asks
for, at least MIN_UNITS (an interval needs them), as far as the set's 40 prompts go: above batch 8,
or concurrency 4 at two requests per slot, fewer fit and the held-out gain has no interval. No
held-out run when the option is 0, when not one batch or unit fits in the set, or when the final
system is stock; a held-out run that fails leaves the main measurement standing and says why
(`heldout_note`).

Owns: `FinalMeasurement`, `bench_config`, `heldout_config`, `measure_final`, and the serving run's
summary lines (`serving_line`, `format_rate`). Does not own the benchmarks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from specpilot.bench.runner import BenchConfig
from specpilot.bench.serving import ServingConfig
from specpilot.bench.stats import MIN_UNITS
from specpilot.config import HELDOUT_SET, Deployment
from specpilot.control.defaults import SERVING_REQUESTS_PER_SLOT
from specpilot.errors import ConfigError, SpecPilotError
from specpilot.loop.systems import Candidate

FINAL_NAME = "final"
# a serving unit: two requests per slot, so requests are admitted while others decode (one per
# slot would be a static batch that drains); `specpilot bench --regime serving` measures so too
FINAL_REQUESTS_PER_SLOT = SERVING_REQUESTS_PER_SLOT  # as the loop's timed requests (`control.defaults`)


def is_serving(bench: dict) -> bool:
    """Whether a final benchmark document (results.json) is the serving benchmark's."""
    return bench.get("config", {}).get("regime") == "serving"


def bench_system(bench: dict, name: str) -> dict:
    """A system's summary in a benchmark document: the batch benchmark's, or its engine at the
    serving run's one level."""
    if is_serving(bench):
        (level,) = bench["levels"]
        return next(e for e in level["engines"] if e["name"] == name)
    return next(s for s in bench["systems"] if s["name"] == name)


def bench_speedup(bench: dict, name: str) -> dict:
    """A system over AR: the geometric mean over sets (batch), or throughput over AR's (serving)."""
    return bench_system(bench, name)["speedup" if is_serving(bench) else "geomean_speedup"]


def bench_gain(bench: dict, name: str) -> dict:
    """A system over stock: the geometric mean over sets of the ratio of times per token (batch),
    or its throughput over stock's paired by unit (serving)."""
    return bench_system(bench, name)["gain" if is_serving(bench) else "geomean_gain"]


@dataclass(frozen=True)
class FinalMeasurement:
    bench: dict  # `BenchResult.to_dict()` or `ServingBenchResult.to_dict()`: every number of the run
    stock: str  # names of the two systems in it
    final: str | None  # None when the final system is stock itself (only stock was timed)
    note: str = ""  # e.g. AR and stock ran on patched code
    seconds: float = 0.0
    heldout: dict | None = None  # the held-out run's benchmark document, as `bench` (None: no held-out run)
    heldout_note: str = ""  # why there is no held-out run, when one was asked for

    @property
    def serving(self) -> bool:
        return is_serving(self.bench)

    def system(self, name: str) -> dict:
        """A system's summary: the batch benchmark's, or its engine at the serving run's one level."""
        return bench_system(self.bench, name)

    def _speedup(self, name: str) -> dict:
        return bench_speedup(self.bench, name)

    @property
    def stock_speedup(self) -> dict:
        return self._speedup(self.stock)

    @property
    def final_speedup(self) -> dict:
        return self._speedup(self.final or self.stock)

    @property
    def final_gain(self) -> dict | None:
        """Final over stock, with its interval: the geometric mean over sets of the ratio of times per
        token (batch), or final's throughput over stock's paired by unit (serving)."""
        if not self.final:
            return None
        return bench_gain(self.bench, self.final)

    @property
    def saturated_gain(self) -> dict | None:
        """Final over stock while every slot was taken, paired by unit (serving: the rate the
        controller's blocks compare); None for the batch benchmark or when a unit never saturated."""
        if not self.final or not self.serving:
            return None
        return self.system(self.final).get("saturated_gain")

    @property
    def heldout_gain(self) -> dict | None:
        """Final over stock on the held-out prompts, with its interval (None: no held-out run)."""
        return bench_gain(self.heldout, self.final) if self.heldout and self.final else None

    def heldout_summary(self) -> dict | None:
        """The held-out run's numbers: its prompts, each system over AR, and final over stock."""
        if not self.heldout or not self.final:
            return None
        return {"prompts": self.heldout["config"]["n_prompts"],
                "stock_speedup": bench_speedup(self.heldout, self.stock),
                "final_speedup": bench_speedup(self.heldout, self.final), "final_gain": self.heldout_gain,
                "bench": self.heldout}

    def to_dict(self) -> dict:
        return {"stock": self.stock, "final": self.final, "note": self.note, "seconds": self.seconds,
                "regime": "serving" if self.serving else "batch",
                "stock_speedup": self.stock_speedup, "final_speedup": self.final_speedup,
                "final_gain": self.final_gain, "saturated_gain": self.saturated_gain, "bench": self.bench,
                "heldout": self.heldout_summary(), "heldout_note": self.heldout_note}


def bench_config(deployment: Deployment, prompts_per_set: int, max_new_tokens: int,
                 seed: int = 0) -> BenchConfig | ServingConfig:
    """The final benchmark's settings for the deployment's regime: static batches, `prompts_per_set`
    rounded up to at least two whole batches per set; continuous batching, concurrency
    `regime.batch`, closed loop, units of `FINAL_REQUESTS_PER_SLOT` requests per slot, as many as
    the sets x `prompts_per_set` requests fill and at least MIN_UNITS, the sets' prompts in turn."""
    b = deployment.regime.batch
    tokens = min(max_new_tokens, deployment.max_new_tokens)
    if deployment.regime.continuous:
        size = FINAL_REQUESTS_PER_SLOT * b
        units = max(MIN_UNITS, -(-len(deployment.sets) * prompts_per_set // size))
        n = -(-units * size // len(deployment.sets))  # per set; the pool's remainder is left out
        return ServingConfig.for_deployment(deployment, n_prompts=n, max_new_tokens=tokens, concurrency=(b,),
                                            requests_per_slot=FINAL_REQUESTS_PER_SLOT, units=units, seed=seed)
    n = b * max(2, -(-prompts_per_set // b))
    return BenchConfig.for_deployment(deployment, n_prompts=n, max_new_tokens=tokens, seed=seed)


def heldout_config(config: BenchConfig | ServingConfig, prompts: int) -> BenchConfig | ServingConfig | None:
    """The held-out run's settings: the final benchmark `config` on the held-out set alone, `prompts`
    prompts in whole batches or serving units of `config`'s size, at least MIN_UNITS of them (an
    interval needs them) as far as the set's prompts go; None when `prompts` is 0 or not one batch or
    unit fits in the set."""
    if prompts <= 0:
        return None
    available = len(_heldout_examples())
    if isinstance(config, ServingConfig):
        size = config.unit_size(config.concurrency[0])
        units = min(max(MIN_UNITS, -(-prompts // size)), available // size)
        return replace(config, sets=(HELDOUT_SET,), n_prompts=units * size, units=units) if units else None
    b = config.batch
    batches = min(max(MIN_UNITS, -(-prompts // b)), available // b)
    return replace(config, sets=(HELDOUT_SET,), n_prompts=batches * b) if batches else None


def describe_config(config: BenchConfig | ServingConfig) -> str:
    """What the final benchmark runs, for the journal line announcing it."""
    if isinstance(config, ServingConfig):
        c = config.concurrency[0]
        return (f"served at concurrency {c}, closed loop: {config.units} units of {config.unit_size(c)} requests "
                f"from {len(config.sets)} sets x {config.n_prompts} prompts, {config.max_new_tokens} tokens, "
                "interleaved unit by unit")
    return (f"on {len(config.sets)} sets x {config.n_prompts} prompts x {config.max_new_tokens} tokens "
            f"(batch {config.batch}), interleaved")


def serving_engines(final: dict) -> list[tuple[str, dict]]:
    """(label, engine summary) of AR, stock and the final system at a serving final benchmark's one
    level, from `FinalMeasurement.to_dict()`."""
    (level,) = final["bench"]["levels"]
    by = {e["name"]: e for e in level["engines"]}
    names = [("AR", "ar"), ("stock", final["stock"])] + ([("final", final["final"])] if final["final"] else [])
    return [(label, by[name]) for label, name in names]


def format_rate(interval: dict | None) -> str:
    """Tokens per second with its interval (an `Interval.to_dict()`), e.g. '1,969 [1,901, 2,040]'."""
    if not interval or interval.get("estimate") is None:
        return "n/a"
    est = f"{interval['estimate']:,.0f}"
    if interval.get("low") is None or interval.get("high") is None:
        return est + " [n/a]"
    return f"{est} [{interval['low']:,.0f}, {interval['high']:,.0f}]"


def identical_count(engine: dict) -> str:
    """"k/n" outputs identical to AR's, or "n/a (sampled)" where a sampled run claims none."""
    return "n/a (sampled)" if engine.get("identical") is None else f"{engine['identical']}/{engine['requests']}"


def serving_line(final: dict) -> str:
    """A serving final benchmark in one line: each engine's throughput, and outputs equal to AR's."""
    (level,) = final["bench"]["levels"]
    engines = serving_engines(final)
    rates = ", ".join(f"{label} {format_rate(e['tokens_per_second'])} tok/s" for label, e in engines)
    same = ", ".join(f"{label} {identical_count(e)}" for label, e in engines[1:])
    from specpilot.loop.report import format_speedup

    saturated = [(label, e["saturated_speedup"]) for label, e in engines[1:] if e.get("saturated_speedup")]
    gain = engines[-1][1].get("saturated_gain")  # the final system's; stock's (the baseline) has none
    busy = ("; while a request waited for a slot (no ramp-down): " + ", ".join(
        f"{label} {format_speedup(iv)}" for label, iv in saturated) + " over AR"
        + (f", final / stock {format_speedup(gain)}" if gain else "")) if saturated else ""
    return (f"concurrency {level['concurrency']}, {level['units']} units of {level['unit_requests']} requests: "
            f"{rates}; outputs identical to AR: {same}{busy}")


def measure_final(session, deployment: Deployment, deployment_file: str, stock: Candidate, final: Candidate,
                  config: BenchConfig | ServingConfig, scratch: Path, progress=None,
                  heldout_prompts: int = 0) -> FinalMeasurement:
    """AR, stock and the final system in one run of the benchmark `config` names (`bench_config`);
    then, when the final system is not stock, the same on `heldout_prompts` held-out prompts
    (`heldout_config`; 0 = no held-out run)."""
    serving = isinstance(config, ServingConfig)
    if serving != deployment.regime.continuous:  # the regime the loop optimised for is the one reported
        want = "the serving" if deployment.regime.continuous else "the batch"
        raise ConfigError(f"deployment {deployment.name!r}: its final measurement takes {want} benchmark's "
                          "settings (loop.final.bench_config)")
    start = time.monotonic()
    same = final.hash == stock.hash
    patched = bool(final.patch) and not same
    final_system = final.system.with_changes(name=FINAL_NAME)
    systems = (stock.system,) if same else (stock.system, final_system)

    def run(cfg: BenchConfig | ServingConfig) -> dict:
        if patched:
            return _bench_in_worktree(final.workdir, deployment_file, final_system, cfg, scratch)
        if serving:
            return _serve_here(session, deployment, systems, cfg, progress)
        return _bench_here(session, deployment, systems, cfg, progress)

    bench = run(config)
    note = "AR and stock ran on the final system's patched code (one process per benchmark run)" if patched else ""
    heldout, heldout_note = None, ""
    if heldout_prompts > 0 and not same:
        held = heldout_config(config, heldout_prompts)
        if held is None:
            heldout_note = (f"no held-out run: not one {'unit' if serving else 'batch'} of the final benchmark "
                            f"fits in the held-out set's {len(_heldout_examples())} prompts")
        else:
            try:
                heldout = run(held)
            except SpecPilotError as err:  # the main measurement stands without it
                heldout_note = f"the held-out run failed: {err}"
    return FinalMeasurement(bench, stock.system.name, None if same else FINAL_NAME, note, time.monotonic() - start,
                            heldout, heldout_note)


def _heldout_examples():
    from specpilot.bench.datasets import load_set

    return load_set(HELDOUT_SET)


def _bench_here(session, deployment: Deployment, systems, config: BenchConfig, progress) -> dict:
    from specpilot.bench import provenance
    from specpilot.bench.prompts import prompt_ids
    from specpilot.bench.results import BenchResult, summarise
    from specpilot.bench.runner import make_batches, run_benchmark

    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    start = time.perf_counter()
    environment = provenance.capture(session.device, session.target.dtype)
    prompts = prompt_ids(deployment, session.tokenizer, config.sets, config.n_prompts, config.seed)
    used = sum(len(items) for _, items in make_batches(prompts, config.batch))
    measurements = run_benchmark(session, systems, prompts, config, progress=progress)
    result = BenchResult(deployment=deployment, config=config, systems=summarise(measurements, systems, config),
                         measurements=measurements, environment=environment, created=created,
                         command=("specpilot", "run"), chat_template=any(p.chat for p in prompts),
                         dropped_prompts=len(prompts) - used, wall_seconds=time.perf_counter() - start)
    return result.to_dict()


def _serve_here(session, deployment: Deployment, systems, config: ServingConfig, progress) -> dict:
    from specpilot.bench import provenance
    from specpilot.bench.prompts import prompt_ids
    from specpilot.bench.serving import run_serving
    from specpilot.bench.serving_results import ServingBenchResult, summarise

    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    start = time.perf_counter()
    environment = provenance.capture(session.device, session.target.dtype)
    prompts = prompt_ids(deployment, session.tokenizer, config.sets, config.n_prompts, config.seed)
    measurements = run_serving(session, systems, prompts, config, progress=progress)
    result = ServingBenchResult(deployment=deployment, config=config,
                                levels=summarise(measurements, systems, config, len(prompts)),
                                measurements=measurements, environment=environment, created=created,
                                command=("specpilot", "run"), chat_template=any(p.chat for p in prompts),
                                wall_seconds=time.perf_counter() - start)
    return result.to_dict()


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def bench_argv(deployment_file: str, system_file: Path, config: BenchConfig | ServingConfig, out: Path) -> list[str]:
    """`specpilot bench` flags running `config` on stock and the system in `system_file`."""
    argv = ["--deployment", deployment_file, "--system", "stock", "--system", str(system_file),
            "--sets", *config.sets, "--n-prompts", str(config.n_prompts),
            "--max-new-tokens", str(config.max_new_tokens), "--seed", str(config.seed), "--out", str(out),
            "--warmup-tokens", str(config.warmup_tokens), "--resamples", str(config.resamples),
            "--level", str(config.level), "--interval", config.interval.value, "--no-progress",
            *(["--ignore-eos"] if config.ignore_eos else [])]
    if not config.sampling.greedy:  # the deployment's regime gives them too; stated, so the run says what it ran
        s = config.sampling
        argv += ["--temperature", repr(float(s.temperature)), "--top-k", str(s.top_k), "--top-p",
                 repr(float(s.top_p)), "--min-p", repr(float(s.min_p))]
    if isinstance(config, ServingConfig):
        argv += ["--regime", "serving", "--concurrency", *map(str, config.concurrency),
                 "--requests-per-slot", str(config.requests_per_slot), "--units", str(config.units),
                 *(["--arrival-rate", str(config.arrival_rate)] if config.arrival_rate > 0 else [])]
    else:
        argv += ["--batch", str(config.batch)]
    return argv


def _bench_in_worktree(workdir: str, deployment_file: str, final_system, config: BenchConfig | ServingConfig,
                       scratch: Path) -> dict:
    out = scratch / f"final-bench-{'-'.join(config.sets)}-{int(time.time())}"
    system_file = scratch / f"{FINAL_NAME}.toml"
    system_file.write_text(final_system.to_toml())
    argv = bench_argv(deployment_file, system_file, config, out)
    code = (f"import sys; sys.path.insert(0, {str(Path(workdir).resolve())!r}); "
            f"from specpilot.cli.bench import main; sys.exit(main({argv!r}))")
    env = dict(os.environ)
    if not torch_cuda_available():
        env["OMP_NUM_THREADS"] = "1"  # single-threaded on CPU, like the loop's workers (runner.py)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    results = out / "results.json"
    if proc.returncode != 0 or not results.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SpecPilotError(f"the final benchmark in the final system's worktree failed: {tail[0]}")
    return json.loads(results.read_text())
