"""The run's report: report.json (every number), report.md (for people) and the plots.

Built from data only: the journal's records (this run's, including the part before a resume),
the memory's chain of promotions from stock to the final system (each change with its
re-measured, stored gain and interval; their compounded gain), the final benchmark (stock and
final system against AR in one run, with intervals: the batch benchmark, or the serving benchmark
for a deployment served by continuous batching; and the same on held-out prompts the loop never
saw, `heldout_line`) and the cost tables before and after.

    report.json       schema "specpilot.loop/1": settings, noise floor, seeds from similar
                      deployments, rounds (cost table, the slot split by gap, every decision with
                      its numbers and the gap it targeted), promotions, final measurement, gaps
                      before/after; the final system's file, each knob the run's device did not
                      run as set noted with what ran (`system_toml`)
    report.md         the same for people: headline, promoted changes, rounds, gaps, settings
    trajectory.png    estimated gain over stock by round with intervals; final speedups over AR
    gaps.png          where a token's time goes, before and after, against the ceiling
    decisions.jsonl   (the journal, written as the run goes)

Owns: assembling and rendering the report, writing its files atomically. Does not own any number.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specpilot.bench.report import write_text_atomic
from specpilot.loop.journal import JOURNAL_FILE, EventKind, plain_json
from specpilot.loop.patches import excerpt, increment, summarize
from specpilot.loop.systems import describe

SCHEMA = "specpilot.loop/1"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"


def rounds_from_journal(events) -> list[dict]:
    """One dict per round of the run (its last attempt, when a round was cut short and re-run)."""
    by_round: dict[int, list] = {}
    for e in events:
        if e.round <= 0 or e.kind is EventKind.STOP:  # a stop names the round it did not start
            continue
        if e.kind is EventKind.MEASURE:
            by_round[e.round] = []  # a re-run of a round replaces its cut-short attempt
        by_round.setdefault(e.round, []).append(e)
    out = []
    for index in sorted(by_round):
        evs = by_round[index]
        measure = next((e for e in evs if e.kind is EventKind.MEASURE), None)
        end = next((e for e in evs if e.kind is EventKind.ROUND_END), None)
        promo = next((e for e in evs if e.kind is EventKind.PROMOTION), None)
        out.append({
            "index": index,
            "incumbent": measure.data.get("incumbent") if measure else None,
            "cost": measure.data.get("cost") if measure else None,
            "slots": next((e.data for e in evs if e.kind is EventKind.SLOTS), None),
            "proposals": next((e.data.get("counts") for e in evs if e.kind is EventKind.PROPOSALS), {}),
            "agent_errors": next((e.data.get("errors") for e in evs if e.kind is EventKind.PROPOSALS), {}),
            "reused": [e.data for e in evs if e.kind is EventKind.REUSED],
            "evaluations": [e.data for e in evs if e.kind is EventKind.EVALUATION],
            "promotion": promo.data if promo else None,
            "completed": end is not None,
            "seconds": end.data.get("seconds") if end else None,
        })
    return out


# how a promotion's stored gain was measured (its evaluation's stage)
MEASURED = {"remeasure": "re-measured on fresh blocks after screening", "single": "its one comparison (no screening)"}


def promotions(chain, journal_events, parent_patches: dict | None = None) -> list[dict]:
    """Each promotion from stock to the final system with its stored, re-measured numbers, and what
    its patch changed over its incumbent's (`parent_patches`: incumbent hash -> patch)."""
    why = {e.data.get("entry_id"): e.data for e in journal_events if e.kind is EventKind.EVALUATION}
    parents = dict(parent_patches or {})
    out = []
    for r in chain:
        parent_patch = parents.get(r.incumbent)
        summary = summarize(r.candidate.patch, parent_patch) if r.candidate.patch != parent_patch else None
        parents[r.candidate.hash] = r.candidate.patch
        ev = r.detail["evaluation"]
        parent = {k: v for k, v in ev["incumbent"]["system"].items() if k != "name"}
        child = {k: v for k, v in r.candidate.knobs.items() if k != "name"}
        changes = {k: [parent.get(k), child.get(k)] for k in child if parent.get(k) != child.get(k)}
        agent = why.get(r.id, {}).get("agent") or r.candidate.name.split(":", 1)[0]
        out.append({"entry_id": r.id, "round": r.round, "name": r.candidate.name, "agent": agent,
                    "gap": why.get(r.id, {}).get("gap"), "changes": changes,
                    "has_patch": r.candidate.patch is not None,
                    "patch_summary": summary.to_dict() if summary else None,
                    "patch_diff": increment(r.candidate.patch, parent_patch)[0] if summary else None,
                    "incumbent": ev["incumbent"]["system"].get("name"),
                    "gain": r.gain, "gain_lower": r.gain_lower, "gain_upper": r.gain_upper, "threshold": r.threshold,
                    "noise": r.noise, "blocks": r.blocks, "stage": r.stage.value,
                    "rationale": why.get(r.id, {}).get("rationale", ""),
                    "patch": r.candidate.patch})
    return out


def system_toml(system, device: str | None) -> tuple[str, dict]:
    """The final system as the report shows it: its system file as the memory keeps it, each knob
    that did not run as set on `device` (the run's devices' kind, "cpu" or "cuda"; None: unknown)
    followed by a TOML comment saying what ran and why (`engine.session.ran_on_device`), so the
    text still loads as this very system; and those knobs as {knob: {"set", "ran", "why"}}."""
    from specpilot.engine.session import ran_on_device

    ran = ran_on_device(system, device) if device else {}
    knobs = system.knobs()
    lines = []
    for line in system.to_toml().splitlines():
        knob = line.split(" = ", 1)[0]
        if knob in ran:
            line += f"  # on {device}: {json.dumps(ran[knob][0])} ({ran[knob][1]})"
        lines.append(line)
    return "\n".join(lines) + "\n", {k: {"set": knobs[k], "ran": v, "why": why} for k, (v, why) in ran.items()}


def build_report(paths, journal, deployment, fp, config, ccfg, noise, start, incumbent, after, final, stop,
                 memory, device: str | None = None) -> dict:
    """The report document. `device`: the kind of the devices the run ran on ("cpu", "cuda"),
    for saying which of the final system's knobs did not run as set there (`system_toml`)."""
    from specpilot.control.defaults import source_commit
    from specpilot.control.rule import promotion_threshold
    from specpilot.loop.state import promotion_chain

    events = list(start.previous) + list(journal.events)
    rounds = rounds_from_journal(events)
    records = promotion_chain(memory, fp.digest, incumbent)
    parents = {}
    for r in records[:1]:  # the chain's first incumbent (stock, or a system with a patch of its own)
        stored = memory.system(r.incumbent)
        parents[r.incumbent] = stored.patch if stored is not None else None
    chain = promotions(records, events, parents)
    compounded = 1.0
    for p in chain:
        compounded *= 1 + (p["gain"] or 0.0)
    before = next((r["cost"] for r in rounds if r["cost"]), None)
    agents = {e.data["agent"]: {"enabled": e.data["enabled"], "reason": e.data["reason"]}
              for e in journal.events if e.kind is EventKind.AGENT}
    toml, on_device = system_toml(incumbent.candidate.system, device)
    return plain_json({
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": source_commit(),
        "run": {"id": paths.run_id, "out": str(paths.out), "resumed": bool(start.previous), "stop": stop.value,
                "wall_seconds": journal.elapsed(), "memory": str(memory.path),
                "errors": [e.text for e in journal.events if e.kind is EventKind.STOP and e.data.get("error")]},
        "deployment": {"name": deployment.name, "fingerprint": fp.digest, "device": fp.gpu,
                       "fields": deployment.fingerprint_fields()},
        "config": config.to_dict(),
        "controller": ccfg.to_dict(),
        "agents": agents,
        "noise": {**noise.to_dict(), "threshold": promotion_threshold(ccfg, noise)},
        "start": {"incumbent": start.incumbent.name, "entry_id": start.incumbent.entry_id,
                  "cumulative_gain": start.incumbent.cumulative_gain, "note": start.note,
                  "seeds": [e.data for e in journal.events if e.kind is EventKind.SEED]},
        "rounds": rounds,
        "final_system": {"name": incumbent.name, "entry_id": incumbent.entry_id,
                         "knobs": incumbent.candidate.system.knobs(),
                         "changes_from_stock": incumbent.candidate.changes_from(_stock_candidate(deployment)),
                         "has_patch": incumbent.candidate.patch is not None,
                         "patch_summary": _summary_dict(incumbent.candidate.patch),
                         "estimated_gain_over_stock": incumbent.cumulative_gain,
                         "toml": toml, "on_device": on_device},
        "promotions": chain,
        "compounded_gain": compounded - 1,
        "final": final.to_dict() if final else None,
        "gaps": {"before": before, "after": after.to_dict() if after else None},
    })


def _summary_dict(patch: str | None) -> dict | None:
    summary = summarize(patch)
    return summary.to_dict() if summary is not None else None


def _stock_candidate(deployment):
    from specpilot.loop.systems import Candidate

    return Candidate(deployment.stock)


def write_report(paths, journal, deployment, fp, config, ccfg, noise, start, incumbent, after, final, stop,
                 memory, device: str | None = None) -> tuple[list[Path], dict]:
    """Write the report's files; (their paths, the journal's last; the report document)."""
    from specpilot.loop.plots import plot_gaps, plot_trajectory

    report = build_report(paths, journal, deployment, fp, config, ccfg, noise, start, incumbent, after, final, stop,
                          memory, device)
    files = [paths.out / REPORT_JSON, paths.out / REPORT_MD]
    write_text_atomic(files[0], json.dumps(report, indent=1, allow_nan=False) + "\n")
    write_text_atomic(files[1], render_markdown(report))
    for f in files:
        f.chmod(0o644)  # results are meant to be read (and committed), like the plots next to them
    for name, plot in (("trajectory.png", plot_trajectory), ("gaps.png", plot_gaps)):
        try:
            files.append(plot(report, paths.out / name))
        except Exception as err:
            journal.say(f"plot {name} failed: {type(err).__name__}: {err}")
    return files + [paths.out / JOURNAL_FILE], report


# ---- Markdown -----------------------------------------------------------------------------------
def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def format_gain(est, lo, hi, fmt="{:+.1%}") -> str:
    if est is None:
        return "n/a"
    if lo is None or hi is None:
        return fmt.format(est) + " [n/a]"
    return f"{fmt.format(est)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def format_speedup(interval: dict | None) -> str:
    if not interval or interval.get("estimate") is None:
        return "n/a"
    if interval.get("no_interval"):  # e.g. too few prompts per set (specpilot.bench/2)
        return f"{interval['estimate']:.2f}x [n/a ({interval['no_interval']})]"
    return format_gain(interval["estimate"], interval.get("low"), interval.get("high"), "{:.2f}x")


def heldout_line(final: dict) -> str | None:
    """The final system's gain on the held-out prompts in one line, from `FinalMeasurement.to_dict()`:
    None when the final system is stock or no held-out run was asked for; why not, when it did not run."""
    held = final.get("heldout")
    if not held:
        note = final.get("heldout_note")
        return f"held-out prompts (never seen by the loop): {note}" if note and final.get("final") else None
    return (f"held-out prompts (never seen by the loop, {held['prompts']} prompts): final / stock "
            f"{format_speedup(held['final_gain'])}; final over AR {format_speedup(held['final_speedup'])}")


def render_final(r: dict) -> list[str]:
    """The final benchmark's table and how it was measured (by the batch or the serving benchmark)."""
    final, bench = r["final"], r["final"]["bench"]
    c, note = bench["config"], (f" Note: {final['note']}." if final["note"] else "")
    header = ["system", "speedup over AR (95% CI)", "over stock (95% CI)"]
    rows = [["AR", "1.00x", ""], [f"stock (`{final['stock']}`)", format_speedup(final["stock_speedup"]), ""]]
    if final["final"]:
        rows.append([f"final `{r['final_system']['name']}`", format_speedup(final["final_speedup"]),
                     format_speedup(final["final_gain"])])
    sampling = c.get("sampling") or {}
    if sampling and not sampling.get("greedy", True):
        note = (f" Sampled: temperature {sampling['temperature']:g}, top-k {sampling['top_k']}, top-p "
                f"{sampling['top_p']:g}, min-p {sampling['min_p']:g}, one seed per prompt for AR and every system; "
                "outputs are not compared with AR's.") + note
    if c.get("regime") != "serving":
        old = bench.get("schema", "").startswith("specpilot.bench/1")  # before per-token speedups
        per_set = ("total AR time / total system time" if old
                   else "AR time per generated token / system time per generated token")
        return _table(header, rows) + [
            "", f"Measured in one run: AR and the systems interleaved batch by batch on {len(c['sets'])} sets x "
                f"{c['n_prompts']} prompts x {c['max_new_tokens']} new tokens (batch {c['batch']}); per set "
                f"{per_set}, geometric mean over sets, {c['interval']} bootstrap intervals.{note}"]
    from specpilot.loop.final import format_rate, identical_count, serving_engines

    (level,) = bench["levels"]
    engines = serving_engines(final)
    saturated = any(e.get("saturated_speedup") for _, e in engines)
    for row, (label, e) in zip(rows, engines):
        tpot = e["time_per_output_token"]["p50"]["estimate"]
        row += [format_rate(e["tokens_per_second"]), "n/a" if tpot is None else f"{1e3 * tpot:.2f}",
                "-" if label == "AR" else identical_count(e)]
        if saturated:
            row += ["1.00x" if label == "AR" else format_speedup(e.get("saturated_speedup")),
                    format_speedup(e["saturated_gain"]) if e.get("saturated_gain") else ""]
    busy = ["saturated over AR", "saturated over stock"] if saturated else []
    while_busy = (" Saturated: over the stretches while a request waited for a slot (every slot taken, no "
                  "ramp-down), the rate the loop's timed blocks compare." if saturated else "")
    arrivals = (f"Poisson arrivals at {c['arrival_rate']:g} requests/s" if c["arrival_rate"] > 0
                else "closed loop (each finished request replaced at once)")
    length = (f"exactly {c['max_new_tokens']} new tokens (EOS ignored)" if c["ignore_eos"]
              else f"up to {c['max_new_tokens']} new tokens (stopping at EOS)")
    left = f", {level['dropped_requests']} of the pool left out" if level["dropped_requests"] else ""
    return _table(header + ["tok/s (95% CI)", "TPOT p50 ms", "identical to AR"] + busy, rows) + [
        "", f"Measured in one serving run, as the deployment serves requests: continuous batching at concurrency "
            f"{level['concurrency']}, {arrivals}; AR and the systems serve the same {level['units']} units of "
            f"{level['unit_requests']} requests ({c['requests_per_slot']} per slot) back to back, the order "
            f"rotating; requests from {len(c['sets'])} sets x {c['n_prompts']} prompts taken in turn{left}, "
            f"{length}, greedy. Throughput = output tokens / serving time over the units; speedups and the gain "
            f"over stock are throughput ratios paired by unit, {c['interval']} bootstrap intervals over units; "
            f"TPOT = time per output token after the first.{while_busy}{note}"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows)]


def render_markdown(r: dict) -> str:
    dep, run, final = r["deployment"], r["run"], r["final"]
    lines = [f"# SpecPilot loop: `{dep['name']}` on {dep['device']}", "",
             f"{r['created']}, commit {r['commit'] or 'unknown'}; fingerprint `{dep['fingerprint']}`; "
             f"{len(r['rounds'])} round(s), stopped: {run['stop']}; {run['wall_seconds']:.0f} s"
             + (" (resumed run)" if run["resumed"] else "") + ".", "", "## Result", ""]
    if final:
        lines += render_final(r) + [""]
        held = heldout_line(final)
        if held:
            lines += [held[0].upper() + held[1:] + " (the final system's gain outside the deployment's sets; "
                      "the same procedure on the project's own held-out set).", ""]
    else:
        why = run.get("errors") or ["interrupted, or disabled"]
        lines += ["No final benchmark in this run: " + "; ".join(why) + ".", ""]
    fs = r["final_system"]
    lines += [f"Final system `{fs['name']}`: {describe(fs['changes_from_stock'], fs.get('patch_summary'))}; estimated "
              f"{_pct(fs['estimated_gain_over_stock'])} over stock from the promotions' stored gains "
              f"(compounded {_pct(r['compounded_gain'])}).", "", "```toml", fs["toml"].strip(), "```", ""]
    if fs.get("on_device"):
        lines += ["The `#` notes say what ran on this run's device instead of the knob as set; the system is "
                  "stored as written, and runs so on a GPU.", ""]
    lines += ["## Promoted changes", ""]
    if r["promotions"]:
        rows = [[p["round"] or "-", f"`{p['name']}`", p["agent"], p.get("gap") or "-",
                 describe(p["changes"], p.get("patch_summary")),
                 format_gain(p["gain"], p["gain_lower"], p["gain_upper"]), _pct(p["threshold"]),
                 MEASURED.get(p.get("stage"), p.get("stage") or "n/a"), p["entry_id"]]
                for p in r["promotions"]]
        lines += _table(["round", "system", "agent", "gap", "change vs its incumbent", "gain (95% CI)",
                         "threshold", "measured", "memory entry"], rows)
        lines += ["", "Why each was proposed:", ""]
        lines += [f"- `{p['name']}`: {p['rationale'] or 'n/a'}" for p in r["promotions"]]
    else:
        lines += ["None: no candidate's lower bound cleared the promotion threshold."]
    lines += ["", "## Rounds", ""]
    for rd in r["rounds"]:
        cut = "" if rd["completed"] else " (cut short)"
        lines += [f"### Round {rd['index']}: incumbent `{rd['incumbent']}`{cut}", ""]
        if rd["cost"]:
            lines += ["```", _render_cost(rd["cost"]), "```", ""]
        if rd.get("slots"):
            lines.append(render_slots(rd["slots"]) + ".")
        lines.append("Proposals: " + ", ".join(f"{k} {v}" for k, v in (rd["proposals"] or {}).items())
                     + "".join(f"; {k} failed: {v}" for k, v in (rd["agent_errors"] or {}).items()) + ".")
        if rd["reused"]:
            judged = [f"`{x['proposal']['name']}` (entry {x['entry_id']}, {x['verdict']} {_pct(x.get('gain'))})"
                      for x in rd["reused"]]
            lines.append("Already judged by the memory (not timed again): " + ", ".join(judged) + ".")
        if rd["evaluations"]:
            rows = []
            for e in rd["evaluations"]:
                g = e.get("guard") or {}
                guard = "n/a" if not g else ("pass" if g.get("passed") else f"FAIL: {g.get('reason')}")
                rows.append([f"`{e['candidate']}`", e["agent"], e.get("gap") or "-",
                             describe(e["changes"], e.get("patch_summary")),
                             f"**{e['verdict']}** ({', '.join(e['reasons'])})",
                             format_gain(e["gain"], e["gain_lower"], e["gain_upper"]), _pct(e["lower_bound"]),
                             _pct(e["threshold"]), guard, e["entry_id"]])
            lines += [""] + _table(["candidate", "agent", "gap", "change", "verdict", "gain (95% CI)", "bound",
                                    "threshold", "guard", "entry"], rows)
        lines.append("")
    lines += render_patches(r)
    gb, ga = r["gaps"]["before"], r["gaps"]["after"]
    if gb or ga:
        lines += ["## Gaps before and after", ""]
        rows = []
        for key, label in (("ms_per_token", "ms per token"), ("tokens_per_round", "tokens per round"),
                           ("draft_ms", "draft ms / round"), ("verify_ms", "verify ms / round"),
                           ("overhead_ms", "overhead ms / round"), ("ceiling_ms_per_token", "ceiling ms per token")):
            rows.append([label, f"{gb[key]:.3f}" if gb else "n/a", f"{ga[key]:.3f}" if ga else "n/a"])
        for kind in ("verify-kernels", "draft-kernels", "overhead", "acceptance"):
            b = next((g["saving_ms_per_token"] for g in (gb or {}).get("gaps", []) if g["kind"] == kind), None)
            a = next((g["saving_ms_per_token"] for g in (ga or {}).get("gaps", []) if g["kind"] == kind), None)
            rows.append([f"gap {kind} (ms/token)", "n/a" if b is None else f"{b:.3f}",
                         "n/a" if a is None else f"{a:.3f}"])
        header = ["", f"before (`{gb['system'] if gb else '-'}`)", f"after (`{ga['system'] if ga else '-'}`)"]
        lines += _table(header, rows)
        lines.append("")
    n = r["noise"]
    c = r["controller"]
    lines += ["## Settings", "",
              f"- noise floor {n['value']:.2%} (stock vs stock over {n['estimate']['n']} blocks); promotion threshold "
              f"{n['threshold']:.2%} = {c['min_gain']:.0%} + {c['noise_multiplier']:g} x noise",
              f"- timing: {r['config']['timing']}: {c['blocks']} paired blocks (+{c['extra_blocks']} extra) of "
              f"{c['requests_per_block']} request(s) x {c['request_size']} prompt(s) x {c['max_new_tokens']} new "
              f"tokens; " + (f"{c['multiplicity']} across a round's {r['config']['max_candidates']} candidates; the "
                             "winner re-measured on fresh blocks" if r["config"]["max_candidates"] > 1 else
                             "one candidate per round, decided by its own comparison"),
              "- agents: " + "; ".join(f"{k} {'on' if v['enabled'] else 'off'}"
                                       + (f" ({v['reason']})" if v["reason"] else "") for k, v in r["agents"].items()),
              f"- start: {r['start']['note']}",
              *[f"- {seed_line(s)}" for s in r["start"].get("seeds", [])],
              f"- memory: {run['memory']}", "",
              "Written by `specpilot run`; every number is in report.json, every decision in decisions.jsonl.", ""]
    return "\n".join(lines)


PATCH_DIFF_LINES = 80  # lines of each promoted patch's diff in report.md (report.json has it all)


def patch_rows(r: dict) -> list[dict]:
    """Every evaluated candidate that changed the code, in round order (from the journal's records)."""
    return [{**e, "round": rd["index"]} for rd in r["rounds"] for e in rd["evaluations"] if e.get("patch_summary")]


def render_patches(r: dict) -> list[str]:
    """The "Code patches" section: each patch timed or rejected (files, +/- lines, verdict, gain), and
    the diffs of the promoted ones."""
    rows = patch_rows(r)
    promoted = [p for p in r["promotions"] if p.get("patch_summary")]
    if not rows and not promoted:
        return []
    lines = ["## Code patches", ""]
    if rows:
        table = []
        for e in rows:
            summary = e["patch_summary"]
            files = ", ".join(f"`{f['path']}` (+{f['added']} -{f['removed']})" for f in summary["files"])
            files += "".join(f"; reverts `{x}`" for x in summary.get("reverted", []))
            table.append([e["round"], f"`{e['candidate']}`", e["agent"], e.get("gap") or "-", files or "-",
                          f"**{e['verdict']}** ({', '.join(e['reasons'])})",
                          format_gain(e["gain"], e["gain_lower"], e["gain_upper"]), e["entry_id"]])
        lines += _table(["round", "candidate", "agent", "gap", "files (+/- lines over its incumbent)", "verdict",
                         "gain (95% CI)", "entry"], table) + [""]
    for p in promoted:
        gain = format_gain(p["gain"], p["gain_lower"], p["gain_upper"])
        lines += [f"Promoted `{p['name']}` (entry {p['entry_id']}, {gain}): {p['patch_summary']['line']}", "",
                  "```diff", excerpt(p["patch_diff"] or "", PATCH_DIFF_LINES), "```", ""]
    return lines


def seed_line(s: dict) -> str:
    """One seed of the run (a SEED record): where from, how similar, what was offered or why not."""
    head = f"`{s['source']}` (similarity {s['similarity']:.2f}: {s['differences']})"
    if s["offered"]:
        what = describe(s["changes"] or {}, s.get("patch_summary"))
        if s["has_patch"] and not s.get("patch_summary"):  # a record written before patch summaries
            what += " + patch"
        return f"seeded from {head}: `{s['candidate']}` ({what})"
    return f"not seeded from {head}: {s['skipped']}"


def render_slots(d: dict) -> str:
    """'Slots: knob 2 (acceptance <gap> ms/tok), kernel 1 (verify-kernels <gap> ms/tok)' from a SLOTS record."""
    from specpilot.loop.slots import SlotPlan

    seeds = f"seeds from similar deployments {d['seeds']}; " if d.get("seeds") else ""
    if "shares" not in d:
        return "Slots: " + seeds + "round-robin over " + ", ".join(d.get("agents", []))
    return "Slots: " + seeds + SlotPlan.from_dict(d).line().removeprefix("slots: ")


def _render_cost(d: dict) -> str:
    from specpilot.loop.cost_model import CostTable

    return CostTable.from_dict(d).render()
