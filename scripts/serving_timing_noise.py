"""Where the stock-vs-stock noise of a continuous deployment's timed blocks comes from.

Times the loop's procedure in one process, without workers: blocks of `--requests` requests of
`control.defaults.request_size` prompts (2 per slot; drawn as the controller draws them), each served by continuous batching
with EOS ignored, the two arms - both stock, one generator - in ABBA order. Per variant it prints
the block log-ratio spread and the A/A noise floor (`control.stats.NoiseFloor`), and per request
the wall seconds of its first and second run and the prefill share (admission to the last row's
first token):

* `per-request`: each request gets the workspace its own longest prompt needs (the runner today);
* `one-pool`: every request is served in one workspace reserved for the longest prompt of the
  deployment's sets (a server's fixed KV pool);
* `one-pool-2x`: as `one-pool`, with twice `--max-new-tokens` (a smaller prefill share).

With `--candidate FILE` the second arm (B) is that system instead of stock (A/B: the spread of a
real gain across blocks, not noise). Every variant also computes each block's statistic from the
saturated stretches of its requests alone (`ServingResult.saturated_*`: while a prompt waited for
a slot, the ramp-down of a request's last prompts left out), per token, beside the whole request's:
whether that statistic's blocks spread less is what decides if the controller should time it.

Usage: python scripts/serving_timing_noise.py [--deployment fixture-x16-batch] [--blocks 12]
           [--requests 2] [--max-new-tokens 128] [--candidate FILE] [--out DIR]
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
from specpilot.control.defaults import request_size  # noqa: E402
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
    return {"wall": res.seconds, "tokens": res.tokens, "prefill": prefill, "rounds": res.rounds,
            "saturated_seconds": res.saturated_seconds, "saturated_tokens": res.saturated_tokens,
            "capacity": list(engine.generator.workspaces)[-1][1]}  # the workspace just used (LRU order)


def statistic(logs: list[float]) -> dict:
    """Gain, interval, spread and (A/A) noise floor of one statistic's block log-ratios."""
    est = GainEstimate(tuple(logs))
    low, high = est.interval
    return {"gain": est.gain, "low": low, "high": high, "block_std": statistics.stdev(logs),
            "noise_floor": NoiseFloor(est).value, "log_ratios": logs}


def variant(name: str, generators: dict, batch: int, size: int, source, longest: int, a) -> dict:
    cuda = generators["A"].target.device.type == "cuda"
    engines = {arm: ServingEngine(g, batch) for arm, g in generators.items()}
    max_new = 2 * a.max_new_tokens if name == "one-pool-2x" else a.max_new_tokens
    for engine in engines.values():
        if name.startswith("one-pool"):
            engine.reserve(longest, max_new)
        for seed in range(3):  # warm-up on prompts of their own
            serve(engine, source(size, 10_000 + seed), max_new, cuda)
    whole, saturated, rows = [], [], []
    for block in range(a.blocks):
        t = {arm: {"wall": 0.0, "tokens": 0, "saturated_seconds": 0.0, "saturated_tokens": 0} for arm in "AB"}
        for r in range(a.requests):
            prompts = source(size, 1000 * block + r)
            order = ("A", "B") if (block + r) % 2 == 0 else ("B", "A")  # ABBA
            runs = []
            for arm in order:
                x = serve(engines[arm], prompts, max_new, cuda)
                for k in t[arm]:
                    t[arm][k] += x[k]
                runs.append(dict(x, arm=arm))
            rows.append({"block": block, "longest": max(len(p) for p in prompts), "first": runs[0], "second": runs[1]})
        A, B = t["A"], t["B"]  # time per token, A over B: B's gain
        whole.append(math.log((A["wall"] / A["tokens"]) / (B["wall"] / B["tokens"])))
        if min(A["saturated_tokens"], B["saturated_tokens"]) > 0:
            saturated.append(math.log((A["saturated_seconds"] / A["saturated_tokens"])
                                      / (B["saturated_seconds"] / B["saturated_tokens"])))
    firsts = [math.log(r["first"]["wall"] / r["second"]["wall"]) for r in rows]
    out = {
        "variant": name, "max_new_tokens": max_new, **statistic(whole),
        "saturated": statistic(saturated) if len(saturated) == len(whole) else None,
        "saturated_share": statistics.mean(r["first"]["saturated_seconds"] / r["first"]["wall"] for r in rows),
        "first_over_second_mean": statistics.mean(firsts), "first_over_second_std": statistics.stdev(firsts),
        "prefill_share": statistics.mean(r["first"]["prefill"] / r["first"]["wall"] for r in rows),
        "requests": rows,
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16-batch")
    ap.add_argument("--system", default="stock")
    ap.add_argument("--candidate", default=None, help="system of arm B (default: --system again, A/A)")
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
              "deployment": dep.name, "system": a.system, "candidate": a.candidate or a.system,
              "blocks": a.blocks, "requests": a.requests,
              "batch": batch, "request_size": request_size(dep), "max_new_tokens": a.max_new_tokens, "longest_prompt": longest, "variants": []}
    for name in a.variant or ["per-request", "one-pool"]:
        systems = {"A": load_system(a.system, dep), "B": load_system(a.candidate or a.system, dep)}
        generators = {arm: session.generator(s) for arm, s in systems.items()}
        start = time.perf_counter()
        v = variant(name, generators, batch, request_size(dep), source, longest, a)
        v["seconds"] = time.perf_counter() - start
        report["variants"].append(v)
        sat = v["saturated"]
        sat_text = (f"saturated: gain {100 * sat['gain']:+.2f}% [{100 * sat['low']:+.2f}, {100 * sat['high']:+.2f}] "
                    f"block std {100 * sat['block_std']:.2f}% ({100 * v['saturated_share']:.0f}% of a request)"
                    if sat else "saturated: n/a")
        print(f"{name:12s} gain {100 * v['gain']:+.2f}% [{100 * v['low']:+.2f}, {100 * v['high']:+.2f}] "
              f"noise floor {100 * v['noise_floor']:.2f}%  block std {100 * v['block_std']:.2f}%  {sat_text}  "
              f"first/second run {100 * v['first_over_second_mean']:+.2f}% (std {100 * v['first_over_second_std']:.2f}%)  "
              f"prefill share {100 * v['prefill_share']:.1f}%  ({v['seconds']:.0f} s)",
              flush=True)
        for r in v["requests"]:
            f, s = r["first"], r["second"]
            print(f"  block {r['block']:2d} longest {r['longest']:4d} cap {f['capacity']:5d} "
                  f"first {f['wall']:.4f} second {s['wall']:.4f} s  prefill {f['prefill']:.4f}/{s['prefill']:.4f}  "
                  f"rounds {f['rounds']}/{s['rounds']}")
        for system in systems.values():
            session.forget(system.fingerprint())  # the next variant starts without this one's workspaces
        if a.out:  # after every variant, so a cut-off run keeps what it measured
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "serving_timing_noise.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
