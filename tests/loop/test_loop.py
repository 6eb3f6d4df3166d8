"""The whole loop on CPU, real engine and real workers, on a tiny deployment with a deliberately bad stock.

One run (module fixture) times the knob agent's best move and a coding agent's patch (a stand-in
script that makes verification accept drafts unverified): the first is really faster and is
promoted, the second is rejected by the token-forcing guard before any timing. A second run,
resumed from the same memory, is killed mid-round and resumed again.
"""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpilot.control.rule import Reason, Outcome
from specpilot.loop.config import LoopConfig, SlotPolicy, StopReason, Timing
from specpilot.loop.journal import JOURNAL_FILE, EventKind, Journal
from specpilot.loop.report import render_markdown
from specpilot.loop.run import RunOptions, run_loop
from specpilot.memory.store import Memory

pytestmark = [pytest.mark.slow, pytest.mark.whole_loop]  # full loop runs with real workers

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "coding_stand_in.py"
# small enough for two cores; the same for every run so the noise floor is measured once
CONTROLLER = {"blocks": 5, "noise_blocks": 5, "extra_blocks": 0, "max_new_tokens": 16, "gate_prompts": 4,
              "resamples": 999}


@pytest.fixture(scope="module")
def world(tmp_path_factory, target_dir, drafter_dir):
    root = tmp_path_factory.mktemp("loop")
    dep = root / "bad-stock.toml"
    dep.write_text(f'name = "bad-stock"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\n'
                   "max_new_tokens = 24\nn_prompts = 2\n"
                   "[stock]\ndepth = 8\ntopk = 8\ntree_budget = 64\n")  # a wide tree: slow on CPU
    with pytest.MonkeyPatch.context() as mp:
        from specpilot.control import load

        mp.setattr(load, "default_probe", lambda: load.FixedProbe())  # a quiet machine, whatever this one does
        mp.setenv("SPECPILOT_HOME", str(root / "home"))
        mp.delenv("SPECPILOT_MEMORY", raising=False)
        mp.delenv("SPECPILOT_CODING_AGENT", raising=False)
        yield {"root": root, "deployment": str(dep), "memory": str(root / "memory.sqlite")}


def config(**changes) -> LoopConfig:
    # round-robin slots: the run must time one candidate of each agent whatever gap the CPU shows
    # (the gap-driven split has its own tests, test_slots.py)
    base = LoopConfig(rounds=1, agents=("knob", "coding"), max_candidates=2, slots=SlotPolicy.ROUND_ROBIN,
                      timing=Timing.QUICK, profile_batches=2,
                      profile_tokens=24, final_prompts=5, final_tokens=12, controller=CONTROLLER,
                      coding_command=f"{sys.executable} {STAND_IN} fault {{task_file}}")
    return LoopConfig(**{**base.__dict__, **changes})


@pytest.fixture(scope="module")
def first(world):
    stream = io.StringIO()
    options = RunOptions(deployment=world["deployment"], out=str(world["root"] / "run1"), memory=world["memory"],
                         devices=("cpu",))
    result = run_loop(config(), options, stream)
    return result, stream.getvalue()


def test_the_loop_promotes_a_really_faster_system(first):
    """The knob agent's move is several times faster than the bad stock and is promoted on a quiet
    machine. On a busy one the noise floor, measured for real, can swamp even that (103% was seen on
    a loaded 2-core machine); then nothing may be promoted. Which of the two happened is the rule's
    call on the measured numbers, read from the run; each branch checks what must follow from it."""
    result, log = first
    assert result.stop is StopReason.ROUNDS and len(result.rounds) == 1
    (rd,) = result.rounds
    if rd.promoted is None:
        assert all(x.evaluation.verdict is not Outcome.PROMOTE for x in rd.evaluated), log
        assert not result.report["promotions"]
        return
    assert rd.promoted.proposal.agent == "knob", log
    e = rd.promoted.evaluation
    assert e.verdict is Outcome.PROMOTE and Reason.REMEASURED in e.decision.reasons and e.screening is not None
    assert e.decision.lower_bound > e.decision.threshold > 0.01
    assert result.incumbent.candidate.hash == rd.promoted.proposal.candidate.hash
    # the final benchmark, same run: the final system against stock, with an interval above 1
    final = result.report["final"]
    assert final["final_gain"]["low"] > 1.0 and final["final_speedup"]["estimate"] > final["stock_speedup"]["estimate"]
    # then on the held-out prompts the loop never saw (8 by default): the gain there, with its interval
    held = final["heldout"]
    assert held["prompts"] == 8 and held["bench"]["config"]["sets"] == ["heldout"] and held["final_gain"]["low"] > 0
    assert result.report["promotions"][0]["entry_id"] == rd.promoted.entry_id
    assert result.report["promotions"][0]["stage"] == "remeasure"
    md = (result.paths.out / "report.md").read_text()
    assert "re-measured on fresh blocks after screening" in md and "the winner re-measured on fresh blocks" in md
    # one candidate per round: nothing is screened or re-measured, and the report does not say it was
    single = copy.deepcopy(result.report)
    single["config"]["max_candidates"] = 1
    single["promotions"][0]["stage"] = "single"
    md = render_markdown(single)
    assert "re-measured" not in md and "its one comparison (no screening)" in md and "one candidate per round" in md
    assert result.report["compounded_gain"] == pytest.approx(e.estimate.gain)
    assert "PROMOTE" in log and "noise floor" in log and "speedup over AR" in log


def test_the_guard_rejects_a_lossy_patch_before_timing_it(first):
    result, _ = first
    coded = next(x for x in result.rounds[0].evaluated if x.proposal.agent == "coding")
    e = coded.evaluation
    assert e.verdict is Outcome.REJECT and e.decision.reasons == (Reason.GUARD_FAILED,)
    assert e.estimate is None and e.costs.blocks == 0  # never timed
    assert not e.gate.passed and e.gate.summary["candidate"]["large_margin"] > 0
    assert "greedy_accept" in coded.proposal.candidate.patch
    with Memory(result.report["run"]["memory"]) as memory:
        stored = memory.get(coded.entry_id)
        assert stored.guard_passed is False and stored.candidate.patch == coded.proposal.candidate.patch


def test_every_decision_is_a_record_and_the_report_is_complete(world, first):
    result, _ = first
    out = result.paths.out
    events = Journal.read(out / JOURNAL_FILE)
    kinds = [e.kind for e in events]
    for kind in (EventKind.START, EventKind.AGENT, EventKind.NOISE, EventKind.MEASURE, EventKind.PROPOSALS,
                 EventKind.SELECTED, EventKind.ROUND_END, EventKind.STOP, EventKind.FINAL):
        assert kind in kinds
    promoted = result.rounds[0].promoted is not None  # not on a busy machine: see the first test
    assert (EventKind.PROMOTION in kinds) == promoted
    decisions = [e.data for e in events if e.kind is EventKind.EVALUATION]
    assert len(decisions) == 2 and all({"gain", "gain_lower", "threshold", "noise", "guard", "entry_id"} <= set(d)
                                       for d in decisions)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["decisions.jsonl", "gaps.png", "report.json", "report.md", "trajectory.png"]
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "specpilot.loop/1" and report["gaps"]["before"] and report["gaps"]["after"]
    assert report["agents"] == {"knob": {"enabled": True, "reason": ""}, "coding": report["agents"]["coding"]}
    assert report["agents"]["coding"]["enabled"] is True
    md = (out / "report.md").read_text()
    assert "guard-failed" in md and "speedup over AR" in md
    assert "## Promoted changes" in md or not promoted
    with pytest.raises(Exception, match="already holds files"):  # a report is never overwritten silently
        run_loop(config(), RunOptions(deployment=world["deployment"], out=str(out), devices=("cpu",)))


def _wait_for(path: Path, kind: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and any(json.loads(line)["kind"] == kind for line in path.read_text().splitlines()
                                  if line.endswith("}")):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {kind!r} event in {path} within {timeout} s")


def test_a_run_killed_mid_round_resumes_from_the_memory(world, first):
    out = world["root"] / "run2"
    argv = [sys.executable, "-m", "specpilot", "run", "--deployment", world["deployment"], "--out", str(out),
            "--memory", world["memory"], "--devices", "cpu", "--rounds", "1", "--agents", "loop_agents:ScriptedAgent",
            "--max-candidates", "2", "--profile-tokens", "24", "--final-prompts", "5", "--final-tokens", "16"]
    argv += [a for k, v in CONTROLLER.items() for a in ("--controller", f"{k}={v}")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(out / JOURNAL_FILE, "selected", timeout=120)
        time.sleep(1.5)  # workers are starting: the round is under way
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group: the run and its workers
        proc.wait()
    killed = Journal.read(out / JOURNAL_FILE)
    assert [e.kind for e in killed].count(EventKind.ROUND_END) == 0
    start = next(e for e in killed if e.kind is EventKind.START)
    promoted = first[0].incumbent
    assert start.data["incumbent"] == promoted.name  # the memory's best validated system, not stock
    with Memory(world["memory"]) as memory:
        before = len(memory.entries())

    resumed = run_loop(config(agents=("loop_agents:ScriptedAgent",), max_candidates=1, final=False),
                       RunOptions(deployment=world["deployment"], out=str(out), resume=True, memory=world["memory"],
                                  devices=("cpu",)), io.StringIO())
    events = resumed.report["rounds"]
    assert [r["index"] for r in events] == [1] and events[0]["completed"]  # the cut-short round, run again
    new = [e for e in Journal.read(out / JOURNAL_FILE)[len(killed):]]
    noise = next(e for e in new if e.kind is EventKind.NOISE)
    assert noise.data["measured"] is False  # the noise floor comes from the memory
    assert next(e for e in new if e.kind is EventKind.START).data["resumed"] is True
    assert resumed.rounds[0].incumbent_before.name == promoted.name
    timed = {x.proposal.hash for x in resumed.rounds[0].evaluated}
    with Memory(world["memory"]) as memory:
        assert len(memory.entries()) == before + len(timed)
        earlier = {r.candidate.hash for r in memory.entries() if r.round.startswith("run1/")}
    assert timed and not timed & earlier  # nothing judged before is timed again
    assert resumed.report["run"]["resumed"] and resumed.report["rounds"][0]["incumbent"] == promoted.name
    assert resumed.report["final"] is None and (out / "report.md").is_file()


def test_a_deployment_differing_only_in_max_new_tokens_starts_from_what_the_other_validated(world, first):
    """The same models with another token budget are another deployment: its run does not start from
    stock knowing nothing, it times the first deployment's validated system first (a seed)."""
    promoted = first[0].incumbent
    if promoted.entry_id is None:
        pytest.skip("nothing was promoted in the first run (a busy machine): nothing to seed from")
    dep = world["root"] / "bad-stock-32.toml"
    dep.write_text(Path(world["deployment"]).read_text().replace('name = "bad-stock"', 'name = "bad-stock-32"')
                   .replace("max_new_tokens = 24", "max_new_tokens = 32"))
    with Memory(world["memory"]) as memory:  # the resumed run above may have promoted more
        best = memory.best_validated(first[0].report["deployment"]["fingerprint"]).record.candidate.knobs
    best = {k: v for k, v in best.items() if k != "name"}
    result = run_loop(config(agents=("loop_agents:ScriptedAgent",), max_candidates=1, final=False),
                      RunOptions(deployment=str(dep), out=str(world["root"] / "run-32"), memory=world["memory"],
                                 devices=("cpu",)), io.StringIO())
    events = Journal.read(result.paths.out / JOURNAL_FILE)
    (seed,) = [e for e in events if e.kind is EventKind.SEED]
    assert seed.text.startswith(f"seeded from deployment bad-stock (similarity {seed.data['similarity']:.2f}: "
                                "same target and drafter, max_new_tokens 32 vs 24)")
    assert 0.9 < seed.data["similarity"] < 1.0 and seed.data["offered"]
    (timed,) = result.rounds[0].evaluated  # the seed took the round's one slot
    assert timed.proposal.agent == "memory"
    assert timed.proposal.candidate.system.knobs() == best
    assert "seeded from `bad-stock`" in (result.paths.out / "report.md").read_text()


def test_the_final_measurement_runs_when_the_final_cost_table_cannot_be_measured(world, first, monkeypatch):
    """On the H200 a final system whose AR twin could not be built lost its final measurement with its
    cost table; the final benchmark does not need the table, and the report names what failed."""
    from specpilot.errors import ConfigError
    from specpilot.loop.context import RunContext

    def broken(self, candidate):
        raise ConfigError("system 'ar': cannot be measured")

    monkeypatch.setattr(RunContext, "measure", broken)
    result = run_loop(config(rounds=0, agents=("knob",)), RunOptions(
        deployment=world["deployment"], out=str(world["root"] / "run-no-table"), memory=world["memory"],
        devices=("cpu",)), io.StringIO())
    final = result.report["final"]
    assert final is not None and final["stock_speedup"]["estimate"] > 0
    assert result.report["run"]["errors"] == [
        "measuring the final system's cost table failed: system 'ar': cannot be measured"]


def test_a_round_that_does_not_fit_whole_times_the_candidates_that_fit(world, first, monkeypatch):
    """The budget holds no full round but one of a single candidate (as `fitting_candidates` would
    find): the round times one candidate and says why, instead of the run stopping."""
    from specpilot.loop import budget
    from specpilot.loop import run as loop_run

    monkeypatch.setattr(budget.Budget, "fits", lambda self, seconds: False)
    monkeypatch.setattr(loop_run, "fitting_candidates", lambda *args: 1)
    stream = io.StringIO()
    result = run_loop(config(agents=("knob",), max_candidates=2, final=False), RunOptions(
        deployment=world["deployment"], out=str(world["root"] / "run-small-round"),
        memory=str(world["root"] / "small.sqlite"), devices=("cpu",)), stream)  # a memory that judged nothing yet
    events = Journal.read(result.paths.out / JOURNAL_FILE)
    (selected,) = [e for e in events if e.kind is EventKind.SELECTED]
    assert len(selected.data["candidates"]) == 1 and result.stop is StopReason.ROUNDS
    assert "round 1: 1 candidate(s) instead of 2: a full round" in stream.getvalue()
