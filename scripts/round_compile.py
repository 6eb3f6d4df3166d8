"""Decoding rounds eager vs under torch.compile (the `draft_compile` and `verify_compile` knobs),
side by side in one process on a GPU.

    python scripts/round_compile.py --deployment fixture-x16 --out DIR [--prompts 5] [--tokens 256] \
        [--system stock scripts/systems/tree-d7k8n128.toml ...]

For each system, its twins with draft_compile, and with draft_compile and verify_compile, run the
same prompts (batch 1, one prompt at a time, interleaved): `engine.profile.profile` gives the
round's time, its tokens and the draft proposal's time (a CUDA-graph replay of one proposal), and
the outputs are compared with the eager system's. The first generation of each system is timed
apart (graph capture, and compilation for a twin). Writes OUT/round_compile.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.prompts import prompt_ids  # noqa: E402
from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.config import load_deployment, load_system  # noqa: E402
from specpilot.engine import profile as engine_profile  # noqa: E402
from specpilot.engine.session import Session  # noqa: E402


TWINS = {"draft": {"draft_compile": True}, "draft+verify": {"draft_compile": True, "verify_compile": True}}


def run_variants(session, system, prompts, tokens) -> dict:
    """`system` eager and its compiled twins (`TWINS`) on the same prompts, interleaved."""
    systems = [system] + [dataclasses.replace(system, name=f"{system.name}+{t}", **kw) for t, kw in TWINS.items()]
    gens, setup_s = {}, {}
    for s in systems:
        t = time.perf_counter()
        gens[s.name] = session.generator(s)
        engine_profile.warm_up(gens[s.name], [prompts[0]], tokens)  # graph capture, and compilation for a twin
        torch.cuda.synchronize()
        setup_s[s.name] = time.perf_counter() - t
    rows = []
    for i, p in enumerate(prompts):
        for s in systems if i % 2 == 0 else systems[::-1]:
            prof = engine_profile.profile(gens[s.name], [p], tokens, curve_nodes=())
            out = gens[s.name].generate([p], tokens).outputs[0]
            rows.append({"prompt": i, "system": s.name, "round_ms": prof.round_ms, "draft_ms": prof.draft_ms,
                         "verify_ms": prof.verify_ms, "tokens_per_round": prof.tokens_per_round,
                         "ms_per_token": prof.ms_per_token, "output": out})
    by = {s.name: [r for r in rows if r["system"] == s.name] for s in systems}
    summary = {}
    for s in systems:
        summary[s.name] = {k: statistics.fmean(r[k] for r in by[s.name])
                           for k in ("round_ms", "draft_ms", "verify_ms", "tokens_per_round", "ms_per_token")}
        summary[s.name]["setup_s"] = setup_s[s.name]
    twins = {}
    base = by[system.name]
    for s in systems[1:]:
        mine = by[s.name]
        ratios = [x["ms_per_token"] / y["ms_per_token"] for x, y in zip(base, mine)]
        draft = [x["draft_ms"] / y["draft_ms"] for x, y in zip(base, mine)]
        twins[s.name] = {"same_outputs": sum(x["output"] == y["output"] for x, y in zip(base, mine)),
                         "speedup_ms_per_token": {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios)},
                         "speedup_draft": {"mean": statistics.fmean(draft), "min": min(draft), "max": max(draft)}}
    for r in rows:
        r.pop("output")
    return {"system": system.name, "summary": summary, "twins": twins, "rows": rows, "prompts": len(prompts)}


def write_md(doc: dict, path: Path) -> None:
    env = doc["environment"]
    lines = [f"# Rounds under torch.compile: {doc['deployment']} ({env.get('gpu') or env.get('device')})", "",
             f"commit {env.get('git_commit') or '?'}{' (dirty)' if env.get('git_dirty') else ''}; torch {env['versions'].get('torch')}; "
             f"{doc['prompts']} prompts (one per set), batch 1, {doc['tokens']} new tokens; each system and its "
             "compiled twins interleaved prompt by prompt; written by `scripts/round_compile.py`", "",
             "| system | ms/token | round ms | draft ms | verify ms | tokens/round | setup s (first generation) |",
             "|---|---|---|---|---|---|---|"]
    for pair in doc["pairs"]:
        for name, s in pair["summary"].items():
            lines.append(f"| {name} | {s['ms_per_token']:.3f} | {s['round_ms']:.3f} | {s['draft_ms']:.3f} | "
                         f"{s['verify_ms']:.3f} | {s['tokens_per_round']:.2f} | {s['setup_s']:.1f} |")
    lines += ["", "| system | eager / twin, ms per token (mean [min, max] over prompts) | draft proposal | "
              "same outputs as eager |", "|---|---|---|---|"]
    for pair in doc["pairs"]:
        for name, t in pair["twins"].items():
            m, d = t["speedup_ms_per_token"], t["speedup_draft"]
            lines.append(f"| {name} | {m['mean']:.3f}x [{m['min']:.3f}, {m['max']:.3f}] | "
                         f"{d['mean']:.3f}x [{d['min']:.3f}, {d['max']:.3f}] | {t['same_outputs']}/{pair['prompts']} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16")
    ap.add_argument("--system", nargs="+", default=["stock", "scripts/systems/tree-d7k8n128.toml"])
    ap.add_argument("--prompts", type=int, default=5, help="prompts per pair (one per set, cycling)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: round_compile.py measures on a CUDA device", file=sys.stderr)
        return 2
    dep = load_deployment(args.deployment)
    session = Session.load(dep)
    bench = prompt_ids(dep, session.tokenizer, n_prompts=max(1, -(-args.prompts // len(dep.sets))))
    by_set = {}
    for p in bench:
        by_set.setdefault(p.set_name, []).append(list(p.ids))
    order = [ps[i] for i in range(max(len(v) for v in by_set.values())) for ps in by_set.values() if i < len(ps)]
    prompts = order[: args.prompts]
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "deployment": dep.name,
           "prompts": len(prompts), "tokens": args.tokens, "pairs": [],
           "environment": capture(session.device, session.target.dtype)}
    for spec in args.system:  # written after each system: a run cut short keeps the systems it finished
        pair = run_variants(session, load_system(spec, dep), prompts, args.tokens)
        print(json.dumps({k: v for k, v in pair.items() if k != "rows"}), flush=True)
        doc["pairs"].append(pair)
        (args.out / "round_compile.json").write_text(json.dumps(doc, indent=1))
        write_md(doc, args.out / "round_compile.md")
    print((args.out / "round_compile.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
