"""One round of the loop: gaps -> proposals (in parallel) -> guard -> paired timing -> promotion -> memory.

    1. gaps      the incumbent's cost table (measured by the run before the round, `run.py`: the
                 budget needs its time) is printed and logged; the round's slots are split over the
                 enabled agents by the time the gaps each can close would save, with an exploration
                 slot now and then (`slots.py`); seeds from similar deployments (`seeds.py`), offered
                 in a run's first round, take slots first (all but one, when agents are enabled)
    2. propose   every agent with a slot proposes from the same frozen context (its `limit` is its
                 slots), in parallel threads; agents without one are not asked this round
    3. select    the seeds, then each agent's best proposals up to its slots, then any slots left
                 round-robin over the lists: a proposal equal to the incumbent is dropped; one the
                 memory already judged is not timed again, its stored verdict is logged and reused.
                 When nothing new is left, the agents without a slot are asked before the round
                 counts as idle
    4. guard and timing
                 a candidate left undecided against this incumbent before is retimed with more
                 power (`Recall.undecided_against`, `recall.retime_factor`: 2x the blocks at every
                 look after one undecided verdict, 4x after two; same looks, same alpha per look,
                 fresh blocks), its cost in the budget scaled alike and the reason on its line;
                 the noise floor is chosen (again, when the load changed: `choose_noise`); with a
                 budget, only the candidates whose comparisons fit beside the final measurement
                 are kept, in order (`budget.fitting_selection`: a compile warm-up makes a
                 candidate dear), the others left out with a line saying so; then
                 `Controller.evaluate_round`: each candidate is gated by token forcing (a failure
                 rejects it untimed), timed against the incumbent in paired blocks, p-values are
                 corrected across the round (Holm), and the significant winner is re-measured on
                 fresh blocks; that re-measurement decides
    5. record    every final evaluation goes to the memory (with its patch and the incumbent's)
    6. promote   the winner, if its re-measured lower bound clears 1% + 2 x noise, is the new
                 incumbent; its compounded gain over stock is carried along
Every step emits a journal record with its numbers (`reporter.RoundReporter`). Worktrees of patch
candidates that were not promoted are removed at the end of the round.

A round reads the run's fixed context (`context.RunContext`) and the state the last round left
(`RoundState`, frozen: the run passes each round's outcome to `RoundState.after` for the next).

Owns: `RoundState`, `RoundOutcome`, `run_round`, selection. Does not own measuring, splitting slots,
proposing, timing, judging, storing (it calls each) or the journal's text (`reporter.py`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specpilot.control.arm import ArmSpec
from specpilot.control.config import Placement
from specpilot.control.controller import Evaluation
from specpilot.control.defaults import source_commit
from specpilot.control.load import Load
from specpilot.control.rule import Outcome
from specpilot.control.shared import shareable
from specpilot.loop.agents.base import LoopSetup, Proposal, Proposer, ProposerContext
from specpilot.loop.agents.kernel import promote_table
from specpilot.loop.budget import (
    CandidateCost,
    compile_seconds,
    compiled_opens,
    compiles,
    fitting_selection,
    open_warmup,
    selection_seconds,
)
from specpilot.loop.config import SlotPolicy
from specpilot.loop.cost_model import CostTable
from specpilot.loop.noise import NoiseChoice
from specpilot.loop.recall import Recall, retime_factor
from specpilot.loop.reporter import RoundReporter
from specpilot.loop.slots import SlotPlan, allocate, closes
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import remove
from specpilot.memory.records import MemoryRecord

if TYPE_CHECKING:
    from specpilot.loop.context import RunContext


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
    left_out: tuple[Proposal, ...] = ()  # selected, but not timed: their comparisons did not fit in the budget

    @property
    def nothing_new(self) -> bool:
        return not self.selected


@dataclass(frozen=True)
class RoundState:
    """What the run carries from one round to the next (the rest is fixed: `RunContext`)."""

    index: int  # the next round's number (1-based; a resumed run goes on with its numbering)
    done: int  # completed rounds of the run, those before a resume included
    incumbent: Incumbent
    noise: NoiseChoice  # the noise floor candidates are judged by (chosen again when the load changed)
    cost: CostTable | None = None  # the incumbent's cost table, once measured (None after a promotion)
    history: tuple = ()  # (System, CostTable) of the incumbents measured in this run, for the agents
    outcomes: tuple[RoundOutcome, ...] = ()  # this run's rounds
    idle: int = 0  # rounds in a row with nothing new to time
    last_load: Load | None = None  # the load the last round ran under (None before the first)
    measure_s: float = 0.0  # the longest cost-table measurement so far: what the next should take
    reserve: float = 0.0  # the final measurement's latest estimate (0 without one)

    @property
    def first(self) -> bool:
        """This is the run's first round (the seeds are offered in it)."""
        return not self.outcomes

    @property
    def opened(self) -> frozenset[str]:
        """Hashes of the systems this run's rounds timed (candidates and their incumbents): a shared
        worker compiled them as it opened them."""
        return frozenset({x.proposal.candidate.hash for o in self.outcomes for x in o.evaluated}
                         | {o.incumbent_before.candidate.hash for o in self.outcomes if o.evaluated})

    @property
    def compile_opens(self) -> list[float]:
        """Open seconds of this run's comparisons that compiled their candidate (`budget.compiled_opens`)."""
        return compiled_opens(x.evaluation for o in self.outcomes for x in o.evaluated)

    def after(self, outcome: RoundOutcome, load: Load) -> RoundState:
        """The state after `outcome`, a round that ran under `load`."""
        return replace(self, index=self.index + 1, done=self.done + 1, incumbent=outcome.incumbent_after,
                       cost=None if outcome.promoted else outcome.cost,
                       history=(*self.history, (outcome.incumbent_before.candidate.system, outcome.cost)),
                       outcomes=(*self.outcomes, outcome), idle=self.idle + 1 if outcome.nothing_new else 0,
                       last_load=load)


@dataclass(frozen=True)
class Proposals:
    """What the agents proposed in a round, sorted for timing (`select`)."""

    selected: list[Proposal]  # to time, in order
    reused: list  # (proposal, MemoryRecord): judged before, not timed again
    dropped: list[Proposal]  # neither
    counts: dict[str, int]  # proposals per agent asked
    errors: dict[str, str]  # agent: how it failed
    asked_without_slot: list[str]  # agents asked because the others left slots empty


def run_round(ctx: RunContext, state: RoundState, candidates: int,
              choose_noise: Callable[[], NoiseChoice] | None = None) -> RoundOutcome:
    """Round `state.index` on the incumbent of `state`, whose cost table is measured, timing at most
    `candidates`. `choose_noise` gives the noise floor to judge by once the round has something to
    time (default: `state.noise`); its seconds do not count as the round's."""
    start = time.monotonic()
    say = ctx.report.round(state.index)
    inc, cost, label = state.incumbent, state.cost, ctx.round_label(state.index)
    say.incumbent(inc, cost)
    # gaps: the slots, split over the agents by what the gaps each can close would save
    recall = Recall.snapshot(ctx.memory, ctx.fingerprint)
    seeds = fresh_seeds(ctx.seeds if state.first else (), inc, recall, candidates, bool(ctx.agents))
    plan = None if ctx.config.slots is SlotPolicy.ROUND_ROBIN else allocate(
        cost, [(a.name, closes(a)) for a in ctx.agents], candidates - len(seeds), state.index, ctx.config.seed)
    say.slots(seeds, plan, ctx.config.slots, ctx.agents)
    # proposals
    asked = ProposerContext(setup=ctx.setup, round=state.index, round_label=label, incumbent=inc, stock=ctx.stock,
                            cost=cost, recall=recall, limit=candidates, models=ctx.session, history=state.history,
                            log=say.agent_line)
    got = propose(ctx.agents, plan, seeds, asked, candidates, say)
    say.proposals(got.counts, got.errors, got.asked_without_slot)
    say.reused(got.reused, inc)
    selected = got.selected
    release(got.dropped, keep=(inc.candidate, *(p.candidate for p in selected)), setup=ctx.setup)
    outcome = RoundOutcome(index=state.index, label=label, incumbent_before=inc, incumbent_after=inc, cost=cost,
                           proposals=sum(got.counts.values()), reused=tuple(got.reused), agent_errors=got.errors,
                           plan=plan)
    if not selected:
        seconds = time.monotonic() - start
        say.nothing_new(seconds)
        return replace(outcome, seconds=seconds)
    # guard and timing, against the noise floor in force
    noise, chosen = state.noise, 0.0
    if choose_noise is not None:
        t = time.monotonic()
        noise = choose_noise()
        chosen = time.monotonic() - t
    inc_spec = inc.candidate.runner_spec(ctx.deployment_file, ctx.options.runner)
    specs = [p.candidate.runner_spec(ctx.deployment_file, ctx.options.runner) for p in selected]
    undecided = [recall.undecided_against(p.hash, inc.candidate.hash) for p in selected]
    factors = [retime_factor(len(u)) for u in undecided]
    kept = fitting(ctx, state, selected, specs, inc_spec, noise.per_evaluation, say, factors)
    left_out = tuple(p for i, p in enumerate(selected) if i not in kept)
    selected, specs = [selected[i] for i in kept], [specs[i] for i in kept]
    undecided, factors = [undecided[i] for i in kept], [factors[i] for i in kept]
    if not selected:  # not even one comparison fits beside the final measurement
        release(left_out, keep=(inc.candidate,), setup=ctx.setup)
        seconds = time.monotonic() - start - chosen
        say.nothing_new(seconds, "nothing timed: no candidate fits in the budget's time left")
        return replace(outcome, left_out=left_out, seconds=seconds)
    configs = [ctx.controller_config.powered(f) for f in factors]
    say.selected(selected, inc, [(f, c, u) if f > 1 else None for f, c, u in zip(factors, configs, undecided)])
    result = ctx.controller.evaluate_round(inc_spec, specs, noise.floor, factors=factors)
    evaluated = record(ctx, label, inc, selected, result.evaluations, noise.id, say, configs)
    # promotion
    promoted = next((x for x in evaluated if x.evaluation.verdict is Outcome.PROMOTE
                     and result.promoted is x.evaluation), None)
    new_inc = inc
    if promoted is not None:
        gain = promoted.evaluation.estimate.gain
        new_inc = inc.promote(promoted.proposal.candidate, promoted.entry_id, gain, label)
        promote_table(inc.candidate.system, new_inc.candidate.system, ctx.setup.device_name)  # into the user cache
        say.promotion(new_inc, inc, promoted.entry_id, gain)
    release((*selected, *left_out), keep=(new_inc.candidate, inc.candidate), setup=ctx.setup)
    seconds = time.monotonic() - start - chosen
    say.done(seconds, new_inc.name if promoted else None)
    return replace(outcome, incumbent_after=new_inc, selected=tuple(selected), evaluated=tuple(evaluated),
                   promoted=promoted, seconds=seconds, left_out=left_out)


def fitting(ctx: RunContext, state: RoundState, selected: list[Proposal], specs: list[ArmSpec], inc_spec: ArmSpec,
            per_evaluation: float, say: RoundReporter, factors: list[int] | None = None) -> list[int]:
    """The indices of `selected` whose comparisons fit in the budget's time left with the final
    measurement after them (`budget.fitting_selection`; all without a budget); the others are left
    out, with a line saying which and their estimates. `factors`: each one's power (`candidate_costs`)."""
    left = ctx.budget.left()
    if math.isinf(left):
        return list(range(len(selected)))
    once, costs = candidate_costs(ctx, state, selected, specs, inc_spec, per_evaluation, factors)
    kept = fitting_selection(once, costs, ctx.backend.parallelism, left)
    if len(kept) < len(selected):
        out = [(p, c) for i, (p, c) in enumerate(zip(selected, costs)) if i not in kept]
        timed = [costs[i] for i in kept]
        seconds = selection_seconds(once, timed, ctx.backend.parallelism) - max(c.final for c in timed) if kept else 0.0
        say.left_out(out, len(kept), seconds, state.reserve, ctx.config.final, left)
    return kept


def candidate_costs(ctx: RunContext, state: RoundState, selected: list[Proposal], specs: list[ArmSpec],
                    inc_spec: ArmSpec, per_evaluation: float,
                    factors: list[int] | None = None) -> tuple[float, list[CandidateCost]]:
    """(the warm-up the round pays once, each candidate's `budget.CandidateCost`): an evaluation
    each, `per_evaluation` times its power factor (default 1: a retime with k times the blocks is
    priced as k evaluations, an upper bound, since its open and gate are not scaled), plus the
    compile warm-ups of its arms (`budget.open_warmup`; a shared worker compiles a cold incumbent
    once, for the round's first comparison); its final measurement is the incumbent's
    (`state.reserve`) plus a compile warm-up where it compiles and the incumbent does not."""
    compile_s, opened = compile_seconds(state.compile_opens, ctx.device), state.opened
    inc = state.incumbent.candidate
    once, costs = 0.0, []
    for p, spec, factor in zip(selected, specs, factors or [1] * len(selected), strict=True):
        evaluation_s = per_evaluation * factor
        shared = (ctx.controller_config.shared_workers and ctx.backend.placement is Placement.ALTERNATE
                  and shareable(inc_spec, spec))  # as the backend opens it (`LocalBackend.open`)
        screen, again = open_warmup(compiles(spec.system), p.candidate.hash in opened, shared, compile_s)
        inc_screen, inc_again = open_warmup(compiles(inc_spec.system), inc.hash in opened, shared, compile_s)
        if shared:
            once, inc_screen = max(once, inc_screen), 0.0
        final = state.reserve + (compile_s if ctx.config.final and compiles(spec.system)
                                 and not compiles(inc_spec.system) else 0.0)
        costs.append(CandidateCost(evaluation_s + screen + inc_screen, evaluation_s + again + inc_again, final,
                                   screen + inc_screen))
    return once, costs


def fresh_seeds(seeds, incumbent: Incumbent, recall: Recall, candidates: int, agents: bool) -> list[Proposal]:
    """The seeds not settled (the incumbent, what it was promoted over) nor judged, within the
    round's slots: all but one when agents are enabled."""
    settled = {incumbent.candidate.hash} | set(incumbent.lineage)
    fresh = [p for p in seeds if p.hash not in settled and recall.verdict(p.hash) is None]
    return fresh[: candidates - 1 if agents and candidates > 1 else candidates]


def propose(agents: tuple[Proposer, ...], plan: SlotPlan | None, seeds: list[Proposal], asked: ProposerContext,
            candidates: int, say: RoundReporter) -> Proposals:
    """The agents with a slot propose (all of them under round-robin, `plan` None), and their lists
    are selected from after the seeds; when slots are left, the agents without one are asked too."""
    active = agents if plan is None else tuple(a for a in agents if plan.slots(a.name) > 0)
    lists, errors = propose_all(active, asked, None if plan is None else {a.name: plan.slots(a.name) for a in active})
    order = [a.name for a in active] if plan is None else plan.active
    quotas = None if plan is None else {name: plan.slots(name) for name in order}
    selected, reused, dropped = select({name: lists[name] for name in order if name in lists}, asked.incumbent,
                                       asked.recall, candidates, quotas, first=seeds)
    idle = tuple(a for a in agents if a not in active)
    if len(selected) < candidates and idle:
        # the agents the gaps chose (and the seeds) leave slots empty: before a slot goes unused, or
        # the round counts as idle (and the run converges), the others are asked for them
        say.asking(len(selected), candidates, active, idle)
        more, more_errors = propose_all(idle, asked)
        lists.update(more)
        errors.update(more_errors)
        known = {p.hash for p, _ in reused}
        selected, again, more_dropped = select(more, asked.incumbent, asked.recall, candidates, first=selected)
        reused += [(p, rec) for p, rec in again if p.hash not in known]
        dropped += more_dropped
        active += idle
    counts = {a.name: len(lists[a.name]) for a in active}
    return Proposals(selected=selected, reused=reused, dropped=dropped, counts=counts, errors=errors,
                     asked_without_slot=[a.name for a in idle if a.name in counts])


def record(ctx: RunContext, label: str, incumbent: Incumbent, selected: list[Proposal], evaluations,
           noise_id: int | None, say: RoundReporter, configs=None) -> list[Evaluated]:
    """Every final evaluation into the memory (with its patch, the incumbent's and the controller
    config it was timed under: `configs`, default the run's), and the journal."""
    commit = source_commit()
    evaluated = []
    configs = configs or [ctx.controller_config] * len(selected)
    for p, e, config in zip(selected, evaluations, configs, strict=True):
        entry = ctx.memory.record_evaluation(ctx.fingerprint, e, config, round=label,
                                             patch=p.candidate.patch, incumbent_patch=incumbent.candidate.patch,
                                             noise_id=noise_id, commit=commit)
        evaluated.append(Evaluated(p, e, entry))
        say.evaluation(p, e, entry, incumbent)
    return evaluated


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
