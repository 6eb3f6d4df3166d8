"""The coding agents' brief: what one external coding agent is asked to do, and what it is told.

Each coding agent of a round gets its own brief (a Markdown file, also on its stdin), built from
the round's evidence:

- its target: the gap it is assigned (`assign`: the round's agents are apportioned over the gaps
  a coding agent can close, by the time each would save, largest first), what closing it would
  save, the files it lives in, and which other agents of the round work on which gap;
- the cost table of the current best system, its knobs, and the patch it already carries;
- past code patches, newest first: each one's change over its incumbent (files, +/- lines, the
  diff itself cut to a line budget), its verdict with the reasons, its gain with the interval, and
  the guard's reason when token forcing rejected it; then patches validated on similar
  deployments, and the knob changes promoted here;
- the rules (lossless, what is timed, do not commit).

Owns: `Target`, `assign`, `build_brief`, `past_patches`. Does not own running the agents
(`coding.py`) or reading the memory (`recall.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.loop.agents.base import ProposerContext
from specpilot.loop.cost_model import Gap, GapKind
from specpilot.loop.patches import excerpt, increment, summarize
from specpilot.loop.slots import apportion
from specpilot.loop.systems import describe
from specpilot.memory.records import MemoryRecord

WHERE = {  # the files a gap lives in
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
PATCHES_SHOWN = 6  # past patches of this deployment in a brief
DIFF_LINES = 40  # lines of each past patch's diff
SIMILAR_SHOWN = 3  # patches validated on similar deployments


@dataclass(frozen=True)
class Target:
    """What one coding agent of the round works on."""

    index: int  # 1-based
    of: int  # agents in the round
    gap: Gap | None  # None: no gap a coding agent can close saves anything: the overall time


def assign(ctx: ProposerContext, n: int, kinds: frozenset[GapKind]) -> list[Target]:
    """`n` targets: the agents apportioned over the gaps of `kinds` by their savings (largest
    first); without such a gap every agent targets the overall time."""
    gaps = [g for g in ctx.cost.gaps if g.kind in kinds and g.saving_ms_per_token > 0]
    if not gaps:
        return [Target(i + 1, n, None) for i in range(n)]
    names = [g.kind.value for g in gaps]
    seats = apportion(names, {g.kind.value: g.saving_ms_per_token for g in gaps}, n)
    order = [g for g in gaps for _ in range(seats[g.kind.value])]
    return [Target(i + 1, n, gap) for i, gap in enumerate(order)]


def build_brief(ctx: ProposerContext, target: Target, others: list[Target] = ()) -> str:
    """The brief of one agent: its target, the cost table, the knobs, the memory, the rules."""
    cost, inc, dep = ctx.cost, ctx.incumbent.candidate, ctx.deployment
    who = f", agent {target.index} of {target.of}" if target.of > 1 else ""
    lines = [
        f"# SpecPilot coding task: round {ctx.round}{who}, deployment `{dep.name}` on {ctx.setup.device_name}",
        "",
        "You are in an isolated git worktree of SpecPilot, a PyTorch package for lossless speculative decoding "
        "(a draft model proposes a token tree, the target verifies it in one forward; greedy, so the output must "
        "equal plain autoregressive decoding). Make ONE focused change to the code that makes decoding of this "
        "deployment faster without changing what it generates. Leave the change in the working tree: do not "
        "commit. Your diff is timed against the current best system in paired runs and promoted only if it is "
        "faster beyond the measurement noise.",
        "",
    ]
    gap = target.gap
    if gap is not None:
        share = gap.saving_ms_per_token / cost.ms_per_token if cost.ms_per_token else 0.0
        lines += [f"## Your target: the `{gap.kind.value}` gap",
                  f"Closing it would save up to {gap.saving_ms_per_token:.3f} ms of {cost.ms_per_token:.3f} ms per "
                  f"token ({share:.0%}). It lives in: {WHERE[gap.kind]}."]
    else:
        lines += ["## Your target: the overall time per token",
                  "No gap a code change can close shows a saving in the cost table; look for any lossless speedup."]
    mates = [o for o in others if o.index != target.index]
    if mates:
        same = [o.index for o in mates if o.gap == gap]
        lines.append("Other coding agents work in parallel this round, each in its own worktree: " + ", ".join(
            f"agent {o.index} on {o.gap.kind.value if o.gap else 'the overall time'}" for o in mates) + "."
            + (" Those on your gap get the same brief: take a different approach than the obvious one."
               if same else ""))
    lines += ["", "## Where the time goes now (cost table of the current best system)", "```", cost.render(), "```",
              "", f"## The current best system `{inc.name}` (engine knobs, specpilot/config.py `System`)", "```",
              inc.system.to_toml().strip(), "```"]
    if inc.patch:
        lines += [f"It already carries a code patch, applied in this worktree ({summarize(inc.patch).line()}):",
                  "```diff", excerpt(inc.patch, DIFF_LINES), "```"]
    lines.append("")
    past = past_patches(ctx)
    if past:
        lines += ["## Code patches tried before on this deployment (newest first)", *past, ""]
    similar = similar_patches(ctx)
    if similar:
        lines += ["## Validated on similar deployments", *similar, ""]
    knobs = promoted_knobs(ctx)
    if knobs:
        lines += ["## Knob changes promoted here", *knobs, ""]
    lines += [
        "## Rules",
        "- Lossless: every token must stay what greedy AR decoding of the target gives (up to float rounding). "
        "Each candidate's outputs are teacher-forced through the stock target; more mismatches than stock, or any "
        "large-margin mismatch, rejects it. Skipping verification, biasing logits or stopping early is rejected.",
        "- Change the engine, kernels or models (specpilot/engine, specpilot/kernels, specpilot/models, "
        "specpilot/w12). specpilot/control, specpilot/guard and specpilot/loop are not what gets timed.",
        "- Keep the engine's knobs (specpilot/config.py) meaning what they mean; a new behaviour should be the default "
        "path or switched by the code itself.",
        "- Do not repeat a patch the memory above rejected; build on what was promoted.",
        "- Run the CPU tests of what you touched if you can (`pytest tests/engine -q`).",
        "",
    ]
    return "\n".join(lines)


def _verdict(r: MemoryRecord) -> str:
    gain = (f"gain {r.gain:+.1%} [{r.gain_lower:+.1%}, {r.gain_upper:+.1%}]" if r.gain is not None
            and r.gain_lower is not None and r.gain_upper is not None else "not timed")
    why = ", ".join(x.value for x in r.reasons)
    guard = f"; guard: {r.guard.get('reason')}" if r.guard_passed is False and r.guard.get("reason") else ""
    return f"**{r.verdict.value.upper()}** ({why}), {gain}{guard}"


def past_patches(ctx: ProposerContext, limit: int = PATCHES_SHOWN, diff_lines: int = DIFF_LINES) -> list[str]:
    """One block per patch evaluated here (newest first): its change over its incumbent (summary and
    diff), verdict, gain, and the guard's reason."""
    out = []
    for r in ctx.recall.evaluations:
        if len(out) == limit:
            break
        parent = ctx.recall.parent_patch(r)
        if not r.candidate.patch or r.candidate.patch == parent:
            continue
        summary = summarize(r.candidate.patch, parent)
        knobs = {k: v for k, v in r.candidate.diff.items()}
        change = describe(knobs, summary)
        new, _ = increment(r.candidate.patch, parent)
        out += [f"### entry {r.id} `{r.candidate.name}` (round {r.round or '-'}): {_verdict(r)}",
                f"Change over its incumbent: {change}.", "```diff", excerpt(new, diff_lines) or "(reverts only)",
                "```"]
    return out


def similar_patches(ctx: ProposerContext, limit: int = SIMILAR_SHOWN) -> list[str]:
    """Patches promoted on similar deployments, most similar first, one line each."""
    out = []
    for sim, r in ctx.recall.similar:
        if len(out) == limit:
            break
        parent = ctx.recall.parent_patch(r)
        if not r.candidate.patch or r.candidate.patch == parent:
            continue
        gain = f"{r.gain:+.1%}" if r.gain is not None else "n/a"
        out.append(f"- entry {r.id} `{r.candidate.name}` on `{r.deployment_name}` (similarity {sim:.2f}): "
                   f"{describe(r.candidate.diff, summarize(r.candidate.patch, parent))}, gain {gain}")
    return out


def promoted_knobs(ctx: ProposerContext, limit: int = 4) -> list[str]:
    """Knob-only changes promoted on this deployment, newest first."""
    out = []
    for r in ctx.recall.promoted():
        if len(out) == limit:
            break
        if r.candidate.patch != ctx.recall.parent_patch(r) or not r.candidate.diff:
            continue
        gain = f"{r.gain:+.1%} [{r.gain_lower:+.1%}, {r.gain_upper:+.1%}]" if r.gain is not None else "n/a"
        out.append(f"- entry {r.id} `{r.candidate.name}`: {describe(r.candidate.diff)}, gain {gain}")
    return out
