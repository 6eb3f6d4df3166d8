"""Where the stock-vs-stock noise of a continuous deployment's timed blocks comes from.

Times the loop's procedure in one process, without workers: blocks of `--requests` requests of
`regime.batch` prompts (drawn as the controller draws them), each served by continuous batching
with EOS ignored, the two arms - both stock, one generator - in ABBA order. Per variant it prints
the block log-ratio spread and the A/A noise floor (`control.stats.NoiseFloor`), and per request
the wall seconds of its first and second run and the prefill share (admission to the last row's
first token):

* `per-request`: each request gets the workspace its own longest prompt needs (the runner today);
* `one-pool`: every request is served in one workspace reserved for the longest prompt of the
  deployment's sets (a server's fixed KV pool);
* `one-pool-2x`: as `one-pool`, with twice `--max-new-tokens` (a smaller prefill share).

Usage: python scripts/serving_timing_noise.py [--deployment fixture-x16-batch] [--blocks 12]
           [--requests 2] [--max-new-tokens 128] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.prompts import controller_prompt_source, prompt_ids  # noqa: E402
from specpilot.config import load_deployment, load_system  # noqa: E402
from specpilot.control.stats import GainEstimate, NoiseFloor  # noqa: E402
from specpilot.engine.serving import Request, ServingEngine  # noqa: E402
from specpilot.engine.session import Session  # noqa: E402


def serve(engine: ServingEngine, prompts, max_new: int, cuda: bool) -> dict:
    """One timed request: wall seconds of the serving run and its prefill part."""
    gc.collect()
    gc.disable()
    try:
        res = engine.run([Request(tuple(p), max_new) for p in prompts], stop_at_eos=False)
    finally:
        gc.enable()
    prefill = max(r.first_token - r.admitted for r in res.requests)
    return {"wall": res.seconds, "prefill": prefill, "rounds": res.rounds,
            "capacity": list(engine.generator.workspaces)[-1][1]}  # the workspace just used (LRU order)


def variant(name: str, generator, batch: int, source, longest: int, a) -> dict:
    cuda = generator.target.device.type == "cuda"
    engine = ServingEngine(generator, batch)
    max_new = 2 * a.max_new_tokens if name == "one-pool-2x" else a.max_new_tokens
    if name.startswith("one-pool"):
        engine.reserve(longest, max_new)
    for seed in range(3):  # warm-up on prompts of their own
        serve(engine, source(batch, 10_000 + seed), max_new, cuda)
    logs, rows = [], []
    for block in range(a.blocks):
        t = {"A": 0.0, "B": 0.0}
        for r in range(a.requests):
            prompts = source(batch, 1000 * block + r)
            order = ("A", "B") if (block + r) % 2 == 0 else ("B", "A")  # ABBA
            runs = []
            for arm in order:
                x = serve(engine, prompts, max_new, cuda)
                t[arm] += x["wall"]
                runs.append(x)
            rows.append({"block": block, "longest": max(len(p) for p in prompts), "first": runs[0], "second": runs[1]})
        logs.append(math.log(t["A"] / t["B"]))
    est = GainEstimate(tuple(logs))
    firsts = [math.log(r["first"]["wall"] / r["second"]["wall"]) for r in rows]
    return {
        "variant": name, "max_new_tokens": max_new, "noise_floor": NoiseFloor(est).value, "block_std": statistics.stdev(logs),
        "first_over_second_mean": statistics.mean(firsts), "first_over_second_std": statistics.stdev(firsts),
        "prefill_share": statistics.mean(r["first"]["prefill"] / r["first"]["wall"] for r in rows),
        "log_ratios": logs, "requests": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16-batch")
    ap.add_argument("--system", default="stock")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--variant", action="append", choices=("per-request", "one-pool", "one-pool-2x"), default=[])
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    dep = load_deployment(a.deployment)
    session = Session.load(dep, a.device)
    source = controller_prompt_source(dep)
    longest = max(len(p.ids) for p in prompt_ids(dep, session.tokenizer))
    batch = dep.regime.batch
    from datetime import datetime, timezone

    from specpilot.bench.provenance import capture

    report = {"created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "provenance": capture(session.device, session.target.dtype),
              "deployment": dep.name, "system": a.system, "blocks": a.blocks, "requests": a.requests,
              "batch": batch, "max_new_tokens": a.max_new_tokens, "longest_prompt": longest, "variants": []}
    for name in a.variant or ["per-request", "one-pool"]:
        system = load_system(a.system, dep)
        generator = session.generator(system)
        start = time.perf_counter()
        v = variant(name, generator, batch, source, longest, a)
        v["seconds"] = time.perf_counter() - start
        report["variants"].append(v)
        print(f"{name:12s} noise floor {100 * v['noise_floor']:.2f}%  block std {100 * v['block_std']:.2f}%  "
              f"first/second run {100 * v['first_over_second_mean']:+.2f}% (std {100 * v['first_over_second_std']:.2f}%)  "
              f"prefill share {100 * v['prefill_share']:.1f}%  ({v['seconds']:.0f} s)",
              flush=True)
        for r in v["requests"]:
            f, s = r["first"], r["second"]
            print(f"  block {r['block']:2d} longest {r['longest']:4d} cap {f['capacity']:5d} "
                  f"first {f['wall']:.4f} second {s['wall']:.4f} s  prefill {f['prefill']:.4f}/{s['prefill']:.4f}  "
                  f"rounds {f['rounds']}/{s['rounds']}")
        session.forget(system.fingerprint())  # the next variant starts without this one's workspaces
        if a.out:  # after every variant, so a cut-off run keeps what it measured
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "serving_timing_noise.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
