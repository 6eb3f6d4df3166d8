"""Stock-vs-stock noise and the cost of one paired evaluation, on the GPU, with the controller's procedure.

    python scripts/controller_noise.py --deployment fixture --out results/controller_noise --blocks 30

For each placement it measures (1) the noise floor exactly as `specpilot evaluate` does — stock
against a second copy of stock, `--blocks` paired blocks, each arm in its own worker process,
timed from outside — and (2) one full paired evaluation of stock against a copy of stock at the
default block count (gate generation included, guard scoring excluded: the gate here passes
everything), whose wall time is what one evaluation costs. One GPU: arms alternate. Two or more
GPUs: side by side, swapping GPUs within every block (`--placement both` runs both modes).
Every worker process gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (NVLink multicast stays off).

Writes OUT/controller_noise.json (all numbers) and OUT/controller_noise.md (a table), both with
date, GPU, commit and versions. Fails with one clear line if the runner factory (default: the
engine's `SessionRunner`) or the prompt source cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE
    from specpilot.control.arm import DEFAULT_RUNNER

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment", default="fixture", help="deployment file or shipped name (default: fixture)")
    p.add_argument("--out", required=True, help="output folder for controller_noise.json / .md")
    p.add_argument("--blocks", type=int, default=30, help="paired blocks of the noise measurement (default 30)")
    p.add_argument("--requests-per-block", type=int, help="requests per arm per block (default: the controller's)")
    p.add_argument("--max-new-tokens", type=int, help="new tokens per prompt (default: the deployment's)")
    p.add_argument("--placement", choices=["auto", "alternate", "side-by-side", "both"], default="auto",
                   help="auto: side by side with >= 2 GPUs, else alternate; both: measure each mode")
    p.add_argument("--devices", help="comma-separated devices (default: every visible GPU, else cpu)")
    p.add_argument("--no-evaluation", action="store_true", help="skip the timed full paired evaluation")
    p.add_argument("--runner", default=DEFAULT_RUNNER, help=f"runner factory module:attr (default {DEFAULT_RUNNER})")
    p.add_argument("--workdir", help="folder put first on sys.path to import the runner (workers too)")
    p.add_argument("--prompt-source", default=DEFAULT_PROMPT_SOURCE, help="prompt-source factory module:attr")
    p.add_argument("--seed", type=int, default=0, help="seed of prompt draws, arm order and bootstrap")
    p.add_argument("--resamples", type=int, default=9999, help="bootstrap resamples")
    p.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS),
                   help="procedures to measure the noise under (default: the controller's own); "
                        "the first one also gets the timed full evaluation")
    p.add_argument("--in-process", action="store_true",
                   help="also time stock against itself inside this process (no workers, CUDA-synchronized): "
                        "the engine's own run-to-run noise, for comparison")
    return p.parse_args(argv)


# Procedure variants for diagnosing noise: ControllerConfig changes on top of the default procedure.
VARIANTS = {
    "default": {},
    "gc-during-requests": {"collect_garbage": False},  # Python's GC may run inside timed requests
    "no-freeze": {"freeze_idle": False},  # the idle arm is not SIGSTOPped
}


def placements(choice: str, n_devices: int):
    from specpilot.control.config import Placement

    if choice == "both":
        if n_devices < 2:
            raise SystemExit("error: --placement both needs two devices")
        return [Placement.ALTERNATE, Placement.SIDE_BY_SIDE]
    if choice == "auto":
        return [Placement.SIDE_BY_SIDE if n_devices >= 2 else Placement.ALTERNATE]
    return [Placement(choice)]


def timing_summary(timings: list[dict]) -> dict:
    """Spread of per-request times (controller clock and the workers' own reports) over the blocks."""
    import statistics

    def flat(key):
        return [t for block in timings for row in block[key] for t in row]

    out = {}
    for arm in ("incumbent", "candidate"):
        ctl, rep = flat(arm), flat(f"{arm}_reported")
        over = [c - r for c, r in zip(ctl, rep) if r is not None]
        out[arm] = {
            "requests": len(ctl),
            "median_s": statistics.median(ctl) if ctl else None,
            "min_s": min(ctl) if ctl else None,
            "max_s": max(ctl) if ctl else None,
            "round_trip_overhead_median_ms": statistics.median(over) * 1e3 if over else None,
            "round_trip_overhead_max_ms": max(over) * 1e3 if over else None,
        }
    # Same prompt, both arms: the relative difference of each request pair is the noise per request.
    pairs = [(a, b) for block in timings for ra, rb in zip(block["incumbent"], block["candidate"])
             for a, b in zip(ra, rb)]
    diffs = [abs(a / b - 1) for a, b in pairs]
    out["pair_abs_rel_diff"] = {"median": statistics.median(diffs), "max": max(diffs)} if diffs else None
    return out


def in_process_noise(args, deployment, config, source, stock) -> dict:
    """Stock against itself in this process: one runner, both 'arms', CUDA-synchronized wall time."""
    import gc
    import time

    import torch

    from specpilot.control.config import Stage
    from specpilot.control.controller import STREAMS
    from specpilot.control.prompts import draw
    from specpilot.control.arm import load_object
    from specpilot.control.stats import GainEstimate

    runner = load_object(args.runner, "runner factory")(stock.placed("cuda:0" if torch.cuda.is_available() else "cpu"))
    stream = STREAMS[Stage.NOISE]  # the controller's own prompt draws for the noise measurement
    warm = draw(source, config.warmup_requests * config.request_size, config.seed, f"{stream}-warmup-requests", 0)
    runner.warm(stock.system, [list(p) for p in warm], config.max_new_tokens)
    gc.collect()
    gc.freeze()

    def timed(prompts) -> float:
        gc.collect()
        gc.disable()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.run(stock.system, prompts, config.max_new_tokens)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter() - t0
        gc.enable()
        return t

    ratios, times = [], []
    for b in range(config.noise_blocks):
        prompts = draw(source, config.block_prompts, config.seed, stream, b)
        reqs = [[list(p) for p in prompts[i : i + config.request_size]]
                for i in range(0, len(prompts), config.request_size)]
        a, c = [], []
        for r, req in enumerate(reqs):
            order = (a, c) if (b * len(reqs) + r) % 2 == 0 else (c, a)
            for arm in order:
                arm.append(timed(req))
        times.append({"a": a, "b": c})
        ratios.append(math.log(sum(a) / sum(c)))
    est = GainEstimate(tuple(ratios), config.level, config.resamples, config.seed)
    runner = None  # noqa: F841 - free the model before the caller goes on
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"aa_gain": est.gain, "aa_lower": est.lower, "aa_upper": est.upper,
            "noise": max(abs(est.lower), abs(est.upper)), "block_std": est.block_std, "blocks": est.n,
            "log_ratios": list(est.log_ratios), "request_seconds": times}


def measure_mode(args, placement, devices, config, source, stock, gpu_names, variant="default",
                 evaluation=True) -> dict:
    from specpilot.control.backends.local import LocalBackend
    from specpilot.control.controller import Controller
    from specpilot.control.gate import ALWAYS_PASS
    from specpilot.control.stats import NoiseFloor

    per = 2 if placement.value == "side-by-side" else 1
    backend = LocalBackend(devices[:per], placement)
    controller = Controller(config, backend, ALWAYS_PASS, source, args.deployment)
    aa = controller.stock_vs_stock(stock)
    noise = NoiseFloor(aa.estimate, controller.procedure)
    est = aa.estimate
    per_block = aa.costs.timed_blocks / est.n
    mode = {
        "variant": variant,
        "variant_changes": VARIANTS[variant],
        "placement": placement.value,
        "devices": list(devices[:per]),
        "gpu": gpu_names[:per],
        "noise": {
            "value": noise.value,
            "definition": "max(|L|, |U|) of the 95% interval (hull of BCa and t) of the stock-vs-stock gain",
            "aa_gain": est.gain, "aa_lower": est.lower, "aa_upper": est.upper, "half_width": est.half_width,
            "block_std": est.block_std, "standard_error": est.standard_error, "blocks": est.n,
            "log_ratios": list(est.log_ratios),
        },
        "request_timing": timing_summary(list(aa.timings)),
        "timings": list(aa.timings),
        "threshold": config.min_gain + config.noise_multiplier * noise.value,
        "noise_measurement_costs": aa.costs.to_dict(),
        "seconds_per_block": per_block,
        "tokens_per_block": aa.outputs.incumbent_tokens / est.n if aa.outputs else None,
        "projected_evaluation_seconds": {
            "first_look": aa.costs.open + aa.costs.warmup_blocks + config.blocks * per_block,
            "full_budget": aa.costs.open + aa.costs.warmup_blocks + config.max_blocks * per_block,
        },
    }
    if evaluation and not args.no_evaluation:
        e = controller.evaluate(stock, replace(stock, system={**stock.system, "name": "stock-copy"}), noise)
        mode["evaluation"] = {"verdict": e.verdict.value, "reasons": [r.value for r in e.decision.reasons],
                              "gain": e.estimate.gain if e.estimate else None,
                              "lower": e.estimate.lower if e.estimate else None,
                              "upper": e.estimate.upper if e.estimate else None,
                              "costs": e.costs.to_dict()}
    return mode


def render_md(result: dict) -> str:
    cfg = result["config"]
    lines = [
        "# Controller noise: stock vs stock",
        "",
        f"- date: {result['date']}",
        f"- commit: {result['commit']}",
        f"- GPU: {', '.join(result['gpus'])}",
        f"- deployment: {result['deployment']}; torch {result['provenance']['versions']['torch']}, "
        f"CUDA {result['provenance']['cuda']}, driver {result['provenance']['driver']}",
        f"- procedure: {cfg['requests_per_block']} requests x {cfg['request_size']} prompt(s) per arm per block, "
        f"{cfg['max_new_tokens']} new tokens, order {cfg['order']}",
        "",
        "| procedure | placement | blocks | A/A gain | 95% interval | noise | per-block sd | threshold | s / block "
        "| one evaluation (s) | first look / full budget (s, projected) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in result["modes"]:
        n = m["noise"]
        ev = m.get("evaluation")
        ev_text = f"{ev['costs']['total']:.1f} ({ev['verdict']})" if ev else "n/a"
        proj = m["projected_evaluation_seconds"]
        lines.append(
            f"| {m['variant']} | {m['placement']} | {n['blocks']} | {n['aa_gain'] * 100:+.3f}% | [{n['aa_lower'] * 100:+.3f}%, "
            f"{n['aa_upper'] * 100:+.3f}%] | {n['value'] * 100:.3f}% | {n['block_std'] * 100:.3f}% | "
            f"{m['threshold'] * 100:.2f}% | {m['seconds_per_block']:.2f} | {ev_text} | "
            f"{proj['first_look']:.0f} / {proj['full_budget']:.0f} |"
        )
    lines += ["", "noise = max(|L|, |U|) of the stock-vs-stock gain's 95% interval (hull of BCa and t); "
              "threshold = 1% + 2 x noise (the promotion rule). Procedures: "
              + "; ".join(f"`{k}` = default with {v or 'no change'}" for k, v in VARIANTS.items()
                          if any(m["variant"] == k for m in result["modes"])) + ".", ""]
    lines += ["Request times (controller clock; round trip = controller time minus the worker's own report):", "",
              "| procedure | placement | arm | requests | median s | min s | max s | round trip median / max ms "
              "| same-prompt pair abs diff median / max |", "|---|---|---|---|---|---|---|---|---|"]
    for m in result["modes"]:
        rt = m["request_timing"]
        pair = rt["pair_abs_rel_diff"]
        for arm in ("incumbent", "candidate"):
            a = rt[arm]
            over = (f"{a['round_trip_overhead_median_ms']:.2f} / {a['round_trip_overhead_max_ms']:.2f}"
                    if a["round_trip_overhead_median_ms"] is not None else "n/a")
            lines.append(f"| {m['variant']} | {m['placement']} | {arm} | {a['requests']} | {a['median_s']:.4f} | "
                         f"{a['min_s']:.4f} | {a['max_s']:.4f} | {over} | "
                         f"{pair['median'] * 100:.2f}% / {pair['max'] * 100:.2f}% |")
    ip = result.get("in_process")
    if ip:
        lines += ["", f"In-process (one runner, no workers, CUDA-synchronized, same prompts and order): A/A gain "
                  f"{ip['aa_gain'] * 100:+.3f}% [{ip['aa_lower'] * 100:+.3f}%, {ip['aa_upper'] * 100:+.3f}%], "
                  f"noise {ip['noise'] * 100:.3f}%, per-block sd {ip['block_std'] * 100:.3f}% over {ip['blocks']} blocks.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    from specpilot import env

    os.environ.update(env.WORKER_MULTICAST_OFF)  # workers get it anyway; the controller too
    args = parse_args(argv)
    if args.workdir:
        sys.path.insert(0, os.path.abspath(args.workdir))
    from specpilot.bench.provenance import capture
    from specpilot.config import load_deployment
    from specpilot.control.backends.local import device_name, visible_devices
    from specpilot.control.defaults import default_config, runner_spec, source_commit
    from specpilot.control.prompts import load_prompt_source
    from specpilot.control.arm import load_object
    from specpilot.errors import SpecPilotError

    try:
        load_object(args.runner, "runner factory")
        deployment = load_deployment(args.deployment)
        source = load_prompt_source(deployment, args.prompt_source)
        changes = {"noise_blocks": args.blocks, "seed": args.seed, "resamples": args.resamples}
        if args.requests_per_block:
            changes["requests_per_block"] = args.requests_per_block
        if args.max_new_tokens:
            changes["max_new_tokens"] = args.max_new_tokens
        config = default_config(deployment, **changes)
    except SpecPilotError as err:  # e.g. --blocks 3: "blocks and noise_blocks must be >= 5 ..."
        print(f"error: {err}", file=sys.stderr)
        return 2
    devices = [d.strip() for d in args.devices.split(",")] if args.devices else visible_devices()
    gpu_names = [device_name(d) for d in devices]
    stock = runner_spec(args.deployment, deployment.stock, args.runner, args.workdir)
    modes = []
    for p in placements(args.placement, len(devices)):
        for i, variant in enumerate(args.variants):
            print(f"measuring: {p.value}, procedure {variant}", flush=True)
            modes.append(measure_mode(args, p, devices, replace(config, **VARIANTS[variant]), source, stock,
                                      gpu_names, variant, evaluation=i == 0))
    in_process = in_process_noise(args, deployment, config, source, stock) if args.in_process else None
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "gpus": gpu_names,
        "device_count": len(devices),
        "provenance": capture(devices[0]),
        "deployment": deployment.name,
        "runner": args.runner,
        "config": config.to_dict(),
        "modes": modes,
        "in_process": in_process,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "controller_noise.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "controller_noise.md").write_text(render_md(result))
    print(render_md(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
