"""What the memory hands back: frozen records of systems and evaluations, and system identity.

A system's identity is its content: `system_hash(knobs, patch)` hashes the knob values (name
excluded) and the patch's sha256, so the same change proposed twice is one system, and two
systems that differ only in name are one as well.

Owns: `SystemRecord`, `MemoryRecord`, `StoredNoise`, `Validated`, `system_hash`, `knob_diff`. Does
not own SQL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from specpilot.control.config import Stage
from specpilot.control.controller import Evaluation
from specpilot.control.load import Load
from specpilot.control.rule import Reason, Outcome
from specpilot.control.stats import NoiseFloor


def patch_sha256(patch: str | None) -> str | None:
    return hashlib.sha256(patch.encode()).hexdigest() if patch else None


def system_hash(knobs: dict, patch: str | None = None) -> str:
    """Identity of a system: its knobs (without the name) and its patch."""
    body = {"knobs": {k: v for k, v in knobs.items() if k != "name"}, "patch": patch_sha256(patch)}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def knob_diff(parent: dict, child: dict) -> dict:
    """{knob: [parent's, child's]} for every knob whose value differs (missing = None); name excluded."""
    keys = sorted((set(parent) | set(child)) - {"name"})
    return {k: [parent.get(k), child.get(k)] for k in keys if parent.get(k) != child.get(k)}


@dataclass(frozen=True)
class SystemRecord:
    hash: str
    name: str
    knobs: dict
    patch: str | None
    parent: str | None
    diff: dict  # against the parent, see knob_diff
    created_at: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class MemoryRecord:
    id: int
    deployment: str  # fingerprint digest
    deployment_name: str
    candidate: SystemRecord
    incumbent: str  # system hash
    round: str
    stage: Stage
    verdict: Outcome
    reasons: tuple[Reason, ...]
    gain: float | None
    gain_lower: float | None
    gain_upper: float | None
    threshold: float | None
    noise: float | None
    p_value: float | None
    blocks: int
    guard_passed: bool | None
    guard: dict
    detail: dict  # {"evaluation": Evaluation.to_dict(), "config": ..., "commit": ..., "host": ...}
    created_at: str
    load: Load | None = None  # the machine load it was timed under; None: stored before loads were

    @property
    def validated(self) -> bool:
        return self.verdict is Outcome.PROMOTE

    @property
    def contended(self) -> bool:
        """Timed without the timing lock or alongside another timing run."""
        return self.load is not None and self.load.contended

    def evaluation(self) -> Evaluation:
        return Evaluation.from_dict(self.detail["evaluation"])

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(candidate=self.candidate.to_dict(), stage=self.stage.value, verdict=self.verdict.value,
                 reasons=[r.value for r in self.reasons], load=self.load.to_dict() if self.load else None)
        return d


@dataclass(frozen=True)
class StoredNoise:
    """A noise floor as stored, with the load it was measured under (None: stored before loads were)."""

    id: int
    noise: NoiseFloor
    load: Load | None
    created_at: str


@dataclass(frozen=True)
class Validated:
    """A promoted entry with its estimated speed-up over stock (the product of the gains along
    the chain of promotions that leads to it)."""

    record: MemoryRecord
    cumulative_gain: float
