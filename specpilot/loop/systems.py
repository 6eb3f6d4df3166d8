"""What the loop times and promotes: a system's knobs, its patch, and where its code lives.

A `Candidate` is a `config.System` (the engine's knobs) plus, for code changes, a patch against
the loop's baseline checkout and the worktree that holds it (`worktree.py`). Its identity is the
memory's (`memory.records.system_hash`: knobs without the name, and the patch), so the loop and
the memory agree on what "already evaluated" means. The incumbent is a candidate that won.

Knob groups say which knobs interact: a change measured on one incumbent transfers to another
only if every group it touches is the same on both (the integration agent's test of independence).

Owns: `Candidate`, `Incumbent`, knob groups and describing changes. Does not own running anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.config import DrafterKind, System
from specpilot.errors import ConfigError
from specpilot.control.arm import ArmSpec
from specpilot.loop.patches import PatchSummary, summarize
from specpilot.memory.records import knob_diff, system_hash

# knobs that interact, by group: a tree's shape, its drafter and window form one; kernels another
KNOB_GROUPS: dict[str, tuple[str, ...]] = {
    "tree": ("drafter", "depth", "topk", "tree_budget", "draft_window", "adaptive_depth", "ngram_min", "ngram_max",
             "block_size", "tree_construction"),
    "kernels": ("kernel", "w12", "kernel_lm_head", "kernel_table", "attention", "pdl", "rope_store"),
    "runtime": ("cuda_graphs", "sync_every"),
    "batch": ("shared_budget", "row_depth_margin", "segment_tokens", "attention_span"),
    "fault": ("fault",),
}
PATCH_GROUP = "code"

# Switching drafter, as knob changes: the draft model and EAGLE-3 keep the system's tree shape;
# DFlash starts from a DDTree of 32 nodes over its trained block.
DRAFTER_SWITCHES: dict[DrafterKind, dict] = {
    DrafterKind.MODEL: {"drafter": DrafterKind.MODEL.value},
    DrafterKind.EAGLE3: {"drafter": DrafterKind.EAGLE3.value},
    DrafterKind.DFLASH: {"drafter": DrafterKind.DFLASH.value, "tree_construction": "best_first", "tree_budget": 32},
}


def switched(system: System, kind: DrafterKind) -> System | None:
    """`system` drafting with `kind` (DRAFTER_SWITCHES; its other knobs kept), or None where the
    knobs do not combine."""
    try:
        return System.from_dict({**system.knobs(), **DRAFTER_SWITCHES[kind]}, name=f"{system.name}+{kind.value}")
    except ConfigError:
        return None


def group_of(knob: str) -> str:
    for group, knobs in KNOB_GROUPS.items():
        if knob in knobs:
            return group
    return knob  # a knob added later is its own group until someone says otherwise


@dataclass(frozen=True)
class Candidate:
    system: System
    patch: str | None = None  # complete patch against the baseline checkout ('' is normalised to None)
    workdir: str | None = None  # worktree holding the patch (None: the code this process runs)

    def __post_init__(self):
        if not self.patch:
            object.__setattr__(self, "patch", None)

    @property
    def name(self) -> str:
        return self.system.name

    @property
    def knobs(self) -> dict:
        """The memory's knob dict: every knob plus the name (hashes ignore the name)."""
        return {"name": self.system.name, **self.system.knobs()}

    @property
    def hash(self) -> str:
        return system_hash(self.knobs, self.patch)

    def runner_spec(self, deployment: str, factory: str) -> ArmSpec:
        return ArmSpec(deployment, self.knobs, workdir=self.workdir, factory=factory)

    def changes_from(self, parent: Candidate) -> dict:
        """{knob: [parent's, ours]} plus {"patch": [had one, has one]} when the patches differ."""
        diff = knob_diff(parent.system.knobs(), self.system.knobs())
        if self.patch != parent.patch:
            diff["patch"] = [parent.patch is not None, self.patch is not None]
        return diff

    def groups_changed_from(self, parent: Candidate) -> set[str]:
        return {PATCH_GROUP if k == "patch" else group_of(k) for k in self.changes_from(parent)}

    def patch_summary(self, parent: Candidate | None) -> PatchSummary | None:
        """What this candidate's patch changes over `parent`'s (None: the patches are the same)."""
        parent_patch = parent.patch if parent is not None else None
        return summarize(self.patch, parent_patch) if self.patch != parent_patch else None

    def describe_changes(self, parent: Candidate) -> str:
        return describe(self.changes_from(parent), self.patch_summary(parent))


def describe(diff: dict, patch: PatchSummary | dict | None = None) -> str:
    """'depth 5->3, tree_budget 7->4, patch specpilot/engine/faults.py (+1 -1)' for a changes dict
    (see `Candidate.changes_from`) and the summary of the patch's change (`patches.PatchSummary`, or
    its dict); without a summary a patch change reads '+ patch' / '- patch'."""
    summary = PatchSummary.from_dict(patch) if isinstance(patch, dict) else patch
    parts = []
    for k, (old, new) in diff.items():
        if k == "patch":
            parts.append(summary.line() if summary is not None else "+ patch" if new else "- patch")
        else:
            parts.append(f"{k} {_value(old)}->{_value(new)}")
    if "patch" not in diff and summary is not None and not summary.empty:
        parts.append(summary.line())
    return ", ".join(parts) or "no change"


def _value(v) -> str:
    if isinstance(v, list):
        return "(" + ",".join(map(str, v)) + ")"
    if isinstance(v, str):
        return v or "''"
    return str(v).lower() if isinstance(v, bool) else str(v)


def short_name(agent: str, diff: dict, limit: int = 56) -> str:
    """A system name for tables: 'knob:depth=3,tree_budget=4'."""
    parts = [("patch" if k == "patch" else f"{k}={_value(v[1])}") for k, v in diff.items()]
    text = f"{agent}:" + (",".join(parts) or "same")
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Incumbent:
    """The current best system and how it got there."""

    candidate: Candidate
    entry_id: int | None = None  # the memory entry that promoted it (None: stock)
    cumulative_gain: float = 0.0  # estimated gain over stock along its chain of promotions
    round: str = ""  # round label of that promotion
    lineage: frozenset[str] = frozenset()  # hashes of stock and every system it was promoted over

    def promote(self, candidate: Candidate, entry_id: int, gain: float, round: str) -> Incumbent:
        """The incumbent after `candidate` won `gain` over this one."""
        return Incumbent(candidate, entry_id, (1 + self.cumulative_gain) * (1 + gain) - 1, round,
                         self.lineage | {self.candidate.hash})

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def is_stock(self) -> bool:
        return self.entry_id is None
