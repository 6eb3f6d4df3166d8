"""The final measurement: stock and the final system against AR, in one benchmark run, with intervals.

The controller measured each promotion as a gain over its incumbent; users care about speedup over
AR. At the end of a run the benchmark procedure of `specpilot.bench` (AR and the systems
interleaved batch by batch in one process, paired stratified bootstrap intervals; see
`specpilot.bench.runner` and `specpilot.bench.stats`) times AR, stock and the final system on the deployment's
benchmark sets, so both speedups — and the final system's gain over stock — come from the same
run, with intervals.

A knob-only final system is measured in this process on the loop's loaded session. A final system
carrying a patch is measured by `specpilot bench` in a subprocess that imports its worktree, so
its code is what runs; AR and stock then run on the patched code too (noted in the result).

Owns: `FinalMeasurement`, `bench_config`, `measure_final`. Does not own the benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specpilot.bench.runner import BenchConfig
from specpilot.config import Deployment
from specpilot.errors import SpecPilotError
from specpilot.loop.systems import Candidate

FINAL_NAME = "final"


@dataclass(frozen=True)
class FinalMeasurement:
    bench: dict  # `BenchResult.to_dict()`: every number of the run
    stock: str  # names of the two systems in it
    final: str | None  # None when the final system is stock itself (only stock was timed)
    note: str = ""  # e.g. AR and stock ran on patched code
    seconds: float = 0.0

    def system(self, name: str) -> dict:
        return next(s for s in self.bench["systems"] if s["name"] == name)

    @property
    def stock_speedup(self) -> dict:
        return self.system(self.stock)["geomean_speedup"]

    @property
    def final_speedup(self) -> dict:
        return self.system(self.final or self.stock)["geomean_speedup"]

    @property
    def final_gain(self) -> dict | None:
        """Final over stock (geometric mean over sets of the ratio of times), with its interval."""
        return self.system(self.final)["geomean_gain"] if self.final else None

    def to_dict(self) -> dict:
        return {"stock": self.stock, "final": self.final, "note": self.note, "seconds": self.seconds,
                "stock_speedup": self.stock_speedup, "final_speedup": self.final_speedup,
                "final_gain": self.final_gain, "bench": self.bench}


def bench_config(deployment: Deployment, prompts_per_set: int, max_new_tokens: int, seed: int = 0) -> BenchConfig:
    """The deployment's sets, `prompts_per_set` rounded up to at least two whole batches of its regime."""
    b = deployment.regime.batch
    n = b * max(2, -(-prompts_per_set // b))
    tokens = min(max_new_tokens, deployment.max_new_tokens)
    return BenchConfig.for_deployment(deployment, n_prompts=n, max_new_tokens=tokens, seed=seed)


def measure_final(session, deployment: Deployment, deployment_file: str, stock: Candidate, final: Candidate,
                  config: BenchConfig, scratch: Path, progress=None) -> FinalMeasurement:
    start = time.monotonic()
    same = final.hash == stock.hash
    final_system = final.system.with_changes(name=FINAL_NAME)
    systems = (stock.system,) if same else (stock.system, final_system)
    if final.patch and not same:
        bench = _bench_in_worktree(final.workdir, deployment_file, final_system, config, scratch)
        note = "AR and stock ran on the final system's patched code (one process per benchmark run)"
    else:
        bench = _bench_here(session, deployment, systems, config, progress)
        note = ""
    return FinalMeasurement(bench, stock.system.name, None if same else FINAL_NAME, note, time.monotonic() - start)


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


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _bench_in_worktree(workdir: str, deployment_file: str, final_system, config: BenchConfig, scratch: Path) -> dict:
    out = scratch / f"final-bench-{int(time.time())}"
    system_file = scratch / f"{FINAL_NAME}.toml"
    system_file.write_text(final_system.to_toml())
    argv = ["--deployment", deployment_file, "--system", "stock", "--system", str(system_file),
            "--sets", *config.sets, "--n-prompts", str(config.n_prompts),
            "--max-new-tokens", str(config.max_new_tokens), "--seed", str(config.seed), "--out", str(out),
            "--interval", config.interval.value, "--no-progress", *(["--ignore-eos"] if config.ignore_eos else [])]
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
