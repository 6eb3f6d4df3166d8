"""Speculation under sampling on one GPU: sampled AR vs the deployment's stock system (on
`fixture-x16-eagle3`: its EAGLE-3 tree) at temperature 0.7, top-p 0.95, greedy beside it, in one run.

Every prompt (the deployment's sets, `bench.prompts`) is decoded at batch 1 by AR and by the stock
system, greedy and sampled, interleaved per prompt; sampled requests carry fixed seeds (prompt
index), so AR and the system see the same requests. Reported per mode: decode seconds (CUDA
events on a GPU, the wall clock elsewhere), tokens, speedup = AR decode time / system decode
time over the same prompts, and the system's mean accepted length (tokens per target forward).
Sampled outputs equal AR's in law, not token for token (`engine.sampled_steps`).

Usage: python scripts/sampling_speed.py --out DIR [--deployment fixture-x16-eagle3] [--n-prompts 4]
       [--max-new-tokens 512] [--temperature 0.7] [--top-p 0.95] [--device cuda] [--system stock|FILE ...]
Writes DIR/sampling_speed.json and DIR/sampling_speed.md (numbers from this run only). On CPU,
`--deployment fixture --n-prompts 1 --max-new-tokens 16` checks the script end to end.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--deployment", default="fixture-x16-eagle3", help="deployment name or file")
    p.add_argument("--n-prompts", type=int, default=4, help="prompts per set (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="new tokens per prompt (default 512)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.95, help="sampling top-p (default 0.95)")
    p.add_argument("--device", help="cpu, cuda ... (default: cuda if available)")
    p.add_argument("--commit", help="the commit measured (recorded; default: git's HEAD)")
    p.add_argument("--system", action="append", default=[],
                   help="a system to measure ('stock' or a TOML file; repeat for several; default: stock)")
    return p.parse_args(argv)


def measure(session, system, prompts, max_new: int, sampling) -> dict:
    """AR and `system` on every prompt at batch 1, interleaved; sums over the prompts."""
    gen = session.generator(system)
    ar = session.generator(system.plain_ar())
    warm = min(max_new, 16)
    params = [None if sampling is None else replace(sampling, seed=i) for i in range(len(prompts))]
    for g in (gen, ar):
        g.generate([prompts[0]], warm, sampling=params[0])  # graph capture, allocator, first shapes
    out = {"ar_seconds": 0.0, "seconds": 0.0, "ar_tokens": 0, "tokens": 0, "rounds": 0}
    for p, s in zip(prompts, params):
        a = ar.generate([p], max_new, stop_at_eos=False, sampling=s)
        r = gen.generate([p], max_new, stop_at_eos=False, sampling=s)
        out["ar_seconds"] += a.decode_seconds
        out["seconds"] += r.decode_seconds
        out["ar_tokens"] += a.num_tokens
        out["tokens"] += r.num_tokens
        out["rounds"] += sum(r.rounds)
    out["speedup"] = out["ar_seconds"] / out["seconds"]
    out["mean_accepted_length"] = out["tokens"] / out["rounds"]
    return out


def markdown(report: dict) -> str:
    setting = (f"{report['prompts']} prompts x {report['max_new_tokens']} new tokens, batch 1; "
               f"sampled at temperature {report['temperature']:g}, top-p {report['top_p']:g}, seeds 0..n-1.")
    where = report["gpu"] or report["device"]
    lines = [f"# Speculation under sampling: {report['deployment']} on {where}", "",
             f"{report['date']}, commit {report.get('commit') or '-'}; written by `scripts/sampling_speed.py`", "",
             setting, "",
             "| system | mode | AR tok/s | system tok/s | speedup | mean accepted length |", "|---|---|---|---|---|---|"]
    for run in report["systems"]:
        for mode in ("greedy", "sampled"):
            m = run[mode]
            lines.append(f"| {run['system']} | {mode} | {m['ar_tokens'] / m['ar_seconds']:.1f} | "
                         f"{m['tokens'] / m['seconds']:.1f} | {m['speedup']:.2f}x | {m['mean_accepted_length']:.2f} |")
    base = report["systems"][0]["knobs"]
    lines += ["", f"Knobs of {report['systems'][0]['system']}: {base}"]
    for r in report["systems"][1:]:
        diff = {k: v for k, v in r["knobs"].items() if base.get(k) != v}
        lines.append(f"{r['system']}: {diff}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from specpilot.bench.prompts import prompt_ids
    from specpilot.config import load_deployment, load_system
    from specpilot.engine.sampling import SamplingParams
    from specpilot.engine.session import Session

    dep = load_deployment(args.deployment)
    sampling = SamplingParams(args.temperature, top_p=args.top_p)  # bad values: one error, before loading
    systems = [load_system(spec, dep) for spec in (args.system or ["stock"])]
    session = Session.load(dep, device=args.device)
    prompts = [list(p.ids) for p in prompt_ids(dep, session.tokenizer, dep.sets, args.n_prompts, 0)]
    from specpilot.bench.provenance import capture

    env = capture(session.device)
    commit = args.commit or f"{env.get('git_commit') or '-'}{' (dirty)' if env.get('git_dirty') else ''}"
    report = {
        "commit": commit, "deployment": dep.name, "device": str(session.device),
        "gpu": torch.cuda.get_device_name(session.device) if session.device.type == "cuda" else platform.processor(),
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
        "top_p": args.top_p, "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(),
        "systems": [{"system": system.name, "knobs": system.knobs(),
                     "greedy": measure(session, system, prompts, args.max_new_tokens, None),
                     "sampled": measure(session, system, prompts, args.max_new_tokens, sampling)}
                    for system in systems],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "sampling_speed.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    from specpilot.errors import SpecPilotError

    try:
        raise SystemExit(main())
    except SpecPilotError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
