"""The integration agent: stacks independent changes that were measured as gains, and re-validates.

The controller promotes at most one candidate per round, and only when its lower bound clears
1% + 2 x noise. Two kinds of good news are left on the table: runners-up that were significant
but not selected, and changes whose gain was real but below the bar. Together they may clear it.

Material (`Recall.promotable_changes`): every evaluation of this deployment whose candidate beat
its own incumbent (point estimate > 0) and was not disqualified (guard failure, short or bad
outputs, a crash), latest per system, largest gain first. A change is the candidate's difference
from the incumbent it was measured against (from the stored evaluation, not the system table).

A change still *applies* to the current incumbent when every knob group it touches (see
`systems.KNOB_GROUPS`; code is its own group) is the same on the current incumbent as on the one
it was measured on — then the measurement speaks for the change here too — and it is not applied
already. Changes are *independent* when they touch disjoint groups. Greedily, largest gain first,
the agent stacks up to `max_stack` applicable, mutually independent changes and proposes the stack
(estimated gain: the product of the parts'), and the best single change when the stack has more
than one. The controller re-validates whatever it proposes like any candidate: an estimate from
parts measured on other incumbents is a reason to time, never a result.

A stack holds at most one code change (the code group); its patch is re-applied in a fresh
worktree, since the worktree it was measured in may be gone.

Owns: the selection of changes and the stacks. Does not own measuring them (controller).
"""

from __future__ import annotations

from specpilot.config import System
from specpilot.errors import ConfigError
from specpilot.loop.agents.base import Proposal, Proposer, ProposerContext, register
from specpilot.loop.systems import PATCH_GROUP, Candidate, describe, group_of, short_name
from specpilot.loop.worktree import WorktreeError
from specpilot.memory.records import MemoryRecord, knob_diff


def _parent(record: MemoryRecord, patches: dict[str, str | None]) -> tuple[dict, str | None]:
    """(knobs without name, patch) of the incumbent the record's candidate was measured against."""
    knobs = dict(record.detail["evaluation"]["incumbent"]["system"])
    knobs.pop("name", None)
    return knobs, patches.get(record.incumbent)


def _groups(diff: dict) -> set[str]:
    return {PATCH_GROUP if k == "patch" else group_of(k) for k in diff}


@register("integration")
class IntegrationAgent(Proposer):
    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        inc = ctx.incumbent.candidate
        here = inc.system.knobs()
        patches = {r.candidate.hash: r.candidate.patch for r in ctx.recall.evaluations}
        stack: list[tuple[MemoryRecord, dict]] = []  # (record, change {knob: new} + maybe "patch")
        used: set[str] = set()
        for record in ctx.recall.promotable_changes():
            parent, parent_patch = _parent(record, patches)
            child = {k: v for k, v in record.candidate.knobs.items() if k != "name"}
            diff = knob_diff(parent, child)
            if record.candidate.patch != parent_patch:
                diff["patch"] = [parent_patch, record.candidate.patch]
            groups = _groups(diff)
            if not diff or groups & used or not self._applies(diff, groups, parent, parent_patch, here, inc.patch):
                continue
            stack.append((record, diff))
            used |= groups
            if len(stack) == self.options.max_stack:
                break
        out = []
        if len(stack) > 1:
            out.append(self._proposal(ctx, stack))
        if stack:
            out.append(self._proposal(ctx, stack[:1]))
        return [p for p in out if p is not None]

    @staticmethod
    def _applies(diff: dict, groups: set[str], parent: dict, parent_patch, here: dict, here_patch) -> bool:
        """Every touched group equal on both incumbents, and the change not already in place."""
        for group in groups:
            if group == PATCH_GROUP:
                if here_patch != parent_patch:
                    return False
                continue
            if any(parent.get(k) != here.get(k) for k in here if group_of(k) == group):
                return False
        return any((here_patch != new) if k == "patch" else (here.get(k) != new) for k, (_, new) in diff.items())

    def _proposal(self, ctx: ProposerContext, parts: list[tuple[MemoryRecord, dict]]) -> Proposal | None:
        inc = ctx.incumbent.candidate
        knobs = inc.system.knobs()
        patch = inc.patch
        for _, diff in parts:
            for k, (_, new) in diff.items():
                if k == "patch":
                    patch = new
                else:
                    knobs[k] = new
        try:
            system = System.from_dict(knobs, name="stack")
        except ConfigError:
            return None
        cand = Candidate(system, patch, inc.workdir if patch == inc.patch else None)
        cand = Candidate(system.with_changes(name=short_name(self.name, cand.changes_from(inc))), patch, cand.workdir)
        if patch != inc.patch:
            cand = self._with_worktree(ctx, cand)
            if cand is None:
                return None
        estimate = 1.0
        for record, _ in parts:
            estimate *= 1 + record.gain
        pieces = [f"{describe(d)} ({r.gain:+.1%}, entry {r.id})" for r, d in parts]
        what = "stack of " + " + ".join(pieces) if len(parts) > 1 else "re-validate " + pieces[0]
        why = f"{what}; measured as gains on their own incumbents, independent, estimated {estimate - 1:+.1%} together"
        return Proposal(self.name, cand, why, None, None,
                        {"entries": [r.id for r, _ in parts], "estimated_gain": estimate - 1})

    def _with_worktree(self, ctx: ProposerContext, cand: Candidate) -> Candidate | None:
        checkout = ctx.setup.checkout
        if checkout is None:
            return None
        path = ctx.setup.scratch / f"integration-{ctx.round_label.replace('/', '-')}-{cand.hash[:8]}"
        try:
            wt = checkout.create(path)
            wt.apply(cand.patch)
        except WorktreeError as err:
            ctx.log(f"integration: cannot re-apply the patch of {cand.name}: {err}")
            return None
        return Candidate(cand.system, cand.patch, str(wt.path))
