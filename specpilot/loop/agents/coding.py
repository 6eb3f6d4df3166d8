"""The coding agents: external coding-agent CLIs edit isolated worktrees, in parallel; each diff is a candidate.

Each round the agent runs up to `AgentOptions.coding_agents` copies of the configured command at
once (never more than the slots it holds that round, `ProposerContext.limit`), each in its own
worktree of the baseline checkout (`worktree.py`) with the incumbent's patch applied. Each copy
gets its own brief (`brief.py`): the gap it targets (the copies are apportioned over the gaps a
code change can close, by what each would save), the cost table, the incumbent's knobs and patch,
and the past patches with their diffs, verdicts and gains. Whatever a copy leaves changed in its
worktree (`git diff` against the baseline) is a candidate: the incumbent's knobs plus that
complete patch, timed by the controller with its workers importing the worktree's code. A copy
that changes nothing proposes nothing; two copies that make the same patch propose it once.

The command is a template (`--coding-agent`, or `SPECPILOT_CODING_AGENT`; see `env.py`) run by
the shell in the worktree, with the brief also on its stdin. Placeholders:

    {task_file}   path of the brief (Markdown)       {task}      the brief's text, shell-quoted
    {workdir}     the worktree                        {round}     the round number
    {agent}       this copy's number (1..N)           {gap}       the gap it targets ('overall' if none)

The same values are in its environment: SPECPILOT_TASK_FILE, SPECPILOT_WORKDIR, SPECPILOT_ROUND,
SPECPILOT_AGENT, SPECPILOT_AGENTS (N) and SPECPILOT_GAP.

    claude -p "$(cat {task_file})" --permission-mode acceptEdits     # Claude Code
    codex exec --full-auto {task}                                     # Codex CLI
    aider --yes-always --message-file {task_file}                     # aider

With no command configured, or when the package is not a git checkout, the agent is off (said
once). Each copy's output goes to a log file next to its brief; a non-zero exit or a timeout is
logged, and any edits it made are still the candidate (the guard and the timing judge them).

Owns: the worktrees' life for their candidates, running the commands in parallel. Does not own
the brief's text (`brief.py`), judging a patch (guard, controller) or keeping it (the loop).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specpilot import env
from specpilot.loop.agents.base import AgentStatus, LoopSetup, Proposal, Proposer, ProposerContext, register
from specpilot.loop.agents.brief import Target, assign, build_brief
from specpilot.loop.slots import closes
from specpilot.loop.systems import Candidate
from specpilot.loop.worktree import WorktreeError, remove


def command_template(options_command: str | None) -> str | None:
    return options_command or env.coding_agent_command()


@register("coding")
class CodingAgent(Proposer):
    def status(self, setup: LoopSetup) -> AgentStatus:
        template = command_template(self.options.coding_command)
        if not template:
            return AgentStatus(False, "no coding-agent command configured (set SPECPILOT_CODING_AGENT or "
                                      "pass --coding-agent, e.g. 'claude -p \"$(cat {task_file})\"')")
        if setup.checkout is None:
            return AgentStatus(False, "the package is not imported from a git checkout: no worktree to edit")
        n = self.options.coding_agents
        return AgentStatus(True, f"runs `{template}` in {n} worktree{'s' if n > 1 else ''} at once each round "
                                 "(at most its slots)")

    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        template = command_template(self.options.coding_command)
        if not template or ctx.setup.checkout is None:
            return []
        n = max(1, min(self.options.coding_agents, ctx.limit))
        targets = assign(ctx, n, closes(self))
        if n < self.options.coding_agents:
            ctx.log(f"coding: {n} of {self.options.coding_agents} agents this round (the slots it holds)")
        if n > 1:
            ctx.log(f"coding: {n} agents in parallel: " + ", ".join(
                f"#{t.index} {t.gap.kind.value if t.gap else 'overall'}" for t in targets))
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="coding") as pool:
            results = list(pool.map(lambda t: self._one(ctx, template, t, targets), targets))
        out, seen = [], set()
        for p in results:
            if p is None:
                continue
            if p.hash in seen:  # two agents made the same patch: one candidate
                ctx.log(f"coding: agent {p.details['agent']} made the same patch as another: dropped")
                remove(ctx.setup.checkout.root, Path(p.candidate.workdir))
                continue
            seen.add(p.hash)
            out.append(p)
        return out

    def _one(self, ctx: ProposerContext, template: str, target: Target, targets: list[Target]) -> Proposal | None:
        """Run one agent in its own worktree; its proposal, or None when it changed nothing."""
        checkout, inc = ctx.setup.checkout, ctx.incumbent.candidate
        stem = f"coding-{ctx.round_label.replace('/', '-')}-a{target.index}"
        try:
            wt = checkout.create(ctx.setup.scratch / stem)
            wt.apply(inc.patch or "")
        except WorktreeError as err:
            ctx.log(f"coding: agent {target.index}: cannot prepare a worktree: {err}")
            return None
        task = build_brief(ctx, target, targets)
        task_file = ctx.setup.scratch / f"{stem}-task.md"
        task_file.write_text(task)
        log_file = ctx.setup.scratch / f"{stem}.log"
        gap = target.gap.kind.value if target.gap else "overall"
        values = {"task_file": str(task_file), "workdir": str(wt.path), "round": str(ctx.round),
                  "agent": str(target.index), "gap": gap}
        command = fill(template, task=shlex.quote(task), **{k: shlex.quote(v) for k, v in values.items()})
        environ = {f"SPECPILOT_{k.upper()}": v for k, v in values.items()} | {"SPECPILOT_AGENTS": str(target.of)}
        start = time.monotonic()
        outcome = run_command(command, wt.path, task, log_file, self.options.coding_timeout_s, environ)
        seconds = time.monotonic() - start
        patch = wt.diff()
        if not patch or patch == (inc.patch or ""):
            ctx.log(f"coding: agent {target.index} ({gap}): `{command[:60]}` {outcome} after {seconds:.0f} s and "
                    "changed nothing")
            remove(checkout.root, wt.path)
            return None
        suffix = f"#{target.index}" if target.of > 1 else ""
        candidate = Candidate(inc.system.with_changes(name=f"coding:{ctx.round_label}{suffix}"), patch, str(wt.path))
        summary = candidate.patch_summary(inc)
        why = f"coding agent {target.index} on the {gap} gap ({outcome}, {seconds:.0f} s): {summary.line()}"
        return Proposal(self.name, candidate, why, target.gap.kind if target.gap else None, None,
                        {"agent": target.index, "agents": target.of, "files": wt.changed_files(),
                         "patch": summary.to_dict(), "task_file": str(task_file), "log_file": str(log_file),
                         "seconds": seconds, "outcome": outcome})


def fill(template: str, **values: str) -> str:
    """The template with each `{name}` placeholder replaced (other braces, e.g. `${HOME}`, kept)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    return template


def run_command(command: str, cwd: Path, task: str, log_file: Path, timeout_s: float,
                environ: dict | None = None) -> str:
    """Run the agent's command; 'exit 0', 'exit N' or 'timed out' (output to `log_file`). On a
    timeout its whole process group (the shell and what it started) is killed."""
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(command, shell=True, cwd=cwd, stdin=subprocess.PIPE, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(environ or {})})
        try:
            proc.communicate(task.encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the agent and its children only
            except ProcessLookupError:
                pass
            proc.wait()
            return "timed out"
    return f"exit {proc.returncode}"


def build_task(ctx: ProposerContext) -> str:
    """The brief of a round's only coding agent (see `brief.build_brief`)."""
    return build_brief(ctx, assign(ctx, 1, closes(CodingAgent()))[0])
