"""Where a continuous-batching round's time goes, per system: serve one closed-loop unit (C slots,
2 requests per slot, the deployment's prompt sets in turn) after a warm-up, then report batch rounds,
milliseconds per round, the device's kernels per round and idle share, and the top operators of a
profiled run (CUDA time on a GPU, CPU time else).

Usage: python scripts/serving_round_profile.py --deployment fixture-x16-batch --concurrency 8 \
           --system scripts/systems/eagle3-d5k4n7.toml --system scripts/systems/eagle3-segment-7.toml [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.prompts import prompt_ids  # noqa: E402
from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.bench.serving import request_pool  # noqa: E402
from specpilot.config import load_deployment, load_system  # noqa: E402
from specpilot.engine.serving import Request, ServingEngine  # noqa: E402
from specpilot.engine.session import Session  # noqa: E402


def gpu_occupancy(prof, rounds: int) -> dict:
    """Kernels of the profiled run on the device: how many a round launches, the time they run and
    the time between them (the device idle: launch gaps inside graphs and host waits)."""
    from torch.autograd import DeviceType

    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not kernels:
        return {}
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    span = max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
    n = max(rounds, 1)
    return {"kernels_per_round": len(kernels) / n, "busy_ms_per_round": busy / 1e3 / n,
            "span_ms_per_round": span / 1e3 / n, "idle_share": 1 - busy / span if span else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16-batch")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--system", action="append", default=[])
    ap.add_argument("--device", default=None)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per system")
    a = ap.parse_args(argv)
    dep = load_deployment(a.deployment)
    session = Session.load(dep, a.device)
    pool = request_pool(prompt_ids(dep, session.tokenizer))  # the serving benchmark's order: sets in turn
    requests = [Request(tuple(p.ids), a.max_new_tokens) for p in pool[: 2 * a.concurrency]]
    cuda = session.device.type == "cuda"
    report = {"deployment": dep.name, "concurrency": a.concurrency, "systems": [],
              "environment": capture(session.device, session.target.dtype)}
    for spec in a.system or ["stock"]:
        system = load_system(spec, dep)
        engine = ServingEngine(session.generator(system), a.concurrency)
        engine.reserve(max(len(r.prompt) for r in requests), a.max_new_tokens)
        engine.run([Request(r.prompt, 32) for r in requests[: a.concurrency]])  # warm-up, capture
        runs = []
        for _ in range(a.runs):
            res = engine.run(requests)
            runs.append((res.seconds, res.rounds, sum(len(r.output) for r in res.requests), res.extra))
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=acts) as prof:
            engine.run(requests)
        key = "cuda_time_total" if cuda else "cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=a.top)
        best = min(runs)
        row = {"system": system.name, "seconds": [r[0] for r in runs], "rounds": best[1],
               "tokens": best[2], "ms_per_round": 1e3 * best[0] / max(best[1], 1), "extra": best[3]}
        if cuda:
            row["gpu"] = gpu_occupancy(prof, best[1])
            table += "\n" + prof.key_averages().table(sort_by="count", row_limit=a.top)
        report["systems"].append({**row, "profile": table})
        print(json.dumps(row))
        print(table)
        sys.stdout.flush()
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "serving_round_profile.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
