"""Where a round's GPU time goes, kernel by kernel: the draft proposal and the verify forward of
each system, as the loop's cost table times them (GPU).

    python scripts/round_kernels.py --deployment fixture-x16 --out DIR [--tokens 256] [--reps 20] \
        [--system stock scripts/systems/d6k8n64-compiled.toml ...]

For each system: one generation of a benchmark prompt (graph capture, compilation), then its draft
proposal and its verify forward over the proposed tree, replayed on the final state as CUDA graphs
(`engine.profile` times the same two pieces the same way; the replays write only scratch cache
slots). Each piece is timed by CUDA events over `--reps` replays, then profiled with torch.profiler,
as graph replays and as plain launches: every kernel's name and device time, grouped into families
(GEMM, attention, top-k/sort, fused Triton, copies), per call. Wall time minus kernel time is the
device idle between kernels. Writes OUT/round_kernels.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.kernel_profile import FAMILIES, piece, seen  # noqa: E402
from specpilot.bench.prompts import prompt_ids  # noqa: E402
from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.config import load_deployment, load_system  # noqa: E402
from specpilot.engine import profile as engine_profile  # noqa: E402
from specpilot.engine.session import Session  # noqa: E402
from specpilot.engine.steps import tree_forward  # noqa: E402
from specpilot.errors import SpecPilotError  # noqa: E402
from specpilot.models import ops  # noqa: E402

def profile_system(session, system, prompt: list[int], tokens: int, reps: int) -> dict:
    gen = session.generator(system)
    engine_profile.warm_up(gen, [prompt], tokens)
    result = gen.generate([prompt], tokens)
    ws = next(reversed(gen.workspaces.values()))
    state, cache = ws.state, ws.cache
    prefix = state.cache_prefix()
    drafter = next(iter(gen.drafters.values()), None)
    doc = {"system": system.name, "knobs": system.knobs(), "tokens_per_round": result.mean_accepted_length,
           "draft_forwards": getattr(drafter, "depth", 0)}
    with torch.inference_mode():
        if drafter is not None and not drafter.needs_host_tokens:
            doc["proposal"] = piece(lambda: drafter.propose(state), reps)
            tree = drafter.propose(state)
            tree.ancestors()
            forward = ops.compiled_static(tree_forward, gen.target.device) if gen.verify_compile else tree_forward
            doc["verify"] = piece(lambda: forward(gen.target, cache, tree, prefix), reps)
            doc["tree_nodes"] = tree.num_nodes
    return doc


def write_md(doc: dict, path: Path) -> None:
    env = doc["environment"]
    lines = [f"# A round's kernels: {doc['deployment']} ({env.get('gpu') or env.get('device')})", "",
             f"commit {env.get('git_commit') or '?'}{' (dirty)' if env.get('git_dirty') else ''}; torch "
             f"{env['versions'].get('torch')}; batch 1, one prompt, {doc['tokens']} new tokens, then each piece "
             f"replayed {doc['reps']} times on the final state; written by `scripts/round_kernels.py`", "",
             "Per call. Wall: CUDA-event time of a graph replay (plain launches in brackets). Kernels: what "
             "the profiler saw inside the replay. Idle: wall minus kernel time.", "",
             "| system | piece | wall µs (plain) | kernels | kernel µs | idle µs | " +
             " | ".join(f"{f} µs (n)" for f, _ in FAMILIES) + " | other µs (n) |",
             "|---|---|---|---|---|---|" + "---|" * (len(FAMILIES) + 1)]
    for s in doc["systems"]:
        for name in ("proposal", "verify"):
            p = s.get(name)
            if p is None:
                continue
            k = seen(p)
            fams = [k["families"].get(f) for f, _ in FAMILIES] + [k["families"].get("other")]
            cells = " | ".join(f"{f['us']:.1f} ({f['kernels']:.0f})" if f else "-" for f in fams)
            lines.append(f"| {s['system']} | {name} | {p['graph_wall_us']:.1f} ({p['plain_wall_us']:.1f}) | "
                         f"{k['kernels_per_call']:.0f} | {k['kernel_us_per_call']:.1f} | {p['idle_us']:.1f} | {cells} |")
    for s in doc["systems"]:
        lines += ["", f"## {s['system']}: {s['draft_forwards']} draft forwards a proposal, "
                      f"{s.get('tree_nodes', '-')} tree nodes, {s['tokens_per_round']:.2f} tokens/round"]
        for name in ("proposal", "verify"):
            p = s.get(name)
            if p is None:
                continue
            k = seen(p)
            lines += ["", f"{name}: top kernels per call", "", "| kernel | family | n | µs |", "|---|---|---|---|"]
            lines += [f"| `{t['name']}` | {t['family']} | {t['kernels']:.1f} | {t['us']:.1f} |" for t in k["top"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16")
    ap.add_argument("--system", nargs="+", default=["stock", "scripts/systems/d6k8n64-compiled.toml",
                                                    "scripts/systems/eagle3-d6k4n16-compiled.toml"])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: round_kernels.py measures on a CUDA device", file=sys.stderr)
        return 2
    try:
        dep = load_deployment(args.deployment)
        systems = [load_system(spec, dep) for spec in args.system]
    except SpecPilotError as err:  # one line, nothing written
        print(f"error: {err}", file=sys.stderr)
        return 2
    session = Session.load(dep)
    prompt = list(prompt_ids(dep, session.tokenizer, n_prompts=1)[0].ids)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "deployment": dep.name,
           "tokens": args.tokens, "reps": args.reps, "systems": [],
           "environment": capture(session.device, session.target.dtype)}
    for system in systems:  # written after each system: a run cut short keeps the systems it finished
        doc["systems"].append(profile_system(session, system, prompt, args.tokens, args.reps))
        (args.out / "round_kernels.json").write_text(json.dumps(doc, indent=1))
        write_md(doc, args.out / "round_kernels.md")
    print((args.out / "round_kernels.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
