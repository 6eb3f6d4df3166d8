"""`specpilot evaluate`: time a candidate system against an incumbent, decide, record, print.

Exit status: 0 promote, 1 reject, 3 need more data, 2 bad input. Every `ControllerConfig` field
has its flag (`--blocks`, `--extra-blocks`, ...), 1:1; unset flags keep the defaults, with the
request size and token budget taken from the deployment's regime.

Owns: flags, text and JSON output. Does not own the evaluation (`evaluate.py`).
"""

from __future__ import annotations

import argparse
import enum
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specpilot.config import Deployment
    from specpilot.control.config import ControllerConfig

HELP = "time a candidate system against an incumbent; promote, reject or ask for more data"

# a help text that names its own default (taken from the deployment) gets no "(default: ...)" appended
CONFIG_HELP = {
    "blocks": "paired blocks timed before the first decision",
    "requests_per_block": "requests each arm serves per block",
    "request_size": "prompts per request (default: the regime batch; 2 per slot under continuous batching)",
    "max_new_tokens": "new tokens per prompt (default: the deployment's max_new_tokens)",
    "warmup_requests": "untimed warm-up requests per worker",
    "warmup_blocks": "paired blocks run and discarded before timing",
    "order": "arm order within a block on one device",
    "placement": "alternate on one device, side by side on two (auto: by device count)",
    "freeze_idle": "SIGSTOP workers that are not being timed",
    "collect_garbage": "workers collect Python garbage untimed before each timed request, none during it",
    "pin_cpus": "give each worker its own equal set of CPU cores (when there are enough)",
    "level": "two-sided confidence level of the interval",
    "resamples": "bootstrap resamples",
    "seed": "seed of the bootstrap, arm order and prompt draws",
    "min_gain": "gain the lower bound must exceed on top of the noise term",
    "noise_multiplier": "multiple of the stock-vs-stock noise added to min_gain",
    "extra_blocks": "pre-declared budget of extra blocks when undecided",
    "extra_step": "extra blocks added per look",
    "multiplicity": "correction across candidates of one round",
    "noise_blocks": "blocks of the stock-vs-stock noise measurement",
    "gate_prompts": "prompts of the cheap subset the guard gate judges",
    "min_token_ratio": "least share of the incumbent's tokens the candidate must return",
    "startup_timeout_s": "seconds allowed to build and warm a worker",
    "request_timeout_s": "seconds allowed for one request",
    "shared_workers": "time knob-only comparisons in one persistent trusted worker per device",
    "settle_seconds": "at most this long warming a shared worker until its clocks settle",
    "settle_tolerance": "settled: the last 3 warm-up requests' per-token times within this of their median",
}
DERIVED = ("sampled",)  # set from the deployment (its regime samples), not a flag




def add_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ControllerConfig field (but the `DERIVED` ones)."""
    from specpilot.control.config import ControllerConfig

    g = p.add_argument_group("controller settings (ControllerConfig)")
    for f in fields(ControllerConfig):
        if f.name in DERIVED:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        shown = default.value if isinstance(default, enum.Enum) else default
        text = CONFIG_HELP[f.name]
        text = text if "(default:" in text else f"{text} (default: {shown})"
        if isinstance(default, bool):
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif isinstance(default, enum.Enum):
            g.add_argument(flag, choices=[m.value for m in type(default)], default=None, help=text)
        else:
            g.add_argument(flag, type=type(default), default=None, metavar="N" if type(default) is int else "X",
                           help=text)


def config_from_args(args, deployment: Deployment) -> ControllerConfig:
    from specpilot.control.config import ControllerConfig
    from specpilot.control.defaults import default_config

    flags = {f.name: getattr(args, f.name) for f in fields(ControllerConfig)
             if f.name not in DERIVED and getattr(args, f.name) is not None}
    return default_config(deployment, **flags)


def backend_from_args(args, config: ControllerConfig):
    from specpilot.cli.run import worker_devices
    from specpilot.control.backends.base import make_backend

    if args.ray_address:
        return make_backend("ray", address=args.ray_address, placement=config.placement)
    devices = list(worker_devices(args.devices)) if args.devices else None  # each usable here, else `error:`
    return make_backend("local", devices=devices, placement=config.placement)


def register(sub: argparse._SubParsersAction) -> None:
    from specpilot.cli.run import add_wait_flags
    from specpilot.control.arm import DEFAULT_RUNNER
    from specpilot.control.gate import DEFAULT_GATE
    from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE

    p = sub.add_parser(
        "evaluate", help=HELP,
        description="Paired, isolated timing of a candidate against an incumbent, gated by the token-forcing "
                    "guard; the decision and its numbers are stored in the memory. Exit status: 0 promote, "
                    "1 reject, 3 need more data, 2 bad input.")
    p.add_argument("--deployment", help="deployment file or shipped name (default: fixture)")
    p.add_argument("--incumbent", default="stock", help="incumbent system file, 'stock' (default) or 'ar'")
    p.add_argument("--candidate", required=True, help="candidate system file, 'stock' or 'ar'")
    p.add_argument("--candidate-workdir", help="git worktree whose code the candidate's workers import (patches)")
    p.add_argument("--patch", help="file holding the candidate's patch, stored with the entry")
    p.add_argument("--round", default="", help="round label stored with the entry")
    p.add_argument("--memory", help="memory database (default: $SPECPILOT_MEMORY or $SPECPILOT_HOME/memory.sqlite)")
    p.add_argument("--no-record", action="store_true", help="decide without writing the evaluation to the memory")
    p.add_argument("--remeasure-noise", action="store_true", help="measure stock-vs-stock noise again first")
    p.add_argument("--devices", help="comma-separated devices for local workers (default: every visible GPU, else cpu)")
    p.add_argument("--ray-address", help="run worker pairs as Ray actors on this cluster ('auto', host:port)")
    p.add_argument("--gate", default=DEFAULT_GATE, help=f"guard gate as module:attr (default: {DEFAULT_GATE})")
    p.add_argument("--prompt-source", default=DEFAULT_PROMPT_SOURCE,
                   help=f"prompt-source factory as module:attr, called with the deployment "
                        f"(default: {DEFAULT_PROMPT_SOURCE})")
    p.add_argument("--runner", default=DEFAULT_RUNNER,
                   help=f"runner factory as module:attr (default: {DEFAULT_RUNNER})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_wait_flags(p)
    add_config_flags(p)
    p.set_defaults(func=run_evaluate)


def loaded_copies(config: ControllerConfig, candidate_workdir: str | None) -> tuple[int, str]:
    """How many processes hold the deployment's models at once, and which: this one (the guard's
    scorer) and the shared worker a knob-only comparison runs in, or a pair of isolated workers
    for a patched candidate or with shared workers off (`control.backends.local`)."""
    if candidate_workdir or not config.shared_workers:
        return 3, "this process (the guard's scorer) and a pair of isolated workers"
    return 2, "this process (the guard's scorer) and the shared worker"


def run_evaluate(args) -> int:
    from specpilot import env
    from specpilot.config import load_deployment
    from specpilot.cli.run import wait_seconds, worker_devices
    from specpilot.engine.memory_check import check_memory
    from specpilot.errors import ConfigError
    from specpilot.memory.evaluate import evaluate_candidate
    from specpilot.memory.store import Memory

    deployment_file = args.deployment or "fixture"
    deployment = load_deployment(deployment_file)
    config = config_from_args(args, deployment)
    patch = None
    if args.patch:
        path = Path(args.patch)
        if not path.is_file():
            raise ConfigError(f"patch file {args.patch!r} does not exist")
        patch = path.read_text()
    if args.candidate_workdir and not Path(args.candidate_workdir).is_dir():
        raise ConfigError(f"candidate workdir {args.candidate_workdir!r} is not a directory")
    if not args.ray_address:  # Ray workers load on their own hosts
        check_memory(deployment, worker_devices(args.devices)[0], *loaded_copies(config, args.candidate_workdir))
    env.writable_home()  # worker logs and timing locks go there whatever --memory says
    backend = backend_from_args(args, config)
    try:
        with Memory(args.memory) as memory:
            rec = evaluate_candidate(deployment_file, args.incumbent, args.candidate, config=config, backend=backend,
                                     gate=args.gate, prompt_source=args.prompt_source, memory=memory,
                                     runner=args.runner, candidate_workdir=args.candidate_workdir, patch=patch,
                                     round=args.round, remeasure_noise=args.remeasure_noise,
                                     record=not args.no_record, wait_s=wait_seconds(args))
            where = str(memory.path)
    finally:
        backend.close()
    e = rec.evaluation
    if args.json:
        print(json.dumps({"verdict": e.verdict.value, "exit_code": e.verdict.exit_code, "entry_id": rec.entry_id,
                          "memory": where, "deployment": rec.fingerprint.digest, "noise_id": rec.noise_id,
                          "noise_measured": rec.noise_measured, "noise_note": rec.noise_note,
                          "contended": rec.contended, "load": rec.load.to_dict() if rec.load else None,
                          "evaluation": e.to_dict()}, indent=2))
    else:
        print(format_evaluation(e, deployment.name))
        recorded = f"memory entry {rec.entry_id} in {where}" if rec.entry_id else "no (--no-record)"
        if rec.load is not None:
            print(f"  load        {rec.load.describe()}" + (" (not a final verdict)" if rec.contended else ""))
        print(f"  recorded    {recorded}")
    return e.verdict.exit_code


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.2f}%"


def format_evaluation(e, deployment_name: str) -> str:
    """Human-readable lines for one evaluation."""
    d = e.decision
    lines = [f"candidate {e.candidate.name!r} vs incumbent {e.incumbent.name!r} on {deployment_name} "
             f"({e.placement.value}, {e.stage.value})"]
    if e.estimate is not None:
        est = e.estimate
        lines.append(f"  gain        {_pct(est.gain)}  {est.level:.0%} interval [{_pct(est.lower)}, {_pct(est.upper)}]"
                     f" (BCa + t; {est.n} blocks, {est.resamples} resamples)")
        lines.append(f"  bound       {_pct(d.lower_bound)} one-sided at {d.alpha_look:.4f}"
                     f" (look {d.look} of {d.looks}); p = {d.p_value:.3g}")
    if e.noise is not None:
        lines.append(f"  threshold   {_pct(d.threshold)} = min gain + multiplier x noise {e.noise.value * 100:.3f}%")
    if e.gate is not None:
        numbers = format_gate(e.gate.summary)
        lines.append(f"  guard       {'passed' if e.gate.passed else 'FAILED'}" + (f": {numbers}" if numbers else "")
                     + (f" ({e.gate.reason})" if e.gate.reason else ""))
    if e.outputs is not None and e.outputs.runs:
        lines.append(f"  outputs     {e.outputs.divergence_rate:.1%} of {e.outputs.runs} prompt runs differ from the "
                     f"incumbent's; tokens {e.outputs.token_ratio:.3f}x")
    if e.error:
        lines.append(f"  error       {e.error}")
    lines.append(f"  verdict     {e.verdict.value.upper()} ({', '.join(r.value for r in d.reasons)})")
    lines.append(f"  cost        {e.costs.total:.1f} s")
    return "\n".join(lines)


def _num(x, spec: str, scale: float = 1.0) -> str:
    """`x * scale` formatted, or n/a for a missing or NaN number (gate summaries are plain JSON)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x):
        return "n/a"
    return format(x * scale, spec)


def format_gate(summary: dict) -> str:
    """One readable line of a guard gate's numbers (`--json` keeps every one): mismatch counts and
    rates, the rate bound against its margin and the large-margin counts for the token-forcing
    guard; `key=value` of the plain top-level values for any other gate."""
    if summary.get("guard") == "token-forcing" and isinstance(summary.get("candidate"), dict):
        c, s, rate = summary["candidate"], summary.get("stock", {}), summary.get("rate", {})
        base = "stock AR" if summary.get("baseline") == "stock-ar" else summary.get("baseline", "stock")
        side = "upper" if summary.get("rate_test") == "non-inferiority" else "lower"
        return (f"token forcing vs {base} ({summary.get('dtype', '?')} scorer): mismatches candidate "
                f"{c.get('mismatches')}/{c.get('tokens')} = {_num(c.get('rate'), '.3f', 100)}%, "
                f"{base} {s.get('mismatches')}/{s.get('tokens')} = {_num(s.get('rate'), '.3f', 100)}%; "
                f"difference {_num(summary.get('difference'), '+.3f', 100)} pp, "
                f"{side} {_num(rate.get('confidence'), '.0f', 100)}% bound {_num(summary.get('bound'), '+.3f', 100)} "
                f"pp vs margin {_num(summary.get('rate_margin'), '.2f', 100)} pp; "
                f"large-margin mismatches {c.get('large_margin')} vs {s.get('large_margin')}")
    plain = {k: v for k, v in summary.items() if v is None or isinstance(v, (bool, int, float, str))}
    return ", ".join(f"{k}={_num(v, '.4g')}" if isinstance(v, float) else f"{k}={v}" for k, v in plain.items())
