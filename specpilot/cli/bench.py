"""`specpilot bench`: speedup over AR on the benchmark sets, with intervals, in one command.

Owns the flags (each maps onto a `BenchConfig` field, or picks the deployment, the systems, the
device and the output directory) and `benchmark`, which composes the pieces: load the session,
build the prompts, time AR and the systems interleaved, summarise, and `write_outputs`
(results.json, results.md, speedup.png, accept_hist.png). The terminal table goes to stdout, the
progress bar and file paths to stderr. A run that fails or is interrupted (exit 130) before
writing removes the output directory it created.

On a CPU run the other processes' load is read while the models load and while they are timed
(`cli.cpu_load`): under foreign load torch runs on the cores the others leave free, results.json
records the load of the timing under `environment.cpu_load`, and a timing under foreign load gets
one `warning:` line on stderr, after the table, saying it is not trustworthy. The rule for the
numbers: the speedups are still printed and written, with that warning (AR and the systems were
timed interleaved in one process, on the same threads, so the load fell on both). GPU runs are
not watched.

With `--regime serving` it runs the serving benchmark instead (`specpilot.bench.serving`:
continuous batching at `--concurrency` slots, closed loop or `--arrival-rate`; results.json and
results.md from `bench.serving_results`).

Does not own any of the pieces; `register(subparsers)` is wired in by `specpilot.cli`, and
`python -m specpilot.cli.bench ...` runs the same command on its own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specpilot.bench.runner import BenchConfig
    from specpilot.config import Deployment, System

HELP = "speedup over AR on the benchmark sets, with bootstrap intervals"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help=HELP,
        description="Times AR and one or more systems on the deployment's benchmark prompts, interleaved in one "
                    "process, and writes results.json, results.md, speedup.png and accept_hist.png. Speedup per "
                    "set = AR time per generated token / system time per generated token; across sets their "
                    "geometric mean.")
    add_arguments(p)
    p.set_defaults(func=run_bench)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specpilot.bench.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, IntervalMethod

    p.add_argument("--deployment", help="deployment file or shipped name (default: fixture)")
    p.add_argument("--system", action="append",
                   help="system file (TOML knob overrides on top of the deployment's stock), 'stock' or 'ar'; "
                        "repeat to time several systems against the same AR runs (the first is the baseline "
                        "for gains; default: stock)")
    p.add_argument("--sets", nargs="+", help="benchmark sets, space or comma separated (default: the deployment's)")
    p.add_argument("--n-prompts", type=int,
                   help="prompts per set, a seeded subset; 0 = every prompt (default: the deployment's)")
    p.add_argument("--max-new-tokens", type=int, help="new tokens per prompt (default: the deployment's)")
    p.add_argument("--batch", type=int,
                   help="prompts decoded together; time is measured per batch (default: the deployment's regime)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt subsets (default 0)")
    p.add_argument("--warmup-tokens", type=int, default=32, help="untimed warm-up tokens per engine (default 32)")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples (default {DEFAULT_RESAMPLES})")
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="confidence level (default 0.95)")
    p.add_argument("--interval", choices=[m.value for m in IntervalMethod], default=IntervalMethod.BCA.value,
                   help="bootstrap interval method (default bca; see specpilot/bench/stats.py)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="decode exactly --max-new-tokens per prompt, through any EOS (fixed-length runs)")
    p.add_argument("--regime", choices=["batch", "serving"], default="batch",
                   help="batch: static batches of --batch prompts; serving: continuous batching of a request "
                        "stream, throughput and latency percentiles (default batch)")
    p.add_argument("--concurrency", type=int, nargs="+",
                   help="serving: decode slots, one level per value, e.g. 1 8 32 (default: the deployment's batch)")
    p.add_argument("--arrival-rate", type=float,
                   help="serving: Poisson arrivals, requests per second, seeded by --seed (default: closed loop)")
    p.add_argument("--requests-per-slot", type=int,
                   help="serving: a timed unit serves this many requests per slot (default 4)")
    p.add_argument("--units", type=int,
                   help="serving: timed units per concurrency level, at most (default: all the prompts give)")
    p.add_argument("--temperature", type=float,
                   help="sample at this temperature, AR and every system with the same seed per prompt "
                        "(default: the deployment regime's; 0 = greedy)")
    p.add_argument("--top-k", type=int, help="sampling: top-k, 0 = off (default: the regime's)")
    p.add_argument("--top-p", type=float, help="sampling: top-p, 1 = off (default: the regime's)")
    p.add_argument("--min-p", type=float, help="sampling: min-p, 0 = off (default: the regime's)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--out", help="results directory (default: $SPECPILOT_HOME/runs/bench/<UTC time>-<deployment>)")
    p.add_argument("--overwrite", action="store_true", help="allow --out to be a directory that already holds files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p")


def sampling_from_args(args, deployment: Deployment):
    """The deployment regime's `Sampling` with the flags given laid over it (one `error:` line for a bad value)."""
    from dataclasses import replace

    given = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k, None) is not None}
    return replace(deployment.regime.sampling, **given)


def config_from_args(args, deployment: Deployment) -> BenchConfig:
    from specpilot.bench.runner import BenchConfig
    from specpilot.bench.stats import IntervalMethod

    sets = None
    if args.sets:
        sets = tuple(s for item in args.sets for s in item.split(",") if s)
    return BenchConfig.for_deployment(
        deployment, sets=sets, n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens, batch=args.batch,
        seed=args.seed, warmup_tokens=args.warmup_tokens, resamples=args.resamples, level=args.level,
        interval=IntervalMethod(args.interval), ignore_eos=args.ignore_eos,
        sampling=sampling_from_args(args, deployment),
    )


SERVING_ONLY = ("concurrency", "arrival_rate", "requests_per_slot", "units")


def serving_config_from_args(args, deployment: Deployment):
    from specpilot.bench.serving import ServingConfig
    from specpilot.bench.stats import IntervalMethod
    from specpilot.errors import ConfigError

    if args.batch is not None:
        raise ConfigError("--batch is for --regime batch; the serving regime takes --concurrency")
    sets = tuple(s for item in args.sets for s in item.split(",") if s) if args.sets else None
    return ServingConfig.for_deployment(
        deployment, sets=sets, n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens,
        concurrency=args.concurrency, arrival_rate=args.arrival_rate,
        requests_per_slot=args.requests_per_slot, units=args.units,
        seed=args.seed, warmup_tokens=args.warmup_tokens, resamples=args.resamples, level=args.level,
        interval=IntervalMethod(args.interval), ignore_eos=args.ignore_eos,
        sampling=sampling_from_args(args, deployment),
    )


def serving_benchmark(deployment: Deployment, systems: tuple[System, ...], config, device=None,
                      show_progress: bool = True, command: tuple[str, ...] = ()):
    """Load the deployment, serve its prompts with AR and `systems`; the `ServingBenchResult`."""
    from specpilot.bench import provenance
    from specpilot.bench.progress import Progress
    from specpilot.bench.prompts import prompt_ids
    from specpilot.bench.serving import count_runs, run_serving
    from specpilot.bench.serving_results import ServingBenchResult, summarise
    from specpilot.cli.cpu_load import watched
    from specpilot.engine.session import Session
    from specpilot.env import resolve_device

    start = time.perf_counter()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with watched(resolve_device(device)) as cpu:
        session = Session.load(deployment, device=device)
        cpu.fit_threads()  # under foreign load: torch on the cores left free (before `capture` records them)
        environment = provenance.capture(session.device, session.target.dtype)
        prompts = prompt_ids(deployment, session.tokenizer, config.sets, config.n_prompts, config.seed)
        with Progress(count_runs(prompts, config, len(systems)), f"serve {deployment.name}",
                      enabled=show_progress) as bar:
            measurements = run_serving(session, systems, prompts, config, progress=bar.step)
        cpu.timed()
    if cpu.on:
        environment["cpu_load"] = cpu.record()
    return ServingBenchResult(
        deployment=deployment, config=config, levels=summarise(measurements, systems, config, len(prompts)),
        measurements=measurements, environment=environment, created=created, command=tuple(command),
        chat_template=any(p.chat for p in prompts), wall_seconds=time.perf_counter() - start,
    )


def benchmark(deployment: Deployment, systems: tuple[System, ...], config: BenchConfig, device=None,
              show_progress: bool = True, command: tuple[str, ...] = ()):
    """Load the deployment, time AR and `systems` on its prompts, and return the `BenchResult`."""
    from specpilot.bench import provenance
    from specpilot.bench.progress import Progress
    from specpilot.bench.prompts import prompt_ids
    from specpilot.bench.results import BenchResult, summarise
    from specpilot.bench.runner import count_decodes, make_batches, run_benchmark
    from specpilot.cli.cpu_load import watched
    from specpilot.engine.session import Session
    from specpilot.env import resolve_device

    start = time.perf_counter()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with watched(resolve_device(device)) as cpu:
        session = Session.load(deployment, device=device)
        cpu.fit_threads()  # under foreign load: torch on the cores left free (before `capture` records them)
        environment = provenance.capture(session.device, session.target.dtype)  # the code and machine that run
        prompts = prompt_ids(deployment, session.tokenizer, config.sets, config.n_prompts, config.seed)
        used = sum(len(items) for _, items in make_batches(prompts, config.batch))
        total = count_decodes(prompts, config, len(systems))
        with Progress(total, f"bench {deployment.name}", enabled=show_progress) as bar:
            measurements = run_benchmark(session, systems, prompts, config, progress=bar.step)
        cpu.timed()
    if cpu.on:
        environment["cpu_load"] = cpu.record()
    return BenchResult(
        deployment=deployment, config=config, systems=summarise(measurements, systems, config),
        measurements=measurements, environment=environment, created=created,
        command=tuple(command), chat_template=any(p.chat for p in prompts),
        dropped_prompts=len(prompts) - used, wall_seconds=time.perf_counter() - start,
    )


def write_outputs(result, out_dir: Path) -> list[Path]:
    """results.json, results.md, speedup.png, accept_hist.png in `out_dir`."""
    from specpilot.bench.plots import write_plots
    from specpilot.bench.report import write_json, write_markdown

    return [write_json(result, out_dir), write_markdown(result, out_dir), *write_plots(result, out_dir)]


def run_bench(args) -> int:
    from specpilot.bench.report import default_out_dir, prepare_out_dir, render_terminal
    from specpilot.bench.runner import systems_under_test
    from specpilot.cli.outdirs import removed_if_left_empty
    from specpilot.config import load_deployment
    from specpilot.errors import ConfigError

    deployment = load_deployment(args.deployment)
    systems = systems_under_test(args.system, deployment)
    if args.regime == "serving":
        return run_serving_bench(args, deployment, systems)
    given = [f"--{name.replace('_', '-')}" for name in SERVING_ONLY if getattr(args, name, None) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} needs --regime serving")
    config = config_from_args(args, deployment)
    from specpilot.env import resolve_device

    resolve_device(args.device)  # a device this torch cannot use is one `error:` line, before the plan
    from specpilot.engine.memory_check import check_memory

    check_memory(deployment, args.device)  # a CPU load that cannot fit: one `error:` line, before anything loads
    print(plan_line(config, len(systems)), file=sys.stderr)
    out = Path(args.out) if args.out else default_out_dir(deployment.name)
    command = tuple(getattr(args, "argv", None) or sys.argv)
    with removed_if_left_empty(out):  # interrupted or failed before writing: no empty directory left behind
        out_dir = prepare_out_dir(out, deployment.name, args.overwrite)  # before any device time is spent
        result = benchmark(deployment, systems, config, device=args.device, show_progress=not args.no_progress,
                           command=command)
        paths = write_outputs(result, out_dir)
    print(render_terminal(result))
    _warn_if_loaded(result)
    if result.dropped_prompts:
        print(f"note: {result.dropped_prompts} prompt(s) left out so every set is a whole number of batches",
              file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def _warn_if_loaded(result) -> None:
    """The `cli.cpu_load` warning on stderr when a CPU run was timed under foreign load."""
    from specpilot.cli.cpu_load import warning_line

    warning = warning_line(result.environment.get("cpu_load") or {}, "bench")
    if warning:
        print(warning, file=sys.stderr)


def plan_line(config, n_systems: int) -> str:
    """What a run will decode, before it starts: the scale a user can still cut with flags."""
    prompts = f"{config.n_prompts} prompts per set" if config.n_prompts else "every prompt of each set"
    return (f"bench: {len(config.sets)} sets x {prompts} x up to {config.max_new_tokens} new tokens, "
            f"AR and {n_systems} system(s) each, {config.sampling.describe()} (--n-prompts and --max-new-tokens "
            "make it shorter)")


def run_serving_bench(args, deployment: Deployment, systems: tuple[System, ...]) -> int:
    from specpilot.bench.report import default_out_dir, prepare_out_dir
    from specpilot.bench.serving_results import render_terminal, write_outputs
    from specpilot.cli.outdirs import removed_if_left_empty

    config = serving_config_from_args(args, deployment)
    from specpilot.engine.memory_check import check_memory

    check_memory(deployment, args.device)
    out = Path(args.out) if args.out else default_out_dir(deployment.name)
    command = tuple(getattr(args, "argv", None) or sys.argv)
    with removed_if_left_empty(out):
        out_dir = prepare_out_dir(out, deployment.name, args.overwrite)
        result = serving_benchmark(deployment, systems, config, device=args.device,
                                   show_progress=not args.no_progress, command=command)
        paths = write_outputs(result, out_dir)
    print(render_terminal(result))
    _warn_if_loaded(result)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`specpilot bench` without the top-level CLI (errors, Ctrl-C and notes shown like it)."""
    from specpilot.cli import execute

    parser = argparse.ArgumentParser(prog="specpilot bench", description="Speedup over AR with intervals.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = ["specpilot", "bench", *(sys.argv[1:] if argv is None else argv)]
    return execute(run_bench, args)


if __name__ == "__main__":
    raise SystemExit(main())
