"""One round of the loop: gap -> proposals (in parallel) -> guard -> paired timing -> promotion -> memory.

    1. measure   profile the incumbent; its cost table (ceiling, gaps ranked) is printed and logged
    2. slots     the round's `max_candidates` slots are split over the enabled agents by the time
                 the gaps each can close would save, with an exploration slot now and then
                 (`slots.py`); seeds from similar deployments (`seeds.py`), offered in a run's first
                 round, take slots first (all but one, when agents are enabled)
    3. propose   every agent with a slot proposes from the same frozen context (its `limit` is its
                 slots), in parallel threads; agents without one are not asked this round
    4. select    the seeds, then each agent's best proposals up to its slots, then any slots left
                 round-robin over the lists: a proposal equal to the incumbent is dropped; one the
                 memory already judged is not timed again, its stored verdict is logged and reused.
                 When nothing new is left, the agents without a slot are asked before the round
                 counts as idle
    5. evaluate  the noise floor is chosen (again, when the load changed: `choose_noise`), then
                 `Controller.evaluate_round`: each candidate is gated by token forcing (a failure
                 rejects it untimed), timed against the incumbent in paired blocks, p-values are
                 corrected across the round (Holm), and the significant winner is re-measured on
                 fresh blocks; that re-measurement decides
    6. record    every final evaluation goes to the memory (with its patch and the incumbent's)
    7. promote   the winner, if its re-measured lower bound clears 1% + 2 x noise, is the new
                 incumbent; its compounded gain over stock is carried along
Every step emits a journal record with its numbers (`journal.py`). Worktrees of patch candidates
that were not promoted are removed at the end of the round.

Owns: `RoundInputs`, `RoundOutcome`, `run_round`, selection, the evaluation records. Does not own
measuring, splitting slots, proposing, timing, judging or storing (it calls each).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from specpilot.control.config import ControllerConfig
from specpilot.control.controller import Controller, Evaluation
from specpilot.control.defaults import source_commit
from specpilot.control.rule import Outcome
from specpilot.control.stats import NoiseFloor
from specpilot.loop.agents.base import LoopSetup, Proposal, Proposer, ProposerContext
from specpilot.loop.config import SlotPolicy
from specpilot.loop.agents.kernel import promote_table
from specpilot.loop.cost_model import CostTable
from specpilot.loop.journal import EventKind, Journal
from specpilot.loop.recall import Recall
from specpilot.loop.slots import SlotPlan, allocate, closes
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import remove
from specpilot.memory.fingerprint import DeploymentFingerprint
from specpilot.memory.records import MemoryRecord
from specpilot.memory.store import Memory


@dataclass(frozen=True)
class RoundInputs:
    index: int
    label: str
    setup: LoopSetup
    incumbent: Incumbent
    stock: Candidate
    agents: tuple[Proposer, ...]  # the enabled ones
    controller: Controller
    config: ControllerConfig
    noise: NoiseFloor
    noise_id: int | None
    memory: Memory
    fingerprint: DeploymentFingerprint
    deployment_file: str  # what workers load
    runner: str  # runner factory of the workers
    max_candidates: int
    measure: Callable[[Candidate], CostTable]  # the incumbent's cost table
    models: object | None = None  # the loop's session (for agents that measure in-process)
    cost: CostTable | None = None  # the incumbent's cost table when already measured (skips step 1)
    history: tuple = ()  # (System, CostTable) measured earlier in the run, for the agents
    seed: int = 0  # the run's seed (which rounds explore, and with whom)
    seeds: tuple[Proposal, ...] = ()  # systems validated on similar deployments, timed first (`seeds.py`)
    slots: SlotPolicy = SlotPolicy.GAPS  # how the slots are shared among the agents
    # called once the round has candidates to time, before timing them: the noise floor to judge
    # them by and its memory id (the loop chooses it again there when the load changed, so a round
    # with nothing new to time measures nothing); its seconds do not count as the round's
    choose_noise: Callable[[], tuple[NoiseFloor, int | None]] | None = None


@dataclass(frozen=True)
class Evaluated:
    proposal: Proposal
    evaluation: Evaluation
    entry_id: int


@dataclass(frozen=True)
class RoundOutcome:
    index: int
    label: str
    incumbent_before: Incumbent
    incumbent_after: Incumbent
    cost: CostTable
    proposals: int  # all proposals the agents returned
    selected: tuple[Proposal, ...] = ()
    reused: tuple[tuple[Proposal, MemoryRecord], ...] = ()
    evaluated: tuple[Evaluated, ...] = ()
    promoted: Evaluated | None = None
    seconds: float = 0.0
    agent_errors: dict = field(default_factory=dict)
    plan: SlotPlan | None = None  # how the round's slots were split over the agents

    @property
    def nothing_new(self) -> bool:
        return not self.selected


def run_round(r: RoundInputs, journal: Journal) -> RoundOutcome:
    start = time.monotonic()
    inc = r.incumbent
    cost = r.cost or r.measure(inc.candidate)
    top = cost.top
    journal.emit(EventKind.MEASURE, f"round {r.index}: incumbent {inc.name!r} ({inc.cumulative_gain:+.1%} over stock "
                 f"so far); largest gap: {top.kind.value if top else 'none'}\n{cost.render()}", r.index,
                 incumbent=inc.name, incumbent_hash=inc.candidate.hash, cost=cost.to_dict())
    recall = Recall.snapshot(r.memory, r.fingerprint)
    settled = {inc.candidate.hash} | set(inc.lineage)
    seeds = [p for p in r.seeds if p.hash not in settled and recall.verdict(p.hash) is None]
    seeds = seeds[: r.max_candidates - 1 if r.agents and r.max_candidates > 1 else r.max_candidates]
    plan = None if r.slots is SlotPolicy.ROUND_ROBIN else allocate(
        cost, [(a.name, closes(a)) for a in r.agents], r.max_candidates - len(seeds), r.index, r.seed)
    line = plan.line() if plan else "slots: round-robin over " + ", ".join(a.name for a in r.agents)
    journal.emit(EventKind.SLOTS, (f"seeds {len(seeds)}; " if seeds else "") + line, r.index, seeds=len(seeds),
                 policy=r.slots.value, agents=[a.name for a in r.agents], **(plan.to_dict() if plan else {}))
    ctx = ProposerContext(r.setup, r.index, r.label, inc, r.stock, cost, recall, r.max_candidates, r.models,
                          r.history, lambda line: journal.say(f"  {line}"))
    active = r.agents if plan is None else tuple(a for a in r.agents if plan.slots(a.name) > 0)
    lists, errors = propose_all(active, ctx, None if plan is None else {a.name: plan.slots(a.name) for a in active})
    order = [a.name for a in active] if plan is None else plan.active
    quotas = None if plan is None else {name: plan.slots(name) for name in order}
    selected, reused, dropped = select({name: lists[name] for name in order if name in lists}, inc, recall,
                                       r.max_candidates, quotas, first=seeds)
    idle = tuple(a for a in r.agents if a not in active)
    if len(selected) < r.max_candidates and idle:
        # the agents the gaps chose (and the seeds) leave slots empty: before a slot goes unused, or
        # the round counts as idle (and the run converges), the others are asked for them
        what = "nothing new" if not selected else f"{r.max_candidates - len(selected)} slot(s) left"
        journal.say(f"  {what} from {', '.join(a.name for a in active) or 'the seeds'}: asking "
                    f"{', '.join(a.name for a in idle)}")
        more, more_errors = propose_all(idle, ctx)
        lists.update(more)
        errors.update(more_errors)
        known = {p.hash for p, _ in reused}
        selected, again, more_dropped = select(more, inc, recall, r.max_candidates, first=selected)
        reused += [(p, rec) for p, rec in again if p.hash not in known]
        dropped += more_dropped
        active += idle
    counts = {a.name: len(lists[a.name]) for a in active}
    journal.emit(EventKind.PROPOSALS, "proposals: " + ", ".join(
        f"{name} {n}" + (f" (failed: {errors[name]})" if name in errors else "") for name, n in counts.items()),
        r.index, counts=counts, errors=errors, asked_without_slot=[a.name for a in idle if a.name in counts])
    for p, record in reused:
        gain = f" ({record.gain:+.1%})" if record.gain is not None else ""
        journal.emit(EventKind.REUSED, f"  already in the memory, not timed again: {p.candidate.name} -> entry "
                     f"{record.id} {record.verdict.value}{gain}",
                     r.index, proposal=p.to_dict(inc.candidate), entry_id=record.id, verdict=record.verdict.value,
                     gain=record.gain, gain_lower=record.gain_lower, gain_upper=record.gain_upper)
    release(dropped, keep=(inc.candidate, *(p.candidate for p in selected)), setup=r.setup)
    if not selected:
        journal.emit(EventKind.ROUND_END, f"round {r.index}: nothing new to time", r.index, promoted=None,
                     nothing_new=True, seconds=time.monotonic() - start)
        return RoundOutcome(r.index, r.label, inc, inc, cost, sum(counts.values()), (), tuple(reused), (), None,
                            time.monotonic() - start, errors, plan)
    noise, noise_id, chosen = r.noise, r.noise_id, 0.0
    if r.choose_noise is not None:
        t = time.monotonic()
        noise, noise_id = r.choose_noise()
        chosen = time.monotonic() - t
    journal.emit(EventKind.SELECTED, f"timing {len(selected)} candidate(s) against {inc.name!r}:\n" + "\n".join(
        f"  {i + 1}. {p.candidate.name} [{p.agent}{' -> ' + p.gap.value if p.gap else ''}] "
        f"{p.candidate.describe_changes(inc.candidate)}: {p.rationale}"
        for i, p in enumerate(selected)), r.index, candidates=[p.to_dict(inc.candidate) for p in selected])
    specs = [p.candidate.runner_spec(r.deployment_file, r.runner) for p in selected]
    result = r.controller.evaluate_round(inc.candidate.runner_spec(r.deployment_file, r.runner), specs, noise)
    commit = source_commit()
    evaluated = []
    for p, e in zip(selected, result.evaluations, strict=True):
        entry = r.memory.record_evaluation(r.fingerprint, e, r.config, round=r.label, patch=p.candidate.patch,
                                           incumbent_patch=inc.candidate.patch, noise_id=noise_id, commit=commit)
        evaluated.append(Evaluated(p, e, entry))
        journal.emit(EventKind.EVALUATION, evaluation_line(p, e, entry), r.index,
                     **evaluation_record(p, e, entry, inc.candidate))
    promoted = next((x for x in evaluated if x.evaluation.verdict is Outcome.PROMOTE
                     and result.promoted is x.evaluation), None)
    new_inc = inc
    if promoted is not None:
        gain = promoted.evaluation.estimate.gain
        new_inc = inc.promote(promoted.proposal.candidate, promoted.entry_id, gain, r.label)
        promote_table(inc.candidate.system, new_inc.candidate.system, r.setup.device_name)  # into the user cache
        journal.emit(EventKind.PROMOTION, f"promoted {new_inc.name!r}: {gain:+.1%} over {inc.name!r}, "
                     f"{new_inc.cumulative_gain:+.1%} over stock compounded", r.index,
                     incumbent=new_inc.name, incumbent_hash=new_inc.candidate.hash, entry_id=promoted.entry_id,
                     gain=gain, cumulative_gain=new_inc.cumulative_gain, previous=inc.name)
    release(selected, keep=(new_inc.candidate, inc.candidate), setup=r.setup)
    seconds = time.monotonic() - start - chosen
    journal.emit(EventKind.ROUND_END, f"round {r.index} done in {seconds:.0f} s: "
                 + (f"{new_inc.name!r} promoted" if promoted else "no promotion"), r.index,
                 promoted=new_inc.name if promoted else None, nothing_new=False, seconds=seconds)
    return RoundOutcome(r.index, r.label, inc, new_inc, cost, sum(counts.values()), tuple(selected), tuple(reused),
                        tuple(evaluated), promoted, seconds, errors, plan)


def propose_all(agents: tuple[Proposer, ...], ctx: ProposerContext,
                limits: dict[str, int] | None = None) -> tuple[dict, dict]:
    """({agent: proposals}, {agent: error line}); agents run in parallel threads, each with its own
    `limit` in the context when `limits` names it."""
    def run(agent):
        try:
            own = replace(ctx, limit=limits[agent.name]) if limits and agent.name in limits else ctx
            return agent.propose(own), None
        except Exception as err:
            return [], f"{type(err).__name__}: {err}".splitlines()[0][:300]

    with ThreadPoolExecutor(max_workers=max(1, len(agents)), thread_name_prefix="agent") as pool:
        results = list(pool.map(run, agents))
    lists = {a.name: list(res) for a, (res, _) in zip(agents, results)}
    errors = {a.name: err for a, (_, err) in zip(agents, results) if err}
    return lists, errors


def select(lists: dict[str, list[Proposal]], incumbent: Incumbent, recall: Recall, limit: int,
           quotas: dict[str, int] | None = None, first=()):
    """(selected, reused [(proposal, record)], dropped): `first` in order, then each agent's list
    (best first, in the order of `lists`) up to its quota of new proposals, then the slots left
    round-robin over what remains of the lists (without quotas: all round-robin)."""
    queues = {name: list(v) for name, v in lists.items()}
    # the incumbent, and the systems it was promoted over, are settled: never proposed again
    selected, reused, dropped, seen = [], [], [], {incumbent.candidate.hash} | set(incumbent.lineage)

    def take(p: Proposal) -> bool:
        """Classify `p`; True when it was selected."""
        record = recall.verdict(p.hash)
        new = p.hash not in seen and len(selected) < limit and record is None
        if new:
            selected.append(p)
        else:
            dropped.append(p)
            if p.hash not in seen and len(selected) < limit and record is not None:
                reused.append((p, record))
        seen.add(p.hash)
        return new

    for p in first:
        take(p)
    for name, q in queues.items():
        got = 0
        while q and got < (quotas or {}).get(name, 0) and len(selected) < limit:
            got += take(q.pop(0))
    while any(queues.values()):
        for q in queues.values():
            if q:
                take(q.pop(0))
    return selected, reused, dropped


def release(proposals, keep: tuple[Candidate, ...], setup: LoopSetup) -> None:
    """Remove the worktrees of `proposals` that no kept candidate uses."""
    if setup.checkout is None:
        return
    kept = {c.workdir for c in keep if c.workdir}
    for p in proposals:
        w = p.candidate.workdir
        if w and w not in kept and Path(w).is_relative_to(setup.scratch):
            remove(setup.checkout.root, Path(w))


def evaluation_record(p: Proposal, e: Evaluation, entry: int, incumbent: Candidate) -> dict:
    """The numbers of one decision, for the journal."""
    d, est = e.decision, e.estimate
    gate = e.gate
    guard = None
    if gate is not None:
        s = gate.summary
        cand, stock = s.get("candidate") or {}, s.get("stock") or {}
        guard = {"passed": gate.passed, "reason": gate.reason, "candidate_rate": cand.get("rate"),
                 "stock_rate": stock.get("rate"), "candidate_large_margin": cand.get("large_margin"),
                 "bound": s.get("bound"), "violated": s.get("violated")}
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


def evaluation_line(p: Proposal, e: Evaluation, entry: int) -> str:
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
        parts.append("guard pass" if e.gate.passed else f"guard FAILED: {e.gate.reason}")
    if e.forced is not None:  # the gate again, on a sample of the timed requests' outputs
        parts.append("timed outputs pass" if e.forced.passed else f"timed outputs FAILED the guard: {e.forced.reason}")
    if e.error:
        parts.append(f"error: {e.error[:160]}")
    return head + (": " + "; ".join(parts) if parts else "") + f" -> memory entry {entry}"
