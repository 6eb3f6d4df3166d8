"""The coding agent: an external coding-agent CLI edits an isolated worktree; its diff is the candidate.

Each round it creates a worktree of the baseline checkout (`worktree.py`) with the incumbent's
patch applied, writes a task built from the round's evidence — the largest gap and what closing it
would save, the cost table, the incumbent's knobs, the files that gap lives in, and the relevant
memory entries (promoted changes, and what was rejected and why) — and runs the configured
command in the worktree. Whatever the command leaves changed there (`git diff` against the
baseline) is the candidate: the incumbent's knobs plus that complete patch, timed by the
controller with its workers importing the worktree's code. Nothing changed: no proposal.

The command is a template (`--coding-agent`, or `SPECPILOT_CODING_AGENT`; see `env.py`) run by
the shell in the worktree, with the task also on its stdin. Placeholders:

    {task_file}   path of the task (Markdown)        {task}      the task text, shell-quoted
    {workdir}     the worktree                        {round}     the round number

    claude -p "$(cat {task_file})" --permission-mode acceptEdits     # Claude Code
    codex exec --full-auto {task}                                     # Codex CLI
    aider --yes-always --message-file {task_file}                     # aider

With no command configured, or when the package is not a git checkout, the agent is off (said
once). The command's output goes to a log file next to the task; a non-zero exit or a timeout
is logged, and any edits it made are still the candidate (the guard and the timing judge them).

Owns: the worktree's life for its candidate, the task text, running the command. Does not own
judging the patch (guard, controller) or keeping it (the loop).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

from specpilot import env
from specpilot.loop.agents.base import AgentStatus, LoopSetup, Proposal, Proposer, ProposerContext, register
from specpilot.loop.cost_model import GapKind
from specpilot.loop.systems import Candidate, describe
from specpilot.loop.worktree import WorktreeError, remove

WHERE = {  # the files a gap lives in, for the task
    GapKind.VERIFY_KERNELS: "specpilot/kernels/ (Triton GEMV/GEMM, launch configs and tuned tables in configs.py), "
                            "specpilot/models/transformer.py (attention, projections), specpilot/engine/steps.py "
                            "(tree_forward)",
    GapKind.DRAFT_KERNELS: "specpilot/engine/drafters/draft_model.py (catch-up, expansion, selection), "
                           "specpilot/models/transformer.py",
    GapKind.OVERHEAD: "specpilot/engine/generator.py (the host loop and its one sync point), "
                      "specpilot/engine/steps.py, verify.py, tree.py, state.py (per-round bookkeeping)",
    GapKind.ACCEPTANCE: "specpilot/engine/drafters/ (how the draft tree is grown and selected), "
                        "specpilot/engine/tree.py",
}


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
        return AgentStatus(True, f"runs `{template}` in a worktree each round")

    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        template = command_template(self.options.coding_command)
        checkout = ctx.setup.checkout
        if not template or checkout is None:
            return []
        stem = f"coding-{ctx.round_label.replace('/', '-')}"
        path = ctx.setup.scratch / stem
        inc = ctx.incumbent.candidate
        try:
            wt = checkout.create(path)
            wt.apply(inc.patch or "")
        except WorktreeError as err:
            ctx.log(f"coding: cannot prepare a worktree: {err}")
            return []
        task = build_task(ctx)
        task_file = ctx.setup.scratch / f"{stem}-task.md"
        task_file.write_text(task)
        log_file = ctx.setup.scratch / f"{stem}.log"
        command = fill(template, task_file=shlex.quote(str(task_file)), task=shlex.quote(task),
                       workdir=shlex.quote(str(wt.path)), round=str(ctx.round))
        start = time.monotonic()
        outcome = run_command(command, wt.path, task, log_file, self.options.coding_timeout_s)
        seconds = time.monotonic() - start
        patch = wt.diff()
        if not patch or patch == (inc.patch or ""):
            ctx.log(f"coding: `{command[:60]}` {outcome} after {seconds:.0f} s and changed nothing")
            remove(checkout.root, wt.path)
            return []
        files = wt.changed_files()
        gap = ctx.cost.top.kind if ctx.cost.top else None
        system = inc.system.with_changes(name=f"coding:{ctx.round_label}")
        why = (f"coding agent on the {gap.value if gap else 'overall'} gap ({outcome}, {seconds:.0f} s): "
               f"changed {', '.join(files[:4])}{' ...' if len(files) > 4 else ''}")
        return [Proposal(self.name, Candidate(system, patch, str(wt.path)), why, gap, None,
                         {"files": files, "task_file": str(task_file), "log_file": str(log_file),
                          "seconds": seconds, "outcome": outcome})]


def fill(template: str, **values: str) -> str:
    """The template with each `{name}` placeholder replaced (other braces, e.g. `${HOME}`, kept)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    return template


def run_command(command: str, cwd: Path, task: str, log_file: Path, timeout_s: float) -> str:
    """Run the agent's command; 'exit 0', 'exit N' or 'timed out' (output to `log_file`)."""
    with open(log_file, "wb") as log:
        try:
            proc = subprocess.run(command, shell=True, cwd=cwd, input=task.encode(), stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            return "timed out"
    return f"exit {proc.returncode}"


def build_task(ctx: ProposerContext) -> str:
    """The task text: the gap, the cost table, the knobs, the files, the memory, the rules."""
    cost, inc = ctx.cost, ctx.incumbent.candidate
    top = cost.top
    dep = ctx.deployment
    lines = [
        f"# SpecPilot coding task: round {ctx.round}, deployment `{dep.name}` on {ctx.setup.device_name}",
        "",
        "You are in an isolated git worktree of SpecPilot, a PyTorch package for lossless speculative decoding "
        "(a draft model proposes a token tree, the target verifies it in one forward; greedy, so the output must "
        "equal plain autoregressive decoding). Make ONE focused change to the code that makes decoding of this "
        "deployment faster without changing what it generates. Leave the change in the working tree: do not "
        "commit. Your diff is timed against the current best system in paired runs and promoted only if it is "
        "faster beyond the measurement noise.",
        "",
    ]
    if top is not None:
        share = top.saving_ms_per_token / cost.ms_per_token if cost.ms_per_token else 0.0
        lines += [f"## Target: the largest gap, `{top.kind.value}`",
                  f"Closing it would save up to {top.saving_ms_per_token:.3f} ms of {cost.ms_per_token:.3f} ms per "
                  f"token ({share:.0%}). It lives in: {WHERE[top.kind]}.", ""]
    lines += ["## Where the time goes now (cost table of the current best system)", "```", cost.render(), "```", "",
              f"## The current best system `{inc.name}` (engine knobs, specpilot/config.py `System`)", "```",
              inc.system.to_toml().strip(), "```",
              "It already carries a code patch (applied in this worktree)." if inc.patch else "", ""]
    memory = relevant_memory(ctx)
    if memory:
        lines += ["## What earlier rounds found (the memory)", *memory, ""]
    lines += [
        "## Rules",
        "- Lossless: every token must stay what greedy AR decoding of the target gives (up to float rounding). "
        "Each candidate's outputs are teacher-forced through the stock target; more mismatches than stock, or any "
        "large-margin mismatch, rejects it. Skipping verification, biasing logits or stopping early is rejected.",
        "- Change the engine, kernels or models (specpilot/engine, specpilot/kernels, specpilot/models, "
        "specpilot/w12). specpilot/control, specpilot/guard and specpilot/loop are not what gets timed.",
        "- Keep the engine's knobs (specpilot/config.py) meaning what they mean; a new behaviour should be the default "
        "path or switched by the code itself.",
        "- Run the CPU tests of what you touched if you can (`pytest tests/engine -q`).",
        "",
    ]
    return "\n".join(lines)


def relevant_memory(ctx: ProposerContext, limit: int = 8) -> list[str]:
    """One line per relevant entry: promoted changes first, then code patches tried and how they fared."""
    promoted = list(ctx.recall.promoted())[:limit // 2]
    patches = [r for r in ctx.recall.evaluations if r.candidate.patch and r not in promoted][: limit - len(promoted)]
    out = []
    for r in promoted + patches:
        gain = f"{r.gain:+.1%} [{r.gain_lower:+.1%}, {r.gain_upper:+.1%}]" if r.gain is not None else "not timed"
        why = ", ".join(x.value for x in r.reasons)
        what = describe(r.candidate.diff) + (" + code patch" if r.candidate.patch else "")
        out.append(f"- entry {r.id} `{r.candidate.name}` ({what}): {r.verdict.value} ({why}), gain {gain}"
                   + (f"; guard: {r.guard.get('reason')}" if r.guard_passed is False and r.guard.get("reason") else ""))
    return out
