"""Where timing variation comes from, and what the controller's default procedure measures, on one GPU.

    python scripts/timing_probe.py --deployment fixture-x16 --out results/controller

Part 1, the probe (one process, the deployment's stock system, fixed-length requests with EOS
ignored, time per token of decode by CUDA events and by the wall clock):
  ramp     after `--idle-s` seconds of idle, consecutive requests: the GPU clock ramp-up
  jitter   at steady state, request-to-request spread (CV), GC on and off, and the host's share
           (wall minus GPU span per request)
  drift    a long run of requests: the slope of time per token against request index
Part 2, the controller (the loop's GPU timing preset, the backend's persistent shared worker,
the token-forcing gate): the stock-vs-stock noise floor with its per-block spread, then knob
candidates against stock, each with its wall cost (guard included) and decision.

Writes OUT/timing_probe.json (every number) and OUT/timing_probe.md, with date, GPU, commit.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

CANDIDATES = {  # knob-only candidates (system knobs over stock)
    "tree-d7-k8-n96": {"depth": 7, "topk": 8, "tree_budget": 96},
    "ngram": {"drafter": "ngram"},
    "tree-d9-k8-n128": {"depth": 9, "topk": 8, "tree_budget": 128},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment", default="fixture-x16", help="deployment file or shipped name")
    p.add_argument("--out", required=True, help="output folder for timing_probe.json / .md")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per probe request (EOS ignored)")
    p.add_argument("--idle-s", type=float, default=10.0, help="idle before the ramp measurement")
    p.add_argument("--ramp", type=int, default=12, help="requests timed after idle")
    p.add_argument("--jitter", type=int, default=16, help="requests per steady-state jitter series")
    p.add_argument("--drift", type=int, default=40, help="requests of the drift series")
    p.add_argument("--candidates", nargs="*", default=list(CANDIDATES), choices=sorted(CANDIDATES))
    p.add_argument("--skip-probe", action="store_true", help="only part 2")
    p.add_argument("--smoke", action="store_true", help="tiny sizes everywhere: checks the script on a CPU")
    return p.parse_args(argv)


def cv(xs):
    return statistics.pstdev(xs) / statistics.mean(xs) if len(xs) > 1 else float("nan")


def probe(args, deployment) -> dict:
    import torch

    from specpilot.bench.prompts import prompt_ids
    from specpilot.engine.session import Session

    session = Session.load(deployment)
    generator = session.generator(deployment.stock)
    prompt = list(prompt_ids(deployment, session.tokenizer, deployment.sets[:1], 1)[0].ids)

    def one(gc_off=True):
        if gc_off:
            gc.collect()
            gc.disable()
        try:
            r = generator.generate([prompt], args.tokens, stop_at_eos=False)
        finally:
            gc.enable()
        n = sum(len(o) for o in r.outputs)
        return {"gpu_per_token_ms": 1e3 * r.decode_seconds / n,
                "wall_per_token_ms": 1e3 * (r.seconds - r.prefill_seconds) / n,
                "host_ms": 1e3 * (r.seconds - r.gpu_seconds) if r.gpu_seconds == r.gpu_seconds else None}

    for _ in range(3):  # compile, capture, first touches
        one()
    out = {}
    time.sleep(args.idle_s)
    ramp = [one() for _ in range(args.ramp)]
    out["ramp"] = {"idle_s": args.idle_s, "requests": ramp,
                   "first_over_last_quarter": ramp[0]["gpu_per_token_ms"]
                   / statistics.mean(r["gpu_per_token_ms"] for r in ramp[-max(1, len(ramp) // 4):])}
    gc_on = [one(gc_off=False) for _ in range(args.jitter)]
    gc_off = [one() for _ in range(args.jitter)]
    out["jitter"] = {
        "gc_off_cv_gpu": cv([r["gpu_per_token_ms"] for r in gc_off]),
        "gc_off_cv_wall": cv([r["wall_per_token_ms"] for r in gc_off]),
        "gc_on_cv_gpu": cv([r["gpu_per_token_ms"] for r in gc_on]),
        "host_ms_median": statistics.median(r["host_ms"] for r in gc_off if r["host_ms"] is not None)
        if torch.cuda.is_available() else None,
        "gc_off": gc_off, "gc_on": gc_on,
    }
    drift = [one()["gpu_per_token_ms"] for _ in range(args.drift)]
    n = len(drift)
    mx, my = (n - 1) / 2, statistics.mean(drift)
    slope = sum((i - mx) * (y - my) for i, y in enumerate(drift)) / sum((i - mx) ** 2 for i in range(n))
    pairs = [math.log(drift[i] / drift[i + 1]) for i in range(0, n - 1, 2)]
    out["drift"] = {"per_token_ms": drift, "slope_per_request_rel": slope / my,
                    "over_series_rel": slope * (n - 1) / my, "cv": cv(drift),
                    "adjacent_pair_log_ratio_std": statistics.pstdev(pairs)}
    del generator, session
    gc.collect()
    torch.cuda.empty_cache()
    return out


def controller(args, deployment) -> dict:
    from specpilot.control.backends.local import LocalBackend
    from specpilot.control.controller import Controller
    from specpilot.control.defaults import runner_spec
    from specpilot.control.gate import load_gate
    from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE, load_prompt_source
    from specpilot.loop.config import controller_config, for_device
    from specpilot.loop.runner import LOOP_RUNNER

    config = controller_config(for_device("cuda"), deployment)
    if args.smoke:
        config = replace(config, blocks=5, noise_blocks=5, requests_per_block=1, max_new_tokens=8, extra_blocks=0,
                         gate_prompts=1, resamples=199, settle_seconds=1.0, warmup_requests=1)
    backend = LocalBackend(placement=config.placement)
    out = {"config": config.to_dict(), "candidates": []}
    try:
        ctl = Controller(config, backend, load_gate(), load_prompt_source(deployment, DEFAULT_PROMPT_SOURCE),
                         args.deployment)
        stock = runner_spec(args.deployment, deployment.stock, LOOP_RUNNER)
        t = time.monotonic()
        aa = ctl.stock_vs_stock(stock)
        out["noise"] = {"value": max(abs(aa.estimate.lower), abs(aa.estimate.upper)), "gain": aa.estimate.gain,
                        "interval": list(aa.estimate.interval), "block_std": aa.estimate.block_std,
                        "blocks": aa.estimate.n, "log_ratios": list(aa.estimate.log_ratios),
                        "wall_s": time.monotonic() - t, "costs": aa.costs.to_dict()}
        out["settling"] = {str(k): v.to_dict() for k, v in backend.shared.settling.items()}
        from specpilot.control.stats import NoiseFloor

        noise = NoiseFloor(aa.estimate, ctl.procedure)
        for name in args.candidates:
            system = deployment.stock.with_knobs(CANDIDATES[name], name)
            t = time.monotonic()
            e = ctl.evaluate(stock, runner_spec(args.deployment, system, LOOP_RUNNER), noise)
            row = {"name": name, "knobs": CANDIDATES[name], "wall_s": time.monotonic() - t,
                   "verdict": e.verdict.value, "reasons": [r.value for r in e.decision.reasons],
                   "threshold": e.decision.threshold, "costs": e.costs.to_dict(), "error": e.error}
            if e.estimate is not None:
                row.update(gain=e.estimate.gain, interval=list(e.estimate.interval), blocks=e.estimate.n,
                           block_std=e.estimate.block_std)
            out["candidates"].append(row)
            print(json.dumps({k: row.get(k) for k in ("name", "verdict", "gain", "interval", "wall_s")}), flush=True)
    finally:
        backend.close()
    walls = [c["wall_s"] for c in out["candidates"]]
    out["candidate_wall_s_median"] = statistics.median(walls) if walls else None
    return out


def _num(v, spec: str) -> str:
    return "n/a (no GPU)" if v is None else format(v, spec)


def render(result: dict) -> str:
    lines = [f"# Timing probe: {result['deployment']} ({result['device']}, {result['date']}, commit {result['commit']})", ""]
    p = result.get("probe")
    if p:
        lines += ["## Probe (one process, stock, EOS ignored, time per token of decode)", "",
                  "| source | measure | value |", "|---|---|---|",
                  f"| clock ramp after {p['ramp']['idle_s']:.0f} s idle | first request / settled | "
                  f"{p['ramp']['first_over_last_quarter']:.4f} |",
                  f"| request jitter, GC off | CV of GPU time per token | {100 * p['jitter']['gc_off_cv_gpu']:.3f}% |",
                  f"| request jitter, GC off | CV of wall time per token | {100 * p['jitter']['gc_off_cv_wall']:.3f}% |",
                  f"| request jitter, GC on | CV of GPU time per token | {100 * p['jitter']['gc_on_cv_gpu']:.3f}% |",
                  f"| host outside the GPU span | median ms per request | {_num(p['jitter']['host_ms_median'], '.3f')} |",
                  f"| drift over {len(p['drift']['per_token_ms'])} requests | relative change (linear fit) | "
                  f"{100 * p['drift']['over_series_rel']:+.3f}% |",
                  f"| adjacent requests | std of log ratio | {100 * p['drift']['adjacent_pair_log_ratio_std']:.3f}% |", ""]
    c = result.get("controller")
    if c and "noise" in c:
        n = c["noise"]
        lo, hi = n["interval"]
        lines += ["## Controller (loop GPU preset, shared worker, token-forcing gate)", "",
                  f"Stock vs stock, {n['blocks']} blocks: gain {100 * n['gain']:+.3f}% [{100 * lo:+.3f}%, {100 * hi:+.3f}%], "
                  f"**noise floor {100 * n['value']:.3f}%**, per-block spread (std of block log ratios) "
                  f"{100 * n['block_std']:.3f}%, {n['wall_s']:.1f} s.", "",
                  "| candidate | decision | gain [95% interval] | blocks | wall s (guard included) |", "|---|---|---|---|---|"]
        for r in c["candidates"]:
            gain = (f"{100 * r['gain']:+.2f}% [{100 * r['interval'][0]:+.2f}%, {100 * r['interval'][1]:+.2f}%]"
                    if "gain" in r else "-")
            lines.append(f"| {r['name']} | {r['verdict']} ({', '.join(r['reasons'])}) | {gain} | {r.get('blocks', 0)} | "
                         f"{r['wall_s']:.1f} |")
        if c.get("candidate_wall_s_median") is not None:
            lines += ["", f"Median candidate cost: {c['candidate_wall_s_median']:.1f} s."]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    from specpilot.bench.provenance import git_state

    state = git_state()
    return (state.get("git_commit") or "") + ("+dirty" if state.get("git_dirty") else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.tokens, args.idle_s, args.ramp, args.jitter, args.drift = 8, 0.0, 2, 2, 4
    import torch

    from specpilot.config import load_deployment

    deployment = load_deployment(args.deployment)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"script": "scripts/timing_probe.py", "deployment": args.deployment,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "commit": _commit(), "torch": torch.__version__, "args": vars(args)}

    def write():
        (out_dir / "timing_probe.json").write_text(json.dumps(result, indent=1) + "\n")
        (out_dir / "timing_probe.md").write_text(render(result))

    if not args.skip_probe:
        result["probe"] = probe(args, deployment)
        write()
        print(render(result), flush=True)
    result["controller"] = controller(args, deployment)
    write()
    print(render(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
