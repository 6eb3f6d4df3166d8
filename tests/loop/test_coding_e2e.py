"""A coding agent's real speedup patch through the whole loop: guarded, timed, promoted, stored,
re-applied on --resume, and offered to a similar deployment.

The test deployment's stock carries a deliberate slowdown: the engine's `delay` fault sleeps
`DELAY_MS` on the host once per decoding round. Two scripted coding agents run in parallel each
round (`coding_stand_in.py speedup`): agent 1 removes the sleep from specpilot/engine/faults.py in
its worktree — the patched system is really faster, on any CPU — and agent 2 writes a lossy patch
(verification trusts the drafter) that the guard must reject. Three runs share one memory:

1. a fresh run promotes agent 1's patch (agent 2's is rejected untimed) and stores it;
2. `--resume` of that run starts from the patched system, re-applied from the memory in a new
   worktree: its cost table, measured from what it runs, has lost the sleep; the agents' briefs
   carry the earlier patches with their diffs, verdicts and gains, so both change nothing;
3. a deployment differing only in max_new_tokens is seeded with the patch (similarity shown),
   times it against its own stock and promotes it.
If the patch were not applied, not promoted, not stored or not re-applied, an assertion fails.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from specpilot.cli.run import summary
from specpilot.control.rule import Outcome, Reason
from specpilot.loop.config import LoopConfig, StopReason, Timing
from specpilot.loop.journal import JOURNAL_FILE, EventKind, Journal
from specpilot.loop.run import RunOptions, run_loop
from specpilot.loop.worktree import package_checkout
from specpilot.memory.store import Memory

pytestmark = [pytest.mark.slow, pytest.mark.whole_loop]  # three loop runs with real workers (~2-3 min on two cores)

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "coding_stand_in.py"
DELAY_MS = 20  # per decoding round: several times a tiny model's round on CPU
CONTROLLER = {"blocks": 5, "noise_blocks": 5, "extra_blocks": 0, "max_new_tokens": 12, "gate_prompts": 3,
              "resamples": 999}
FAULTS = "specpilot/engine/faults.py"


@pytest.fixture(scope="module")
def world(tmp_path_factory, target_dir, drafter_dir):
    if package_checkout() is None:
        pytest.skip("the package is not imported from a git checkout: no worktrees for patches")
    root = tmp_path_factory.mktemp("coding-e2e")
    dep = root / "slow-stock.toml"
    dep.write_text(f'name = "slow-stock"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\n'
                   "max_new_tokens = 24\nn_prompts = 2\n"
                   f'[stock]\ndepth = 3\ntopk = 2\ntree_budget = 4\nfault = "delay:{DELAY_MS}"\n')
    with pytest.MonkeyPatch.context() as mp:
        from specpilot.control import load

        mp.setattr(load, "default_probe", lambda: load.FixedProbe())  # a quiet machine, whatever this one does
        mp.setenv("SPECPILOT_HOME", str(root / "home"))
        mp.delenv("SPECPILOT_MEMORY", raising=False)
        mp.delenv("SPECPILOT_CODING_AGENT", raising=False)
        yield {"root": root, "deployment": dep, "memory": str(root / "memory.sqlite")}


def config(**changes) -> LoopConfig:
    base = LoopConfig(rounds=1, agents=("coding",), max_candidates=2, timing=Timing.QUICK, profile_batches=3,
                      profile_tokens=12, final=False, controller=CONTROLLER, coding_agents=2,
                      coding_command=f"{sys.executable} {STAND_IN} speedup {{task_file}}")
    return LoopConfig(**{**base.__dict__, **changes})


def options(world, out: str, deployment: Path | None = None, **changes) -> RunOptions:
    return RunOptions(deployment=str(deployment or world["deployment"]), out=str(world["root"] / out),
                      memory=world["memory"], devices=("cpu",), **changes)


@pytest.fixture(scope="module")
def first(world):
    log = io.StringIO()
    return run_loop(config(), options(world, "run"), log), log.getvalue()


@pytest.fixture(scope="module")
def resumed(world, first):
    log = io.StringIO()
    return run_loop(config(rounds=2), options(world, "run", resume=True), log), log.getvalue()


def test_the_speedup_patch_is_guarded_timed_promoted_and_stored(first):
    result, log = first
    (rd,) = result.rounds
    by_agent = {x.proposal.details["agent"]: x for x in rd.evaluated}
    assert sorted(by_agent) == [1, 2], log  # two agents ran, each made its own candidate
    fast, lossy = by_agent[1], by_agent[2]
    patch = fast.proposal.candidate.patch
    assert "-        time.sleep(fault.value / 1e3)" in patch and FAULTS in patch
    # guarded: the lossy one failed token forcing and was never timed; the fast one passed
    assert lossy.evaluation.verdict is Outcome.REJECT and lossy.evaluation.decision.reasons == (Reason.GUARD_FAILED,)
    assert lossy.evaluation.estimate is None and fast.evaluation.gate.passed
    # timed and promoted: re-measured on fresh blocks, its lower bound above the threshold
    e = fast.evaluation
    assert rd.promoted is fast, log
    assert e.verdict is Outcome.PROMOTE and Reason.REMEASURED in e.decision.reasons
    assert e.decision.lower_bound > e.decision.threshold and e.estimate.gain > 0.3
    assert result.incumbent.candidate.patch == patch
    with Memory(result.report["run"]["memory"]) as memory:  # stored, with its patch
        stored = memory.get(fast.entry_id)
        assert stored.verdict is Outcome.PROMOTE and stored.candidate.patch == patch and stored.guard_passed
        best = memory.best_validated(result.report["deployment"]["fingerprint"])
        assert best.record.id == fast.entry_id and best.record.candidate.patch == patch


def test_the_patch_is_summarised_in_the_cli_the_report_and_the_journal(first):
    result, log = first
    line = f"patch {FAULTS} (+1 -1)"
    text = summary(result.report)
    assert f"({line}) +" in text and "(no change)" not in text
    assert f"final system '{result.incumbent.name}': {line}" in text
    assert "patch not promoted in round 1" in text and "patch specpilot/engine/verify.py (+" in text
    (promotion,) = result.report["promotions"]
    assert promotion["patch_summary"]["line"] == line and "+        pass  #" in promotion["patch_diff"]
    md = (result.paths.out / "report.md").read_text()
    assert "## Code patches" in md and f"`{FAULTS}` (+1 -1)" in md and "```diff" in md
    assert f"{line} | +" in md.split("## Promoted changes")[1]  # the promoted table's change column
    assert f"{line}: coding agent 1 on the" in log  # the journal's "timing ..." line


def test_resume_re_applies_the_patch_and_measures_what_it_runs(first, resumed):
    result, log = resumed
    assert result.stop is StopReason.CONVERGED or result.stop is StopReason.ROUNDS, log
    start = next(e for e in Journal.read(result.paths.out / JOURNAL_FILE) if e.kind is EventKind.START
                 and e.data["resumed"])
    promoted = first[0].incumbent
    assert start.data["incumbent"] == promoted.name and start.data["incumbent_entry"] == promoted.entry_id
    (rd,) = result.rounds
    assert rd.index == 2 and rd.incumbent_before.candidate.patch == promoted.candidate.patch
    # the round-2 cost table was measured in the re-applied worktree: the sleep is gone (measured
    # from the knobs' code it would still be there: the fault knob is unchanged). Plain AR sleeps
    # once per token, a few ms of compute besides: the clearest mark; the round is faster as well
    assert rd.incumbent_before.candidate.system.fault == f"delay:{DELAY_MS}"
    before, after = first[0].rounds[0].cost, rd.cost
    assert before.ar_ms_per_token > DELAY_MS and after.ar_ms_per_token < before.ar_ms_per_token - 0.7 * DELAY_MS, log
    assert after.round_ms < before.round_ms - 0.25 * DELAY_MS, log
    # the agents worked on top of the patch, and their briefs carried what the memory holds
    scratch = result.paths.scratch
    logs = {i: (scratch / f"coding-{rd.label.replace('/', '-')}-a{i}.log").read_text() for i in (1, 2)}
    assert "the delay is gone already" in logs[1] and "the guard rejected the fault patch" in logs[2]
    brief = (scratch / f"coding-{rd.label.replace('/', '-')}-a1-task.md").read_text()
    assert f"It already carries a code patch, applied in this worktree (patch {FAULTS} (+1 -1))" in brief
    past = brief.split("## Code patches tried before on this deployment")[1]
    assert "**PROMOTE** (" in past and "-        time.sleep(fault.value / 1e3)" in past
    assert "**REJECT** (guard-failed)" in past and "greedy_accept" in past
    assert rd.nothing_new and not rd.evaluated


def test_a_deployment_differing_only_in_max_new_tokens_is_offered_the_patch(world, first, resumed):
    dep = world["root"] / "slow-stock-32.toml"
    dep.write_text(world["deployment"].read_text().replace('name = "slow-stock"', 'name = "slow-stock-32"')
                   .replace("max_new_tokens = 24", "max_new_tokens = 32"))
    log = io.StringIO()
    result = run_loop(config(max_candidates=1), options(world, "run-32", dep), log)
    events = Journal.read(result.paths.out / JOURNAL_FILE)
    (seed,) = [e for e in events if e.kind is EventKind.SEED]
    assert seed.text.startswith(f"seeded from deployment slow-stock (similarity {seed.data['similarity']:.2f}: "
                                f"same target and drafter, max_new_tokens 32 vs 24): patch {FAULTS} (+1 -1) (entry ")
    assert 0.9 < seed.data["similarity"] < 1.0 and seed.data["offered"]
    (timed,) = result.rounds[0].evaluated
    assert timed.proposal.agent == "memory" and timed.proposal.candidate.patch == first[0].incumbent.candidate.patch
    assert timed.evaluation.verdict is Outcome.PROMOTE, log.getvalue()  # timed here, not adopted untimed
    assert result.incumbent.candidate.patch == timed.proposal.candidate.patch
    assert f"seeded from `slow-stock` (similarity {seed.data['similarity']:.2f}" in (
        result.paths.out / "report.md").read_text()
