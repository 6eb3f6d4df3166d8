"""Gap-driven slots: which agents can close each gap, and how a round's candidate slots are split.

The cost table says where the incumbent's time goes (`cost_model.py`); this module turns that into
who gets to propose. Each gap kind names the agents that can act on it (`CLOSERS`, most direct
first):

    draft-kernels   knob (drafter, tree shape), kernel (drafter projections), coding
    verify-kernels  kernel, knob (kernel, W12 and lm_head knobs), coding
    acceptance      knob (tree shape, drafter, adaptive depth)
    overhead        knob (sync_every, CUDA graphs), coding

A plug-in proposer may declare its own (`Proposer.gaps`); one that names none, like the
integration agent (it stacks changes measured on any gap), counts as a closer of every gap.

The split: each gap's saving (ms per token, `Gap.saving_ms_per_token`) is shared equally by the
enabled agents that can close it; an agent's weight is the sum of its shares, and the round's
`max_candidates` slots are apportioned by weight (largest remainders, ties to the larger weight,
then the given agent order). When no gap saves anything, every agent weighs the same.

Exploration: in one round of every `EXPLORE_EVERY` (which ones is fixed by the seed), when every
agent outside the top gap's closers was left without a slot, one of them (drawn with a generator
seeded by the run's seed and the round) takes a slot from the agent holding the most. So an agent
the gaps never favour still proposes now and then, and the same seed gives the same rounds.

Agents left with no slot are not asked to propose that round (the kernel and coding agents spend
minutes per proposal); slots an agent leaves unused (nothing new to propose) go to the others
that ran, in `rounds.select`, and slots they all leave empty to the agents without a slot, asked
then (`rounds.run_round`).

Owns: `CLOSERS`, `closes`, `Share`, `SlotPlan`, `allocate`. Does not own the gaps (cost model),
proposing (agents) or selecting proposals (rounds).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from specpilot.loop.cost_model import CostTable, GapKind

EXPLORE_EVERY = 3  # one round in this many gives a slot to an agent outside the top gap

CLOSERS: dict[GapKind, tuple[str, ...]] = {
    GapKind.DRAFT_KERNELS: ("knob", "kernel", "coding"),
    GapKind.VERIFY_KERNELS: ("kernel", "knob", "coding"),
    GapKind.ACCEPTANCE: ("knob",),
    GapKind.OVERHEAD: ("knob", "coding"),
}
NAMED = frozenset(name for names in CLOSERS.values() for name in names)


def closes(agent) -> frozenset[GapKind]:
    """The gap kinds `agent` (a `Proposer`) can act on: its declared `gaps`, else `CLOSERS`, else all."""
    declared = getattr(agent, "gaps", None)
    if declared is not None:
        return frozenset(declared)
    if agent.name in NAMED:
        return frozenset(kind for kind, names in CLOSERS.items() if agent.name in names)
    return frozenset(GapKind)


@dataclass(frozen=True)
class Share:
    agent: str
    slots: int
    weight: float  # ms/token of gap savings attributed to the agent
    gap: GapKind | None  # the gap that earned most of its weight (None: no gap saves anything)
    saving_ms_per_token: float  # that gap's whole saving
    explore: bool = False  # its slot is the round's exploration slot

    def to_dict(self) -> dict:
        return {"agent": self.agent, "slots": self.slots, "weight": self.weight,
                "gap": self.gap.value if self.gap else None, "saving_ms_per_token": self.saving_ms_per_token,
                "explore": self.explore}

    @classmethod
    def from_dict(cls, d: dict) -> Share:
        return cls(d["agent"], d["slots"], d["weight"], GapKind(d["gap"]) if d["gap"] else None,
                   d["saving_ms_per_token"], d.get("explore", False))


@dataclass(frozen=True)
class SlotPlan:
    shares: tuple[Share, ...]  # every enabled agent, in the order given
    limit: int
    top: GapKind | None  # the largest gap

    def slots(self, agent: str) -> int:
        return next((s.slots for s in self.shares if s.agent == agent), 0)

    @property
    def active(self) -> tuple[str, ...]:
        """Agents with at least one slot, most slots first (ties: larger weight, then given order)."""
        ranked = sorted(enumerate(self.shares), key=lambda x: (-x[1].slots, -x[1].weight, x[0]))
        return tuple(s.agent for _, s in ranked if s.slots > 0)

    def line(self) -> str:
        """e.g. 'slots: knob 2 (acceptance <gap> ms/tok), kernel 1 (verify-kernels <gap>, exploration)'."""
        by_name = {s.agent: s for s in self.shares}
        parts = []
        for name in self.active:
            s = by_name[name]
            why = [f"{s.gap.value} {s.saving_ms_per_token:.3f} ms/tok"] if s.gap else []
            why += ["exploration"] if s.explore else []
            parts.append(f"{name} {s.slots}" + (f" ({', '.join(why)})" if why else ""))
        idle = [s.agent for s in self.shares if s.slots == 0]
        return "slots: " + ", ".join(parts) + (f"; no slot: {', '.join(idle)}" if idle else "")

    def to_dict(self) -> dict:
        return {"limit": self.limit, "top": self.top.value if self.top else None,
                "shares": [s.to_dict() for s in self.shares]}

    @classmethod
    def from_dict(cls, d: dict) -> SlotPlan:
        return cls(tuple(Share.from_dict(s) for s in d["shares"]), d["limit"], GapKind(d["top"]) if d["top"] else None)


def allocate(cost: CostTable, agents: Sequence[tuple[str, frozenset[GapKind]]], limit: int, round: int,
             seed: int = 0, explore_every: int = EXPLORE_EVERY) -> SlotPlan:
    """Split `limit` slots over `agents` ((name, gap kinds it closes), enabled ones only) by the gaps'
    savings, with the exploration slot in one round (1-based) of every `explore_every`."""
    names = [name for name, _ in agents]
    parts: dict[str, dict[GapKind, float]] = {name: {} for name in names}
    for gap in cost.gaps:
        closers = [name for name, kinds in agents if gap.kind in kinds]
        if gap.saving_ms_per_token > 0 and closers:
            for name in closers:
                parts[name][gap.kind] = gap.saving_ms_per_token / len(closers)
    weights = {name: sum(parts[name].values()) for name in names}
    if sum(weights.values()) <= 0:
        weights = {name: 1.0 for name in names}
    slots = apportion(names, weights, limit)
    top = cost.top.kind if cost.top and cost.top.saving_ms_per_token > 0 else None
    explored = None
    if limit > 0 and top is not None and explore_every > 0 and (round + seed) % explore_every == 0:
        kinds = dict(agents)
        outside = [n for n in names if top not in kinds[n]]
        if outside and not any(slots[n] for n in outside):
            explored = random.Random(f"{seed}:{round}:explore").choice(sorted(outside))
            donor = max(names, key=lambda n: (slots[n], -weights[n], -names.index(n)))
            slots[donor] -= 1
            slots[explored] += 1
    saving = {g.kind: g.saving_ms_per_token for g in cost.gaps}
    shares = []
    for name in names:
        gap = max(parts[name], key=lambda k: (parts[name][k], k.value)) if parts[name] else None
        shares.append(Share(name, slots[name], weights[name], gap, saving.get(gap, 0.0), name == explored))
    return SlotPlan(tuple(shares), limit, top)


def apportion(names: list[str], weights: dict[str, float], limit: int) -> dict[str, int]:
    """Largest-remainder apportionment of `limit` seats by weight (ties: larger weight, then order)."""
    total = sum(weights.values())
    quota = {n: limit * weights[n] / total if total > 0 else 0.0 for n in names}
    seats = {n: int(quota[n]) for n in names}
    order = sorted(names, key=lambda n: (-(quota[n] - seats[n]), -weights[n], names.index(n)))
    for n in order[: limit - sum(seats.values())]:
        seats[n] += 1
    return seats
