"""The proposer interface, what a proposer sees, and the registry of proposers by name.

A proposer agent turns the round's evidence into candidate systems. Two methods:

    status(setup) -> AgentStatus         once per run: on, or off with the reason (said once)
    propose(context) -> list[Proposal]   every round it holds a slot (`slots.py`), best first; may
                                         return more than its slots (the loop takes the first new
                                         ones, and hands slots others leave unused on)

Proposals of all agents run in parallel threads; an agent must not write the memory or time
anything itself (the controller times, the guard judges, the loop promotes and records).

`Proposal` is plain data: the candidate (knobs, and a patch + worktree for code changes), the
agent's name, the gap it targets, a one-line rationale, the agent's estimate if it has one, and
details for the record. `ProposerContext` is frozen, so every agent of a round sees the same
incumbent, cost table and memory snapshot.

Registry: `register(name)` on a class; `PROPOSERS` maps names to classes; `make_proposers(names,
options)` builds them (importing `specpilot.loop.agents` registers the shipped four: knob,
kernel, integration, coding); a name "module:Class" loads a plug-in proposer from elsewhere.

Owns: `AgentStatus`, `AgentOptions`, `LoopSetup`, `ProposerContext`, `Proposal`, `Proposer`, the
registry. Does not own any search strategy.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from specpilot.config import Deployment
from specpilot.errors import ConfigError
from specpilot.loop.cost_model import CostTable, GapKind
from specpilot.loop.recall import Recall
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import Checkout


@dataclass(frozen=True)
class AgentStatus:
    enabled: bool
    reason: str = ""  # why it is off, or what it will do


@dataclass(frozen=True)
class AgentOptions:
    """Settings of the shipped agents (the CLI's flags map onto these)."""

    coding_command: str | None = None  # template of the external coding agent; None = off
    coding_timeout_s: float = 1800.0
    coding_agents: int = 2  # coding-agent processes run at once per round, each in its own worktree
    kernel_budget_s: float = 60.0  # wall time the kernel agent may spend timing kernels per round
    max_stack: int = 4  # most changes the integration agent stacks into one candidate


@dataclass(frozen=True)
class LoopSetup:
    """What an agent may check once, before the first round."""

    deployment: Deployment
    device: str  # "cpu" or "cuda" (the kind of device candidates run on)
    device_name: str  # torch's "NVIDIA ..." name, or e.g. "cpu-x86_64"
    checkout: Checkout | None  # the baseline for worktrees; None when the package is not a git checkout
    scratch: Path  # where agents may write (worktrees, logs, task files)


@dataclass(frozen=True)
class ProposerContext:
    setup: LoopSetup
    round: int  # 1-based
    round_label: str  # stored with every evaluation of the round
    incumbent: Incumbent
    stock: Candidate
    cost: CostTable  # of the incumbent, measured this round
    recall: Recall  # the memory, snapshot at the start of the round
    limit: int  # slots this agent holds this round (the round's candidates, under round-robin)
    models: object | None = None  # the loop's loaded `engine.session.Session` (in-process measurements)
    history: tuple = ()  # (System, CostTable) of systems measured earlier in this run, oldest first
    log: Callable[[str], None] = field(default=lambda line: None, compare=False)

    @property
    def deployment(self) -> Deployment:
        return self.setup.deployment

    @cached_property
    def fp8_target(self) -> bool:
        """The deployment's target is FP8 (`engine.session.fp8_target`): no W12, and the Triton
        projection kernels reach only its BF16 lm_head."""
        from specpilot.engine.session import fp8_target

        return fp8_target(self.deployment)

    @property
    def on_gpu(self) -> bool:
        return self.setup.device == "cuda"

    @property
    def gaps(self) -> tuple[GapKind, ...]:
        """Gap kinds, largest saving first."""
        return tuple(g.kind for g in self.cost.gaps)


@dataclass(frozen=True)
class Proposal:
    agent: str
    candidate: Candidate
    rationale: str  # one line: why this should be faster
    gap: GapKind | None = None  # the gap it targets
    predicted_ms_per_token: float | None = None  # the agent's estimate, if it has one
    details: dict = field(default_factory=dict)  # plain data for the record

    @property
    def hash(self) -> str:
        return self.candidate.hash

    def to_dict(self, incumbent: Candidate | None = None) -> dict:
        return {
            "agent": self.agent, "name": self.candidate.name, "hash": self.hash,
            "changes": self.candidate.changes_from(incumbent) if incumbent else None,
            "knobs": self.candidate.system.knobs(), "has_patch": self.candidate.patch is not None,
            "patch_summary": _summary(self.candidate, incumbent),
            "rationale": self.rationale, "gap": self.gap.value if self.gap else None,
            "predicted_ms_per_token": self.predicted_ms_per_token, "details": self.details,
        }


def _summary(candidate: Candidate, incumbent: Candidate | None) -> dict | None:
    """The summary of what the candidate's patch changes over the incumbent's, as plain data."""
    summary = candidate.patch_summary(incumbent) if incumbent is not None or candidate.patch else None
    return summary.to_dict() if summary is not None else None


class Proposer(abc.ABC):
    name: ClassVar[str]
    # the gap kinds it can close (`slots.py` splits a round's slots by them); None: the shipped
    # table for a shipped agent, every gap for any other
    gaps: ClassVar[frozenset[GapKind] | None] = None

    def __init__(self, options: AgentOptions = AgentOptions()):
        self.options = options

    def status(self, setup: LoopSetup) -> AgentStatus:
        """On, or off with the reason; asked once per run."""
        return AgentStatus(True)

    @abc.abstractmethod
    def propose(self, context: ProposerContext) -> list[Proposal]: ...


PROPOSERS: dict[str, type[Proposer]] = {}


def register(name: str):
    def wrap(cls):
        cls.name = name
        PROPOSERS[name] = cls
        return cls

    return wrap


def make_proposers(names: tuple[str, ...] | list[str], options: AgentOptions = AgentOptions()) -> list[Proposer]:
    """Build the named proposers, in the order given. A name "module:Class" imports a proposer class
    from elsewhere (a plug-in) and registers it under its `name`."""
    import specpilot.loop.agents  # noqa: F401 - registers the shipped agents
    from specpilot.control.arm import load_object

    resolved = []
    for n in names:
        if ":" in n:
            cls = load_object(n, "proposer agent")
            if not (isinstance(cls, type) and issubclass(cls, Proposer) and getattr(cls, "name", None)):
                raise ConfigError(f"proposer agent {n!r} is not a Proposer subclass with a `name`")
            PROPOSERS.setdefault(cls.name, cls)
            n = cls.name
        resolved.append(n)
    names = resolved
    unknown = [n for n in names if n not in PROPOSERS]
    if unknown:
        raise ConfigError(f"unknown agent(s) {', '.join(unknown)} (known: {', '.join(PROPOSERS)})")
    if len(set(names)) != len(names):
        raise ConfigError(f"agents listed twice: {', '.join(names)}")
    return [PROPOSERS[n](options) for n in names]
