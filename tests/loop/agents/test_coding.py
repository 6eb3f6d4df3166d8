"""The coding agent: an external command edits a worktree; its diff is the candidate."""

import sys
from pathlib import Path

from loop_fixtures import context, git_repo

from specpilot.loop.agents.base import AgentOptions, LoopSetup
from specpilot.loop.agents.coding import CodingAgent, build_task, fill
from specpilot.loop.worktree import Checkout

STAND_IN = Path(__file__).resolve().parents[1] / "coding_stand_in.py"


def command(mode: str) -> str:
    return f"{sys.executable} {STAND_IN} {mode} {{task_file}}"


def test_off_without_a_command_or_a_checkout(home, tmp_path):
    setup = LoopSetup(context().deployment, "cpu", "cpu", Checkout.capture(git_repo(tmp_path / "r")), tmp_path)
    status = CodingAgent().status(setup)
    assert not status.enabled and "SPECPILOT_CODING_AGENT" in status.reason
    assert not CodingAgent(AgentOptions(coding_command="x")).status(
        LoopSetup(setup.deployment, "cpu", "cpu", None, tmp_path)).enabled


def test_the_worktree_diff_is_the_candidate(home, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CODING_AGENT", command("note"))  # the environment knob configures it
    checkout = Checkout.capture(git_repo(tmp_path / "repo"))
    ctx = context(checkout=checkout, scratch=tmp_path / "scratch")
    ctx.setup.scratch.mkdir()
    agent = CodingAgent()
    assert agent.status(ctx.setup).enabled
    (p,) = agent.propose(ctx)
    assert p.agent == "coding" and p.candidate.system.knobs() == ctx.incumbent.candidate.system.knobs()
    assert "+# faster now" in p.candidate.patch and p.details["files"] == ["pkg/a.py"]
    assert Path(p.candidate.workdir, "pkg", "a.py").read_text().endswith("# faster now\n")
    assert p.details["outcome"] == "exit 0" and "stand-in: note done" in Path(p.details["log_file"]).read_text()
    task = Path(p.details["task_file"]).read_text()
    assert ctx.cost.top.kind.value in task and ctx.cost.render() in task and "Lossless" in task
    assert (tmp_path / "repo" / "pkg" / "a.py").read_text() == "A = 2  # uncommitted\n"  # the checkout untouched


def test_no_change_no_candidate_and_the_worktree_is_removed(home, tmp_path):
    checkout = Checkout.capture(git_repo(tmp_path / "repo"))
    ctx = context(checkout=checkout, scratch=tmp_path / "scratch")
    ctx.setup.scratch.mkdir()
    lines = []
    ctx = ctx.__class__(**{**ctx.__dict__, "log": lines.append})
    assert CodingAgent(AgentOptions(coding_command=command("nothing"))).propose(ctx) == []
    assert not (ctx.setup.scratch / "coding-test-r1").exists() and "changed nothing" in lines[0]


def test_templates_fill_only_their_placeholders():
    assert fill("claude -p \"$(cat {task_file})\" ${HOME} {x}", task_file="'t.md'") == \
        "claude -p \"$(cat 't.md')\" ${HOME} {x}"
    assert "## Rules" in build_task(context())
