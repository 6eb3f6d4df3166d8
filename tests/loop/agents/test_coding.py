"""The coding agents: external commands edit worktrees, in parallel; each diff is a candidate."""

import sys
import time
from dataclasses import replace
from pathlib import Path

from loop_fixtures import CONFIG, STOCK, context, evaluation, fingerprint, git_repo

from specpilot.control.rule import Outcome
from specpilot.loop.agents.base import AgentOptions, LoopSetup
from specpilot.loop.agents.brief import Target, assign, build_brief
from specpilot.loop.agents.coding import CodingAgent, build_task, fill, run_command
from specpilot.loop.cost_model import GapKind
from specpilot.loop.recall import Recall
from specpilot.loop.slots import closes
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import Checkout
from specpilot.memory.store import Memory

STAND_IN = Path(__file__).resolve().parents[1] / "coding_stand_in.py"


def command(mode: str) -> str:
    return f"{sys.executable} {STAND_IN} {mode} {{task_file}}"


def setup(tmp_path, **changes):
    checkout = Checkout.capture(git_repo(tmp_path / "repo"))
    ctx = context(checkout=checkout, scratch=tmp_path / "scratch", **changes)
    ctx.setup.scratch.mkdir()
    return ctx


def test_off_without_a_command_or_a_checkout(home, tmp_path):
    setup_ = LoopSetup(context().deployment, "cpu", "cpu", Checkout.capture(git_repo(tmp_path / "r")), tmp_path)
    status = CodingAgent().status(setup_)
    assert not status.enabled and "SPECPILOT_CODING_AGENT" in status.reason
    assert not CodingAgent(AgentOptions(coding_command="x")).status(
        LoopSetup(setup_.deployment, "cpu", "cpu", None, tmp_path)).enabled
    assert "in 3 worktrees at once" in CodingAgent(AgentOptions(coding_command="x", coding_agents=3)).status(
        setup_).reason


def test_the_worktree_diff_is_the_candidate_and_two_equal_patches_are_one(home, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CODING_AGENT", command("note"))  # the environment knob configures it
    ctx = setup(tmp_path)
    lines = []
    ctx = replace(ctx, log=lines.append)
    agent = CodingAgent()  # two agents by default: both write the same note
    assert agent.status(ctx.setup).enabled
    (p,) = agent.propose(ctx)
    assert p.agent == "coding" and p.candidate.system.knobs() == ctx.incumbent.candidate.system.knobs()
    assert "+# faster now" in p.candidate.patch and p.details["files"] == ["pkg/a.py"]
    assert p.details["patch"]["line"] == "patch pkg/a.py (+1 -0)" and p.rationale.endswith("patch pkg/a.py (+1 -0)")
    assert Path(p.candidate.workdir, "pkg", "a.py").read_text().endswith("# faster now\n")
    assert p.details["outcome"] == "exit 0" and "stand-in: note done" in Path(p.details["log_file"]).read_text()
    task = Path(p.details["task_file"]).read_text()
    assert ctx.cost.render() in task and "Lossless" in task
    assert any("made the same patch as another: dropped" in line for line in lines)
    assert sorted(x.name for x in ctx.setup.scratch.iterdir() if x.is_dir()) == [Path(p.candidate.workdir).name]
    assert (tmp_path / "repo" / "pkg" / "a.py").read_text() == "A = 2  # uncommitted\n"  # the checkout untouched


def test_agents_run_at_once_each_in_its_worktree_with_its_own_gap(home, tmp_path):
    ctx = setup(tmp_path)
    targets = assign(ctx, 3, closes(CodingAgent()))
    start = time.monotonic()
    proposals = CodingAgent(AgentOptions(coding_command=command("rendezvous"), coding_agents=3)).propose(ctx)
    # each waits for the others to start: run one after another, the first would give up after 30 s
    assert len(proposals) == 3 and time.monotonic() - start < 25
    assert [p.details["agent"] for p in proposals] == [1, 2, 3]
    assert len({p.candidate.workdir for p in proposals}) == 3 and len({p.hash for p in proposals}) == 3
    assert [p.candidate.name for p in proposals] == ["coding:test/r1#1", "coding:test/r1#2", "coding:test/r1#3"]
    for p, t in zip(proposals, targets):
        gap = t.gap.kind.value
        assert p.gap is t.gap.kind and f"# agent {p.details['agent']} on {gap}" in p.candidate.patch
        task = Path(p.details["task_file"]).read_text()
        assert f"agent {t.index} of 3" in task and f"## Your target: the `{gap}` gap" in task
        assert "Other coding agents work in parallel this round" in task


def test_the_agents_are_apportioned_over_the_gaps_by_their_savings_and_capped_by_the_slots(home, tmp_path):
    ctx = setup(tmp_path, limit=1)
    kinds = frozenset({GapKind.VERIFY_KERNELS, GapKind.DRAFT_KERNELS, GapKind.OVERHEAD})
    closable = [g for g in ctx.cost.gaps if g.kind in kinds and g.saving_ms_per_token > 0]
    targets = assign(ctx, 4, kinds)
    assert [t.index for t in targets] == [1, 2, 3, 4] and targets[0].gap == closable[0]
    counts = {g.kind: sum(t.gap == g for t in targets) for g in closable}
    assert counts[closable[0].kind] >= counts[closable[-1].kind] and sum(counts.values()) == 4
    assert [t.gap.kind for t in assign(ctx, 2, frozenset({GapKind.ACCEPTANCE}))] == [GapKind.ACCEPTANCE] * 2
    assert assign(ctx, 2, frozenset()) == [Target(1, 2, None), Target(2, 2, None)]
    lines = []
    (p,) = CodingAgent(AgentOptions(coding_command=command("note"), coding_agents=4)).propose(
        replace(ctx, log=lines.append))  # it holds one slot
    assert p.details["agents"] == 1 and p.candidate.name == "coding:test/r1"
    assert lines == ["coding: 1 of 4 agents this round (the slots it holds)"]


def test_no_change_no_candidate_and_the_worktrees_are_removed(home, tmp_path):
    lines = []
    ctx = replace(setup(tmp_path), log=lines.append)
    assert CodingAgent(AgentOptions(coding_command=command("nothing"))).propose(ctx) == []
    assert not [x for x in ctx.setup.scratch.iterdir() if x.is_dir()]
    assert sum("changed nothing" in line for line in lines) == 2


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path):
    start = time.monotonic()
    outcome = run_command("sleep 30 & sleep 30; wait", tmp_path, "", tmp_path / "log", 0.5)
    assert outcome == "timed out" and time.monotonic() - start < 10


def test_templates_fill_only_their_placeholders():
    assert fill("claude -p \"$(cat {task_file})\" ${HOME} {x}", task_file="'t.md'") == \
        "claude -p \"$(cat 't.md')\" ${HOME} {x}"
    assert "## Rules" in build_task(context())


def test_the_brief_carries_past_patches_with_their_diffs_verdicts_and_gains(home, tmp_path):
    repo = git_repo(tmp_path / "repo")
    checkout = Checkout.capture(repo)
    patches = []
    for text in ("A = 3  # faster\n", "A = 3  # faster\nB = 4  # and a second file\n"):
        wt = checkout.create(tmp_path / f"wt{len(patches)}")
        (wt.path / "pkg" / "a.py").write_text("A = 3  # faster\n")
        if "B" in text:
            (wt.path / "pkg" / "b.py").write_text("B = 4\n")
        patches.append(wt.diff())
        wt.remove()
    fp = fingerprint("fx")
    first, second, lossy = (STOCK.with_changes(name=n) for n in ("coding:r1", "coding:r2", "coding:r2b"))
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(fp, evaluation(first, STOCK, gain=0.30), CONFIG, round="run/r1", patch=patches[0])
        memory.record_evaluation(fp, evaluation(second, first, gain=0.01, verdict=Outcome.REJECT), CONFIG,
                                 round="run/r2", patch=patches[1], incumbent_patch=patches[0])
        memory.record_evaluation(fp, evaluation(lossy, first, gain=None), CONFIG, round="run/r2",
                                 patch=patches[0] + "diff --git a/pkg/c.py b/pkg/c.py\n", incumbent_patch=patches[0])
        recall = Recall.snapshot(memory, fp)
    inc = Incumbent(Candidate(first, patches[0]), 1, 0.30)
    ctx = context(incumbent=inc, recall=recall)
    brief = build_brief(ctx, Target(1, 1, ctx.cost.top))
    past = brief.split("## Code patches tried before on this deployment (newest first)")[1].split("## Rules")[0]
    blocks = past.split("### entry ")[1:]
    assert [b.split(" ", 1)[0] for b in blocks] == ["3", "2", "1"]  # newest first
    assert "**REJECT** (guard-failed), not timed; guard: token forcing: mismatches" in blocks[0]
    # the second patch is shown as what it added over its incumbent's: pkg/b.py, not pkg/a.py again
    assert "**REJECT** (below-threshold), gain +1.0% [" in blocks[1]
    assert "Change over its incumbent: patch pkg/b.py (+1 -0)." in blocks[1] and "+B = 4" in blocks[1]
    assert "pkg/a.py" not in blocks[1]
    assert "**PROMOTE** (clears-threshold), gain +30.0% [" in blocks[2] and "+A = 3  # faster" in blocks[2]
    assert "no change + code patch" not in brief
    assert "It already carries a code patch, applied in this worktree (patch pkg/a.py (+1 -1))" in brief
