"""What the journal says: the record and the human line of every decision a run and its rounds take.

`Reporter` speaks for the run (its start, the agents, the seeds, the noise floor, the budget, why it
stopped, the final measurement); `Reporter.round(index)` gives the `RoundReporter` of one round
(the incumbent's cost table, the slots, the proposals, the candidates timed, each verdict, the
promotion, the round's end). Each method takes the numbers of one decision and emits one record
(`Journal.emit`, kept in `decisions.jsonl` and read back by `report.py` and `--resume`) or says one
line (`Journal.say`, progress only). The wording is part of the interface: tests and readers of the
journal compare it.

Owns: the journal's text and the records' fields. Does not own what is decided (`run.py`,
`rounds.py`, `noise.py`), the journal's format (`journal.py`) or report.json/report.md (`report.py`).
"""

from __future__ import annotations

from specpilot.control.rule import Outcome, promotion_threshold
from specpilot.loop.config import rounds_text
from specpilot.loop.budget_plan import plan_line, waited_line
from specpilot.loop.journal import EventKind


def final_text(reserve: float, final: bool) -> str:
    """The final measurement's part of a budget line ("" for a run without one)."""
    return f" and the final measurement (~{reserve:.0f} s)" if final else ""


class Reporter:
    """The run's journal text; `journal` is a `Journal` (or anything with its `emit` and `say`)."""

    def __init__(self, journal):
        self.journal = journal

    def round(self, index: int) -> RoundReporter:
        return RoundReporter(self.journal, index)

    def say(self, text: str) -> None:
        self.journal.say(text)

    # ---- setup -------------------------------------------------------------------------------
    def start(self, *, config, deployment_file: str, deployment, fingerprint, backend, devices, paths,
              controller_config, memory, resumed: bool, start) -> None:
        c, dep, device_name = config, deployment, backend.device_name()
        budget = f"budget {c.budget_minutes:g} min" if c.budget_minutes else "no time budget"
        self.journal.emit(
            EventKind.START, f"specpilot run: deployment {dep.name!r} [{fingerprint.digest}] on "
            f"{device_name} ({len(devices)} device(s), {backend.placement.value}); "
            f"{rounds_text(c.rounds)}, {budget}, timing {c.timing.value}; report in {paths.out}\n{start.note}", 0,
            deployment=dep.name, deployment_file=deployment_file, fingerprint=fingerprint.digest,
            device=device_name, devices=list(devices), placement=backend.placement.value,
            config=c.to_dict(), controller=controller_config.to_dict(), memory=str(memory.path),
            resumed=resumed, incumbent=start.incumbent.name, incumbent_entry=start.incumbent.entry_id,
            next_round=start.next_round, rounds_done=start.rounds_done)

    def agent(self, name: str, status) -> None:
        self.journal.emit(EventKind.AGENT, f"agent {name}: {'on' if status.enabled else 'off'}"
                          + (f" - {status.reason}" if status.reason else ""), 0, agent=name,
                          enabled=status.enabled, reason=status.reason)

    def seed(self, seed) -> None:
        self.journal.emit(EventKind.SEED, seed.line(), 0, **seed.to_dict())

    def waited(self, waited: float, left: float, budget: float) -> None:
        self.journal.say(waited_line(waited, left, budget))

    def loaded(self, deployment_name: str) -> None:
        self.journal.say(f"loaded {deployment_name} in this process (profiles, the guard's scorer, the final "
                         "benchmark)")

    # ---- the noise floor ---------------------------------------------------------------------
    def noise_first(self, left: float) -> None:
        self.journal.say(f"budget: {left:.0f} s left; the noise floor is measured first, which the budget cannot "
                         "shorten; what fits after it is said before the first round")

    def noise(self, choice, controller_config, *, measured: bool, note: str, saturated=(0, 0), index: int = 0) -> None:
        """The noise floor chosen (`noise.NoiseChoice`): measured now, or reused from the memory."""
        noise, ccfg = choice.floor, controller_config
        sat, pairs = saturated
        on = f", {sat}/{pairs} request pairs on saturated stretches" if sat else ""
        est, threshold = noise.estimate, promotion_threshold(ccfg, noise)
        self.journal.emit(
            EventKind.NOISE, f"noise floor {noise.value:.2%} ({'measured now' if measured else 'from the memory'}, "
            f"stock vs stock {est.gain:+.2%} [{est.lower:+.2%}, {est.upper:+.2%}] over {est.n} blocks{on}); promotion "
            f"threshold {threshold:.2%} = {ccfg.min_gain:.0%} + {ccfg.noise_multiplier:g} x noise\n"
            f"  {note}", index, noise=noise.to_dict(), noise_id=choice.id, measured=measured,
            threshold=threshold, load=choice.load.to_dict(), why=note)

    def load_changed(self, index: int, why: str, keeping: bool) -> None:
        if keeping:
            self.journal.say(f"round {index}: the load changed since the noise floor was measured ({why}); "
                             "no time left to choose it again: keeping it")
        else:
            self.journal.say(f"round {index}: the load changed since the noise floor was measured ({why}): "
                             "choosing it again")

    # ---- the budget, before a round ----------------------------------------------------------
    def no_budget(self, rounds: int, estimate: float, reserve: float, final: bool) -> None:
        total_min = (rounds * estimate + reserve) / 60
        self.journal.say(f"no time budget: {rounds} round(s) of ~{estimate:.0f} s{final_text(reserve, final)}, about "
                         f"{total_min:.1f} min (estimated from the noise measurement)")

    def plan(self, left: float, rounds: int, estimate: float, reserve: float | None, fitting: int,
             candidates: int) -> None:
        self.journal.say(plan_line(left, rounds, estimate, reserve, fitting, candidates))

    def fewer_candidates(self, index: int, candidates: int, full: int, estimate: float, reserve: float, final: bool,
                         left: float) -> None:
        self.journal.say(f"round {index}: {candidates} candidate(s) instead of {full}: a full round "
                         f"(~{estimate:.0f} s){final_text(reserve, final)} would not fit in the {left:.0f} s left")

    def contended(self, index: int, load) -> None:
        self.journal.say(f"round {index} was timed under contention ({load.describe()}): its verdicts are "
                         "stored as contended, and later rounds and runs do not take them as final")

    # ---- why the rounds stopped --------------------------------------------------------------
    def no_time_to_measure(self, stop, index: int, measure_s: float, reserve: float, final: bool,
                           left: float) -> None:
        self.journal.emit(EventKind.STOP, f"stopping: measuring the new incumbent (~{measure_s:.0f} s) for round "
                          f"{index}{final_text(reserve, final)} would not fit in the {left:.0f} s left", index,
                          reason=stop.value, measure_estimate_s=measure_s, final_estimate_s=reserve, left_s=left)

    def no_round_fits(self, stop, index: int, estimate: float, reserve: float, final: bool, left: float) -> None:
        self.journal.emit(EventKind.STOP, f"stopping: round {index} (~{estimate:.0f} s){final_text(reserve, final)} "
                          f"would not fit in the {left:.0f} s left", index,
                          reason=stop.value, round_estimate_s=estimate, final_estimate_s=reserve, left_s=left)

    def no_candidate_fits(self, stop, index: int, reserve: float, final: bool, left: float) -> None:
        beside = f" beside the final measurement (~{reserve:.0f} s)" if final else ""
        self.journal.emit(EventKind.STOP, f"stopping: no candidate of round {index} fits{beside} in the {left:.0f} s "
                          "left", index, reason=stop.value, final_estimate_s=reserve, left_s=left)

    def converged(self, stop, idle: int, index: int) -> None:
        self.journal.emit(EventKind.STOP, f"stopping: {idle} round(s) in a row with nothing new to time", index,
                          reason=stop.value)

    def rounds_done(self, stop, done: int, index: int) -> None:
        self.journal.emit(EventKind.STOP, f"stopping: {done} round(s) done", index, reason=stop.value)

    def interrupted(self, stop, index: int) -> None:
        self.journal.emit(EventKind.STOP, "interrupted: writing the report without the final benchmark", index,
                          reason=stop.value)

    def round_failed(self, stop, index: int, err) -> None:
        self.journal.emit(EventKind.STOP, f"stopping: round {index} failed: {err}", index, reason=stop.value,
                          error=str(err))

    # ---- after the rounds --------------------------------------------------------------------
    def cost_table_failed(self, stop, err) -> None:
        self.journal.emit(EventKind.STOP, f"measuring the final system's cost table failed: {err}", 0,
                          reason=stop.value, error=str(err))

    def no_time_for_cost_table(self, measure_s: float, final: bool) -> None:
        self.journal.say(f"budget: no time left to measure the final system's cost table (~{measure_s:.0f} s"
                         f"{' before the final measurement' if final else ''}): the report goes without "
                         "its gaps after the run")

    def final_skipped(self, stop, reserve: float, left: float) -> None:
        self.journal.emit(EventKind.STOP, f"skipping the final measurement (~{reserve:.0f} s): it would not fit "
                          f"in the {max(0.0, left):.0f} s left of the budget", 0, reason=stop.value,
                          error=f"the final measurement (~{reserve:.0f} s) did not fit in the budget's time left",
                          final_estimate_s=reserve, left_s=left)

    def final_interrupted(self, stop) -> None:
        self.journal.emit(EventKind.STOP, "interrupted during the final measurement: writing the report without it",
                          0, reason=stop.value)

    def final_failed(self, stop, err) -> None:
        self.journal.emit(EventKind.STOP, f"the final measurement failed: {err}", 0, reason=stop.value,
                          error=str(err))

    def final_start(self, also: str, described: str) -> None:
        self.journal.say(f"final measurement: AR, stock{also} {described}")

    def final(self, final) -> None:
        """Stock and the final system against AR (`final.FinalResult`)."""
        from specpilot.loop.final import serving_line
        from specpilot.loop.report import format_speedup, heldout_line

        s, f, g = final.stock_speedup, final.final_speedup, final.final_gain
        over = f"; final / stock {format_speedup(g)}" if g else " (the final system is stock)"
        doc = final.to_dict()
        rates = f"\n  {serving_line(doc)}" if final.serving else ""
        held = heldout_line(doc)
        held = f"\n  {held}" if held else ""
        note = f"\n  note: {final.note}" if final.note else ""
        self.journal.emit(EventKind.FINAL, f"speedup over AR (same run, 95% intervals): stock {format_speedup(s)}; "
                          f"final {format_speedup(f)}{over}{rates}{held}{note}", 0, stock_speedup=s, final_speedup=f,
                          final_gain=g, regime="serving" if final.serving else "batch", note=final.note,
                          seconds=final.seconds, heldout_gain=final.heldout_gain,
                          heldout_final_speedup=(doc["heldout"] or {}).get("final_speedup"),
                          heldout_note=final.heldout_note)

    def wrote(self, files) -> None:
        self.journal.emit(EventKind.REPORT, "wrote " + ", ".join(str(f) for f in files), 0,
                          files=[str(f) for f in files])


class RoundReporter:
    """The journal text of round `index` (`rounds.run_round`)."""

    def __init__(self, journal, index: int):
        self.journal, self.index = journal, index

    def agent_line(self, line: str) -> None:
        """A line an agent says while it proposes (`ProposerContext.log`)."""
        self.journal.say(f"  {line}")

    def incumbent(self, inc, cost) -> None:
        top = cost.top
        self.journal.emit(EventKind.MEASURE, f"round {self.index}: incumbent {inc.name!r} ({inc.cumulative_gain:+.1%} "
                          f"over stock so far); largest gap: {top.kind.value if top else 'none'}\n{cost.render()}",
                          self.index, incumbent=inc.name, incumbent_hash=inc.candidate.hash, cost=cost.to_dict())

    def slots(self, seeds, plan, policy, agents) -> None:
        line = plan.line() if plan else "slots: round-robin over " + ", ".join(a.name for a in agents)
        self.journal.emit(EventKind.SLOTS, (f"seeds {len(seeds)}; " if seeds else "") + line, self.index,
                          seeds=len(seeds), policy=policy.value, agents=[a.name for a in agents],
                          **(plan.to_dict() if plan else {}))

    def asking(self, selected: int, candidates: int, active, idle) -> None:
        what = "nothing new" if not selected else f"{candidates - selected} slot(s) left"
        self.journal.say(f"  {what} from {', '.join(a.name for a in active) or 'the seeds'}: asking "
                         f"{', '.join(a.name for a in idle)}")

    def proposals(self, counts: dict, errors: dict, asked_without_slot: list) -> None:
        self.journal.emit(EventKind.PROPOSALS, "proposals: " + ", ".join(
            f"{name} {n}" + (f" (failed: {errors[name]})" if name in errors else "") for name, n in counts.items()),
            self.index, counts=counts, errors=errors, asked_without_slot=asked_without_slot)

    def reused(self, reused, inc) -> None:
        for p, record in reused:
            gain = f" ({record.gain:+.1%})" if record.gain is not None else ""
            self.journal.emit(EventKind.REUSED, f"  already in the memory, not timed again: {p.candidate.name} -> "
                              f"entry {record.id} {record.verdict.value}{gain}",
                              self.index, proposal=p.to_dict(inc.candidate), entry_id=record.id,
                              verdict=record.verdict.value, gain=record.gain, gain_lower=record.gain_lower,
                              gain_upper=record.gain_upper)

    def nothing_new(self, seconds: float, why: str = "nothing new to time") -> None:
        self.journal.emit(EventKind.ROUND_END, f"round {self.index}: {why}", self.index, promoted=None,
                          nothing_new=True, seconds=seconds)

    def left_out(self, out, kept: int, seconds: float, reserve: float, final: bool, left: float) -> None:
        """`out`: (proposal, `budget.CandidateCost`) of each candidate left out; the `kept` others are
        timed in ~`seconds`."""
        def cost(c) -> str:
            warmup = f", a compile warm-up of ~{c.warmup:.0f} s included" if c.warmup else ""
            after = f"; the final measurement ~{c.final:.0f} s after it" if final and c.final > reserve else ""
            return f"~{c.screen:.0f} s{warmup}{after}"

        beside = f" beside the final measurement (~{reserve:.0f} s)" if final else ""
        then = f"timing the {kept} that fit (~{seconds:.0f} s)" if kept else "none fits"
        self.journal.say(f"round {self.index}: leaving out {len(out)} of {len(out) + kept} candidate(s), whose "
                         f"comparisons would not fit{beside} in the {left:.0f} s left: "
                         + ", ".join(f"{p.candidate.name} ({cost(c)})" for p, c in out) + f"; {then}")

    def selected(self, selected, inc, powers=None) -> None:
        """`powers`: per candidate, None (timed as configured) or (its blocks factor, the powered
        `ControllerConfig` it is retimed with, its undecided `MemoryRecord`s against `inc`, newest first)."""
        powers = powers or [None] * len(selected)
        lines = []
        for i, (p, power) in enumerate(zip(selected, powers)):
            lines.append(f"  {i + 1}. {p.candidate.name} [{p.agent}{' -> ' + p.gap.value if p.gap else ''}] "
                         f"{p.candidate.describe_changes(inc.candidate)}: {p.rationale}")
            if power is not None:
                lines.append(f"     {retime_text(*power)}")
        candidates = [p.to_dict(inc.candidate) for p in selected]
        for c, power in zip(candidates, powers):
            if power is not None:
                factor, config, undecided = power
                c["retime"] = {"factor": factor, "blocks": config.blocks, "extra_blocks": config.extra_blocks,
                               "extra_step": config.extra_step, "undecided": [r.id for r in undecided],
                               "rounds": [r.round for r in undecided]}
        self.journal.emit(EventKind.SELECTED, f"timing {len(selected)} candidate(s) against {inc.name!r}:\n"
                          + "\n".join(lines), self.index, candidates=candidates)

    def evaluation(self, p, e, entry: int, inc) -> None:
        self.journal.emit(EventKind.EVALUATION, evaluation_line(p, e, entry), self.index,
                          **evaluation_record(p, e, entry, inc.candidate))

    def promotion(self, new_inc, inc, entry_id: int, gain: float) -> None:
        self.journal.emit(EventKind.PROMOTION, f"promoted {new_inc.name!r}: {gain:+.1%} over {inc.name!r}, "
                          f"{new_inc.cumulative_gain:+.1%} over stock compounded", self.index,
                          incumbent=new_inc.name, incumbent_hash=new_inc.candidate.hash, entry_id=entry_id,
                          gain=gain, cumulative_gain=new_inc.cumulative_gain, previous=inc.name)

    def done(self, seconds: float, promoted: str | None) -> None:
        self.journal.emit(EventKind.ROUND_END, f"round {self.index} done in {seconds:.0f} s: "
                          + (f"{promoted!r} promoted" if promoted else "no promotion"), self.index,
                          promoted=promoted, nothing_new=False, seconds=seconds)


def retime_text(factor: int, config, undecided) -> str:
    """Why a candidate is timed with more power: `factor` times the blocks, `config` the powered
    controller config, `undecided` its undecided records against this incumbent (newest first)."""
    rounds = ", ".join(r.round or f"entry {r.id}" for r in reversed(undecided))
    return (f"retimed at {factor}x blocks ({config.blocks}+{config.extra_blocks} in steps of {config.extra_step}, "
            f"same looks): undecided against this incumbent in {rounds}")


def evaluation_record(p, e, entry: int, incumbent) -> dict:
    """The numbers of one decision, for the journal: proposal `p`, its `control.controller.Evaluation`
    `e`, its memory `entry`, against the `incumbent` candidate."""
    d, est = e.decision, e.estimate
    gate = e.gate
    guard = None
    if gate is not None:
        s = gate.summary
        cand, stock = s.get("candidate") or {}, s.get("stock") or {}
        guard = {"passed": gate.passed, "reason": gate.reason, "candidate_rate": cand.get("rate"),
                 "stock_rate": stock.get("rate"), "candidate_large_margin": cand.get("large_margin"),
                 "bound": s.get("bound"), "violated": s.get("violated"), "kind": s.get("guard")}
        if s.get("guard") == "sampling":  # PIT uniformity (`guard.sampling`): p-values and tokens, no rates
            guard.update(candidate_p=cand.get("p_value"), stock_p=stock.get("p_value"),
                         candidate_tokens=cand.get("tokens"), candidate_zero_probability=cand.get("zero_probability"),
                         cautions=s.get("cautions"))
    return {
        "candidate": p.candidate.name, "hash": p.hash, "agent": p.agent, "rationale": p.rationale,
        "gap": p.gap.value if p.gap else None,
        "changes": p.candidate.changes_from(incumbent), "patch_summary": _summary(p.candidate.patch_summary(incumbent)),
        "incumbent": incumbent.name, "entry_id": entry,
        "stage": e.stage.value, "verdict": d.verdict.value, "reasons": [x.value for x in d.reasons],
        "gain": est.gain if est else None, "gain_lower": est.lower if est else None,
        "gain_upper": est.upper if est else None, "blocks": est.n if est else 0,
        "lower_bound": d.lower_bound, "threshold": d.threshold, "noise": e.noise.value if e.noise else None,
        "p_value": d.p_value, "adjusted_p": e.adjusted_p, "guard": guard, "error": e.error,
        "screening_gain": e.screening.estimate.gain if e.screening and e.screening.estimate else None,
        "costs": e.costs.to_dict(), "predicted_ms_per_token": p.predicted_ms_per_token,
    }


def _summary(summary) -> dict | None:
    return summary.to_dict() if summary is not None else None


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def evaluation_line(p, e, entry: int) -> str:
    """One verdict's human line: the mark, the reasons, the gain and its bound, the guard."""
    d, est = e.decision, e.estimate
    mark = {Outcome.PROMOTE: "+", Outcome.REJECT: "x", Outcome.NEED_MORE_DATA: "?"}[d.verdict]
    head = f"  [{mark}] {d.verdict.value.upper()} {p.candidate.name} ({', '.join(x.value for x in d.reasons)})"
    parts = []
    if est is not None:
        sat, pairs = e.saturated
        on = f" ({sat}/{pairs} request pairs on saturated stretches)" if sat else ""
        parts.append(f"gain {_pct(est.gain)} [{_pct(est.lower)}, {_pct(est.upper)}] over {est.n} blocks{on}, "
                     f"bound {_pct(d.lower_bound)} vs threshold {_pct(d.threshold)} (noise {e.noise.value:.1%})")
    if e.gate is not None:
        kind = "sampling guard" if e.gate.summary.get("guard") == "sampling" else "guard"
        parts.append(f"{kind} pass" if e.gate.passed else f"{kind} FAILED: {e.gate.reason}")
    if e.forced is not None:  # the gate again, on a sample of the timed requests' outputs
        parts.append("timed outputs pass" if e.forced.passed else f"timed outputs FAILED the guard: {e.forced.reason}")
    if e.error:
        parts.append(f"error: {e.error[:160]}")
    return head + (": " + "; ".join(parts) if parts else "") + f" -> memory entry {entry}"
