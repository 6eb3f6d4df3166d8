"""Does a prompt's first request cost more than a repeat of it, and where does the extra go?

    python scripts/first_request.py --deployment fixture-x16 --out DIR [--prompts 8] [--tag compile]

The controller's stock-vs-stock noise on the H200 (results/controller/) showed, in one
process, the first run of each new prompt ~0.1 s slower than an immediate repeat of it. This
script runs, in one process, each of --prompts fresh prompts (the controller's noise draws) twice
through the stock system and once more with --max-new-tokens 1 on other fresh prompts (prefill
only), and records per run: wall time around `generate` (CUDA-synchronized), the generator's own
decode and prefill seconds, and what changed in torch.compile's counters (recompiles, graphs) and
in the generator's workspaces and CUDA graphs. Systems: stock, and stock without CUDA graphs.
Run once with and once without SPECPILOT_COMPILE=0 (pass --tag to name the output).

Writes DIR/first_request_<tag>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def counters() -> dict:
    from torch._dynamo.utils import counters as c

    return {f"{group}.{k}": v for group in ("stats", "recompiles", "inductor", "aot_autograd")
            for k, v in c.get(group, {}).items()}


def diff(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def run_system(args, knobs: dict, source, draw) -> dict:
    import torch

    from specpilot.control.arm import ArmSpec
    from specpilot.engine.runner import SessionRunner

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    system = {"name": knobs.get("name", "stock"), **knobs}
    runner = SessionRunner(ArmSpec(args.deployment, system, device=device))
    gen = runner.generator(system)
    warm = draw(source, 2, 0, "noise-warmup-requests", 0)
    runner.warm(system, warm, args.max_new_tokens)

    def one(prompt, max_new):
        before, ws_before = counters(), {k: len(w.graphs) for k, w in gen.workspaces.items()}
        sync()
        t = time.perf_counter()
        result = gen.generate([prompt], max_new)
        sync()
        wall = time.perf_counter() - t
        ws_after = {k: len(w.graphs) for k, w in gen.workspaces.items()}
        return {"wall_s": wall, "generate_s": result.seconds, "prefill_s": result.prefill_seconds,
                "tokens": result.num_tokens, "counters": diff(counters(), before),
                "workspaces_changed": ws_after != ws_before}

    rows = []
    for b in range(args.prompts):
        p = draw(source, 1, 0, "noise", b)[0]
        rows.append({"prompt_len": len(p), "first": one(p, args.max_new_tokens), "repeat": one(p, args.max_new_tokens)})
    prefill_rows = []
    for b in range(args.prompts):
        p = draw(source, 1, 0, "first-request-prefill", b)[0]
        prefill_rows.append({"prompt_len": len(p), "first": one(p, 1), "repeat": one(p, 1)})
    runner = gen = None  # noqa: F841 - free the models before the next system loads
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"knobs": knobs, "full": rows, "prefill_only": prefill_rows}


def summarize(name: str, res: dict) -> list[str]:
    lines = []
    for kind in ("full", "prefill_only"):
        rows = res[kind]
        extra = [r["first"]["wall_s"] - r["repeat"]["wall_s"] for r in rows]
        inner = [r["first"]["generate_s"] - r["repeat"]["generate_s"] for r in rows]
        pre = [r["first"]["prefill_s"] - r["repeat"]["prefill_s"] for r in rows]
        recompiled = sum(1 for r in rows if r["first"]["counters"])
        lines.append(f"| {name} | {kind} | {len(rows)} | {sum(extra) / len(rows) * 1e3:.1f} | "
                     f"{sum(inner) / len(rows) * 1e3:.1f} | {sum(pre) / len(rows) * 1e3:.1f} | {recompiled} | "
                     f"{sum(1 for r in rows if r['repeat']['counters'])} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment", default="fixture-x16")
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--tag", default="default")
    args = p.parse_args(argv)
    import os

    from specpilot.config import load_deployment
    from specpilot.control.prompts import draw, load_prompt_source

    source = load_prompt_source(load_deployment(args.deployment))
    result = {"tag": args.tag, "compile": os.environ.get("SPECPILOT_COMPILE", "1") != "0", "systems": {}}
    for name, knobs in (("stock", {}), ("stock, no CUDA graphs", {"cuda_graphs": False})):
        t = time.monotonic()
        result["systems"][name] = run_system(args, knobs, source, draw)
        print(f"{name}: {time.monotonic() - t:.0f} s", flush=True)
    lines = [f"first request vs repeat ({args.tag}; compile {'on' if result['compile'] else 'off'}): mean ms",
             "| system | requests | n | wall extra | generate() extra | prefill extra | first runs with compile "
             "events | repeats with compile events |", "|---|---|---|---|---|---|---|---|"]
    for name, res in result["systems"].items():
        lines += summarize(name, res)
    result["table"] = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"first_request_{args.tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(result["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
