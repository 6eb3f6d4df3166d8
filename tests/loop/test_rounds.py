"""Selecting a round's candidates: round-robin over agents, the memory's verdicts reused, limits."""

from loop_fixtures import CONFIG, STOCK, evaluation, fingerprint

from specpilot.loop.agents.base import Proposal
from specpilot.loop.recall import Recall
from specpilot.loop.rounds import select
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory


def proposal(agent: str, **knobs) -> Proposal:
    return Proposal(agent, Candidate(STOCK.with_changes(name=f"{agent}-{knobs}", **knobs)), "why")


def test_round_robin_over_agents_skips_what_is_known_settled_or_repeated(tmp_path):
    judged = STOCK.with_changes(name="judged", depth=3)
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        entry = memory.record_evaluation(fp, evaluation(judged, gain=-0.1), CONFIG)
        recall = Recall.snapshot(memory, fp)
    ancestor = STOCK.with_changes(name="ancestor", topk=2)
    inc = Incumbent(Candidate(STOCK.with_changes(name="inc", depth=6)), 7, 0.2,
                    lineage=frozenset({Candidate(STOCK).hash, Candidate(ancestor).hash}))
    lists = {
        "knob": [proposal("knob", depth=3), proposal("knob", depth=6), proposal("knob", depth=4),
                 proposal("knob", depth=2)],
        "coding": [proposal("coding", topk=2), proposal("coding", depth=4), proposal("coding", tree_budget=9)],
    }
    selected, reused, dropped = select(lists, inc, recall, limit=2)
    # knob depth 3: judged; coding topk 2: an ancestor; knob depth 6: the incumbent; coding depth 4: a repeat
    assert [p.candidate.system.depth for p in selected] == [4, 5] and selected[1].candidate.system.tree_budget == 9
    assert [(p.candidate.system.depth, r.id) for p, r in reused] == [(3, entry)]
    assert len(dropped) == 5 and all(p not in selected for p in dropped)


def test_the_evaluation_line_says_when_pairs_were_compared_on_saturated_stretches():
    from dataclasses import replace

    from specpilot.loop.reporter import evaluation_line

    p = proposal("knob", tree_budget=16)
    e = evaluation(p.candidate.system)
    assert "saturated" not in evaluation_line(p, e, 1) and e.saturated == (0, 0)
    block = {"incumbent": [[1.0, 1.0]], "candidate": [[1.0, 1.0]],
             "incumbent_saturated": [[[0.5, 40], [0.0, 0]]], "candidate_saturated": [[[0.4, 40], [0.3, 20]]]}
    e = replace(e, timings=(block, block))
    assert e.saturated == (2, 4)
    assert "over 6 blocks (2/4 request pairs on saturated stretches)" in evaluation_line(p, e, 1)


def test_the_evaluation_line_says_whether_the_timed_outputs_passed_the_guard():
    from dataclasses import replace

    from specpilot.control.gate import GateResult
    from specpilot.control.rule import Outcome, Reason
    from specpilot.loop.reporter import evaluation_line

    p = proposal("knob", verify_compile=True)
    e = evaluation(p.candidate.system)
    assert "timed outputs" not in evaluation_line(p, e, 1)  # the timed sample was not drawn
    assert "timed outputs pass" in evaluation_line(p, replace(e, forced=GateResult(True, {})), 1)
    failed = replace(e, forced=GateResult(False, {}, "mismatch rate 0.8% > stock's 0.4%"),
                     decision=e.decision.with_verdict(Outcome.REJECT, Reason.GUARD_FAILED))
    line = evaluation_line(p, failed, 1)
    assert "guard pass; timed outputs FAILED the guard: mismatch rate 0.8% > stock's 0.4%" in line
    assert line.lstrip().startswith("[x] REJECT")


def test_each_round_gives_the_next_state():
    """`RoundState.after`: the numbering goes on, the incumbent's cost table is kept unless a new
    incumbent was promoted, history and outcomes grow, idle rounds count until one times something."""
    from types import SimpleNamespace

    from loop_fixtures import cost_table

    from specpilot.control.load import Load
    from specpilot.loop.noise import NoiseChoice
    from specpilot.loop.rounds import RoundOutcome, RoundState

    stock, other = Incumbent(Candidate(STOCK)), Incumbent(Candidate(STOCK.with_changes(name="d3", depth=3)))
    cost, load = cost_table(), Load("cpu", 1.0, 0.0, 0.0, 2)
    state = RoundState(index=4, done=3, incumbent=stock, cost=cost, idle=1,
                       noise=NoiseChoice(floor=None, id=None, load=None, per_evaluation=1.0))
    idle = RoundOutcome(index=4, label="r/r4", incumbent_before=stock, incumbent_after=stock, cost=cost, proposals=0)
    after = state.after(idle, load)
    assert (after.index, after.done, after.idle, after.cost, after.last_load) == (5, 4, 2, cost, load)
    assert after.history == ((STOCK, cost),) and after.outcomes == (idle,) and not after.first
    promoted = RoundOutcome(index=5, label="r/r5", incumbent_before=stock, incumbent_after=other, cost=cost,
                            proposals=3, selected=(proposal("knob", depth=3),), promoted=SimpleNamespace())
    again = after.after(promoted, load)
    assert (again.index, again.idle, again.incumbent, again.cost) == (6, 0, other, None)
    assert len(again.history) == 2 and state.first and state.index == 4  # frozen: the old state is unchanged


class Listed:
    """Proposes the systems it is given, in order."""

    name = "knob"

    def __init__(self, systems):
        self.systems = systems

    def propose(self, ctx):
        return [Proposal(self.name, Candidate(s), "listed") for s in self.systems]


def as_system(arm):
    from specpilot.config import System

    return System.from_dict({k: v for k, v in arm.system.items() if k != "name"}, name=arm.system["name"])


class Undecided:
    """Times nothing: every candidate comes back undecided; keeps the power factor each was given."""

    def __init__(self):
        self.factors: list[dict] = []

    def evaluate_round(self, incumbent, specs, noise, factors=None):
        from specpilot.control.controller import RoundResult
        from specpilot.control.rule import Outcome

        self.factors.append({s.system["name"]: f for s, f in zip(specs, factors or [1] * len(specs))})
        return RoundResult(tuple(evaluation(as_system(s), as_system(incumbent), gain=0.02,
                                            verdict=Outcome.NEED_MORE_DATA) for s in specs), None)


class Log:
    def __init__(self):
        self.lines: list[str] = []

    def say(self, text):
        self.lines.append(text)

    def emit(self, kind, text, round=0, **data):
        self.lines.append(text)


def retime_round(memory, tmp_path, index, incumbent, systems, controller, left=None):
    """Round `index` (of run "t") on cuda, one device, timing the `systems` proposed against
    `incumbent` with `controller`; `left`: the budget's seconds (an evaluation ~20 s, the final ~40 s)."""
    from types import SimpleNamespace

    from loop_fixtures import DEPLOYMENT, cost_table, run_context

    from specpilot.control.config import Placement
    from specpilot.loop.agents.base import LoopSetup
    from specpilot.loop.budget import Budget
    from specpilot.loop.config import LoopConfig, SlotPolicy
    from specpilot.loop.context import RunOptions
    from specpilot.loop.noise import NoiseChoice
    from specpilot.loop.rounds import RoundState, run_round

    log = Log()
    ctx = run_context(config=LoopConfig(slots=SlotPolicy.ROUND_ROBIN, max_candidates=3), options=RunOptions(),
                      budget=Budget(left), deployment_file="fx", deployment=DEPLOYMENT, device="cuda",
                      controller_config=CONFIG, memory=memory, paths=SimpleNamespace(run_id="t"), journal=log,
                      fingerprint=fingerprint(), controller=controller,
                      backend=SimpleNamespace(parallelism=1, placement=Placement.ALTERNATE),
                      setup=LoopSetup(DEPLOYMENT, "cuda", "NVIDIA H100", None, tmp_path), stock=Candidate(STOCK),
                      agents=(Listed(systems),), seeds=())
    state = RoundState(index=index, done=index - 1, incumbent=Incumbent(Candidate(incumbent)),
                       noise=NoiseChoice(floor=None, id=None, load=None, per_evaluation=20.0),
                       cost=cost_table(incumbent), reserve=40.0)
    return run_round(ctx, state, 3), log.lines


MARGINAL = STOCK.with_changes(name="knob:depth=3", depth=3)
OTHER = STOCK.with_changes(name="knob:depth=4", depth=4)


def test_an_undecided_candidate_is_retimed_with_more_power_against_the_same_incumbent(tmp_path):
    """Undecided in round 1 against stock: timed in round 2 with 2x the blocks at every look (same
    looks), in round 3 with 4x, the line saying why and the memory keeping the config it was timed
    under; against another incumbent, the same candidate is timed as configured."""
    controller = Undecided()
    with Memory(tmp_path / "m.sqlite") as memory:
        retime_round(memory, tmp_path, 1, STOCK, [MARGINAL, OTHER], controller)
        _, lines = retime_round(memory, tmp_path, 2, STOCK, [MARGINAL], controller)
        assert controller.factors[-1] == {MARGINAL.name: 2}
        assert ("     retimed at 2x blocks (40+40 in steps of 20, same looks): undecided against this incumbent in "
                "t/r1") in "\n".join(lines).splitlines()
        _, lines = retime_round(memory, tmp_path, 3, STOCK, [MARGINAL], controller)
        assert controller.factors[-1] == {MARGINAL.name: 4}
        assert any("retimed at 4x blocks (80+80 in steps of 40, same looks): undecided against this incumbent in "
                   "t/r1, t/r2" in line for line in lines)
        # OTHER was undecided against stock only: against a new incumbent it is timed as configured
        _, lines = retime_round(memory, tmp_path, 4, MARGINAL, [OTHER], controller)
        assert controller.factors[-1] == {OTHER.name: 1} and not any("retimed" in line for line in lines)
        blocks = {r.round: r.detail["config"]["blocks"] for r in memory.entries(deployment=fingerprint().digest)
                  if r.candidate.name == MARGINAL.name}
    assert controller.factors[0] == {MARGINAL.name: 1, OTHER.name: 1}
    assert blocks == {"t/r1": CONFIG.blocks, "t/r2": 2 * CONFIG.blocks, "t/r3": 4 * CONFIG.blocks}


def test_a_powered_retime_that_does_not_fit_the_budget_is_left_out(tmp_path):
    """100 s left, an evaluation ~20 s, the final ~40 s: the plain candidate fits (20 + 20 + 40 s);
    the retime at 2x (40 + 40 + 40 s) does not, and is left out with its powered cost."""
    controller = Undecided()
    with Memory(tmp_path / "m.sqlite") as memory:
        retime_round(memory, tmp_path, 1, STOCK, [MARGINAL], controller)
        outcome, lines = retime_round(memory, tmp_path, 2, STOCK, [MARGINAL, OTHER], controller, left=100.0)
    assert controller.factors[-1] == {OTHER.name: 1}
    assert [p.candidate.name for p in outcome.left_out] == [MARGINAL.name]
    assert any(f"left: {MARGINAL.name} (~40 s); timing the 1 that fit" in line for line in lines)
