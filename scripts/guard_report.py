"""GPU report of the token-forcing guard: stock AR, a lossless speculative system and two faults.

    python scripts/guard_report.py --deployment fixture --out DIR [--n-prompts 8] [--max-new-tokens 2048]

On one deployment and device (bf16 on GPU by default) it generates the benchmark prompts with
  ar                       the deployment's stock knobs, drafter off (the baseline)
  speculative              the deployment's stock system (tree speculative decoding, lossless)
  fault-logit-bias         speculative + `logit-bias:VALUE:every=K:after=T` (default 2, 7, 1024)
  fault-accept-unverified  speculative + `accept-unverified`
forces every system's outputs through the target on the stock path, and writes DIR/guard_report.json
(all numbers, provenance: date, GPU, commit) and DIR/guard_report.md (rendered from the JSON): each
system's mismatch rate, near-ties and large-margin mismatches, the margins of its mismatches, its
verdict against AR, and how its outputs compare with AR's token for token (identical prompts,
first divergences, the log-prob gap of the two tokens at each first divergence).

`after` counts generated tokens, so with --max-new-tokens 2048 the article's after=2048 would
never fire here; the default 1024 biases the second half of every output.

Develop on CPU with random checkpoints: --target DIR --drafter DIR --device cpu.
The JSON is rewritten after each system, so a run cut short still leaves its numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from specpilot.config import Deployment, DrafterKind, System, load_deployment
from specpilot.guard.config import DTYPES, GuardConfig
from specpilot.guard.divergence import compare_outputs
from specpilot.guard.forcing import ForcingResult, force
from specpilot.guard.records import records_from_outputs, write_records
from specpilot.guard.verdict import ForcingSummary, compare


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deployment", default=None, help="deployment file or shipped name (default: fixture)")
    p.add_argument("--target", help="target model directory (an ad-hoc deployment with --drafter)")
    p.add_argument("--drafter", help="draft model directory, or 'ngram'")
    p.add_argument("--out", required=True, help="output directory (guard_report.json, guard_report.md, outputs/)")
    p.add_argument("--sets", nargs="+", help="benchmark sets (default: the deployment's)")
    p.add_argument("--n-prompts", type=int, default=8, help="prompts per benchmark set (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=2048, help="new tokens per prompt (default 2048)")
    p.add_argument("--batch", type=int, default=8, help="prompts decoded together (default 8)")
    p.add_argument("--fault-value", type=float, default=2.0, help="logit-bias VALUE (default 2)")
    p.add_argument("--fault-every", type=int, default=7, help="logit-bias every K-th vocabulary id (default 7)")
    p.add_argument("--fault-after", type=int, default=1024, help="logit-bias after T generated tokens (default 1024)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="engine and scorer dtype (default: bf16 on GPU)")
    p.add_argument("--chunk", type=int, default=GuardConfig().chunk, help="tokens per forced forward")
    p.add_argument("--resamples", type=int, default=GuardConfig().resamples, help="bootstrap resamples")
    return p.parse_args(argv)


def deployment_of(args) -> Deployment:
    if args.target:
        return Deployment(name="adhoc", target=args.target, drafter=args.drafter or "ngram")
    dep = load_deployment(args.deployment)
    return replace(dep, drafter=args.drafter, drafter_expand=1) if args.drafter else dep


def systems_of(dep: Deployment, args) -> list[System]:
    stock = dep.stock
    if dep.drafter == "ngram":
        stock = stock.with_changes(drafter=DrafterKind.NGRAM)
    bias = f"logit-bias:{args.fault_value:g}:every={args.fault_every}:after={args.fault_after}"
    return [
        stock.with_changes(name="ar", drafter=DrafterKind.NONE, fault=""),
        stock.with_changes(name="speculative", fault=""),
        stock.with_changes(name="fault-logit-bias", fault=bias),
        stock.with_changes(name="fault-accept-unverified", fault="accept-unverified"),
    ]


def generate(session, system: System, prompts: list[list[int]], max_new: int, batch: int) -> dict:
    gen = session.generator(system)
    gen.generate(prompts[:batch], min(max_new, 16))  # warm-up: graph capture, allocator
    outputs, rounds, seconds = [], 0, 0.0
    for i in range(0, len(prompts), batch):
        r = gen.generate(prompts[i : i + batch], max_new)
        outputs += r.outputs
        rounds += sum(r.rounds)
        seconds += r.seconds
    tokens = sum(len(o) for o in outputs)
    return {"outputs": outputs, "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "mean_accepted_length": tokens / rounds if rounds else None}


def margin_quantiles(result: ForcingResult) -> dict:
    m = result.mismatch_margins()
    if not m.size:
        return {"count": 0}
    q = np.quantile(m, [0.5, 0.9, 0.99, 1.0])
    return {"count": int(m.size), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": float(q[3])}


def _fmt(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


def render_markdown(report: dict) -> str:
    prov, cfg = report["provenance"], report["guard_config"]
    lines = [
        f"# Token-forcing guard report: {report['deployment']['name']}",
        "",
        f"{report['created']} · {prov.get('gpu') or prov.get('cpu')} · {report['dtype']} · "
        f"commit {(prov.get('git_commit') or 'unknown')[:12]}{' (dirty)' if prov.get('git_dirty') else ''} · "
        f"torch {prov['versions']['torch']}",
        "",
        f"{report['prompts']} prompts ({', '.join(report['sets'])}) × up to {report['max_new_tokens']} new tokens, "
        f"batch {report['batch']}. Baseline: `ar`. Near-tie threshold {report['near_tie_nats']:g} nats; "
        f"reject when the {100 * cfg['confidence']:.0f}% lower bound of the rate difference (paired bootstrap "
        f"over prompts, {cfg['resamples']} resamples) exceeds {100 * cfg['rate_margin']:.2f} pp, or on more "
        "large-margin mismatches than `ar`.",
        "",
        "| system | tokens | mismatch rate | near-ties | large-margin | max near-tie (nats) | diff vs ar (pp) "
        "| lower bound (pp) | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in report["systems"]:
        f, v = s["forcing"], s["verdict"]
        if v is None:
            verdict, diff, bound = "baseline", "", ""
        else:
            verdict = "pass" if v["passed"] else "REJECT: " + ", ".join(v["violated"])
            diff, bound = _fmt(100 * v["difference"], "+.3f"), _fmt(100 * v["bound"], "+.3f")
        lines.append(
            f"| {s['name']} | {f['tokens']} | {100 * f['rate']:.3f}% | {f['near_ties']} | {f['large_margin']} "
            f"| {f['max_near_tie_nats']:.3g} | {diff} | {bound} | {verdict} |"
        )
    lines += ["", "Token for token against `ar` (the gap is |log p(ar token) - log p(system token)| under the "
              "scorer at each prompt's first divergence):", "",
              "| system | identical prompts | common-prefix tokens | median first divergence | max gap (nats) |",
              "|---|---:|---:|---:|---:|"]
    for s in report["systems"]:
        d = s["vs_ar"]
        if d is not None:
            share = d["common_tokens"] / d["tokens"] if d["tokens"] else 1.0
            lines.append(f"| {s['name']} | {d['identical']}/{d['pairs']} | {d['common_tokens']} ({100 * share:.1f}%) "
                         f"| {_fmt(d['median_index'], '.0f')} | {d['max_nats']:.3g} |")
    lines += ["", "Mismatch margins (nats) and speed:", "",
              "| system | fault | mismatches | p50 | p90 | p99 | max | tok/s | mean accepted |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report["systems"]:
        m = s["margins"]
        q = " | ".join(_fmt(m.get(k), ".3g") for k in ("p50", "p90", "p99", "max"))
        acc = _fmt(s["mean_accepted_length"], ".2f")
        speed = f"{s['tokens_per_second']:.0f}"
        lines.append(f"| {s['name']} | {s['fault'] or '-'} | {m['count']} | {q} | {speed} | {acc} |")
    lines += ["", "Generated by scripts/guard_report.py; the numbers are in guard_report.json.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    from specpilot.bench.prompts import prompt_ids
    from specpilot.bench.provenance import capture
    from specpilot.engine.session import Session

    args = parse_args(argv)
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dep = deployment_of(args)
    session = Session.load(dep, device=args.device, dtype=DTYPES[args.dtype] if args.dtype else None)
    dtype = str(session.target.dtype).removeprefix("torch.")
    config = GuardConfig(chunk=args.chunk, resamples=args.resamples)
    tau = config.near_tie_for(session.target.dtype)
    bench = prompt_ids(dep, session.tokenizer, sets=args.sets, n_prompts=args.n_prompts)
    prompts = [p.as_list() for p in bench]
    log(f"{dep.name} on {session.device} ({dtype}): {len(prompts)} prompts x {args.max_new_tokens} tokens")
    report = {
        "report": "guard", "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "provenance": capture(session.device), "deployment": dep.fingerprint_fields(), "dtype": dtype,
        "args": vars(args), "guard_config": config.to_dict(), "near_tie_nats": tau,
        "sets": sorted({p.set_name for p in bench}), "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "batch": args.batch, "systems": [],
    }
    ar_forcing = None
    for system in systems_of(dep, args):
        gen = generate(session, system, prompts, args.max_new_tokens, args.batch)
        records = records_from_outputs(prompts, gen.pop("outputs"))
        write_records(out / "outputs" / f"{system.name}.jsonl", records, overwrite=True)
        forcing = force(session.target, records, chunk=config.chunk)
        entry = {"name": system.name, "fault": system.fault, "knobs": system.knobs(), **gen,
                 "forcing": asdict(ForcingSummary.of(forcing, tau)), "margins": margin_quantiles(forcing),
                 "verdict": None, "vs_ar": None}
        if ar_forcing is None:
            ar_forcing = forcing
        else:
            entry["verdict"] = compare(forcing, ar_forcing, config).to_dict()
            entry["vs_ar"] = compare_outputs(ar_forcing, forcing).to_dict()
        report["systems"].append(entry)
        (out / "guard_report.json").write_text(json.dumps(report, indent=2) + "\n")
        v = entry["verdict"]
        log(f"{system.name}: {gen['tokens']} tokens, {gen['tokens_per_second']:.0f} tok/s, mismatch rate "
            f"{100 * forcing.rate:.3f}%" + ("" if v is None else f", {'pass' if v['passed'] else 'REJECT'}"))
    (out / "guard_report.md").write_text(render_markdown(report))
    log(f"wrote {out / 'guard_report.json'} and {out / 'guard_report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
