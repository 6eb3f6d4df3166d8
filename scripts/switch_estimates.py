"""The loop's cost-table measurement after a short warm-up (the engine's) and a full-length one.

`loop.measure.measure` times the incumbent, plain AR and each other loaded drafter switched in, on
the loop's profile batches, after `engine.profile.warm_up` (8 tokens). If graphs of the longer
attention spans were captured inside the timed generations, a switched-in drafter (whose
generator is built fresh for every measurement) would pay for it and look slower than it is. This
script measures the same systems both ways, in one process, alternating, each from cold
generators, and writes what each variant estimates (ms per token) side by side.

    python scripts/switch_estimates.py --deployment fixture-x16-batch --system scripts/systems/n16.toml \
        --repeats 2 --out results/loop/switch_estimates.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpilot.bench.provenance import capture
from specpilot.config import load_deployment, load_system
from specpilot.control.prompts import load_prompt_source
from specpilot.engine import profile as engine_profile
from specpilot.engine.session import Session
from specpilot.loop import measure as loop_measure
from specpilot.loop.config import LoopConfig
from specpilot.loop.context import profile_batches
from specpilot.loop.systems import switched


def full_warm_up(gen, prompts, max_new_tokens):
    gen.generate(prompts, max_new_tokens)  # every attention span the timed run reaches


def cold(session, system) -> None:
    """Forget every generator a measurement of `system` builds, so the next starts from nothing."""
    for s in [system, system.plain_ar()] + [switched(system, k) for k in loop_measure.loaded_drafters(session)]:
        if s is not None:
            session.forget(s.fingerprint())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16-batch")
    ap.add_argument("--system", default="stock")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per profile batch (the loop's --profile-tokens)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dep = load_deployment(args.deployment)
    system = load_system(args.system, dep)
    config = LoopConfig()
    batches = profile_batches(load_prompt_source(dep), dep, config)
    session = Session.load(dep, device=args.device)
    short_warm_up = engine_profile.warm_up
    rows = []
    for repeat in range(args.repeats):
        for variant, warm in (("short", short_warm_up), ("full", full_warm_up)):
            cold(session, system)
            engine_profile.warm_up = warm  # profile() and _timed_generations both read it here
            try:
                table = loop_measure.measure(session, system, batches, args.tokens)
            finally:
                engine_profile.warm_up = short_warm_up
            row = {"variant": variant, "repeat": repeat, "ms_per_token": table.ms_per_token,
                   "ar_ms_per_token": table.ar_ms_per_token, "switch_ms_per_token": dict(table.switch_ms_per_token),
                   "tokens_per_round": table.tokens_per_round}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"deployment": dep.name, "system": system.name, "batches": len(batches), "tokens": args.tokens,
           "rows": rows, "environment": capture(session.device)}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
