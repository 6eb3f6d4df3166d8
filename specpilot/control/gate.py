"""The guard gate: the losslessness check a candidate must pass before any time is spent timing it.

    Gate = Callable[[GateRequest], GateResult]

The controller generates the candidate's (and the incumbent's) outputs on a cheap subset of
prompts in their own isolated workers and hands them to the gate; the gate (the token-forcing
guard, `specpilot.guard`, wired by name) decides from tokens alone and returns numbers for the
memory. A candidate whose gate fails is rejected untimed and is never promoted, whatever its
speed. The gate never sees timing data, so gating first does not bias the timing statistics.

`AlwaysPass` exists only for tests of the timing path; the CLI has no name for it and defaults
to the guard.

Owns: `GateRequest`, `GateResult`, `AlwaysPass`, `load_gate`. Does not own the guard's statistics.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable

from specpilot.control.blocks import Outputs
from specpilot.control.spec import RunnerSpec, load_object
from specpilot.errors import ConfigError

DEFAULT_GATE = "specpilot.guard.gate:controller_gate"  # the token-forcing guard (wired by the guard's owner)


@dataclass(frozen=True)
class GateRequest:
    deployment: str  # deployment file or shipped name
    incumbent: RunnerSpec
    candidate: RunnerSpec
    prompts: Outputs  # the cheap subset's prompt ids
    candidate_outputs: Outputs  # generated in the candidate's isolated worker
    incumbent_outputs: Outputs  # generated in the incumbent's worker (a reference; the guard may rescore)
    max_new_tokens: int


@dataclass(frozen=True)
class GateResult:
    passed: bool
    summary: dict = field(default_factory=dict)  # plain numbers for the memory (e.g. mismatch rates)
    reason: str = ""  # one line when it fails

    def __post_init__(self):
        try:
            json.dumps(self.summary, allow_nan=True)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"gate summary must be plain JSON data ({err})") from None

    def to_dict(self) -> dict:
        return {"passed": self.passed, "summary": self.summary, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict) -> "GateResult":
        return cls(bool(d["passed"]), dict(d.get("summary", {})), d.get("reason", ""))


Gate = Callable[[GateRequest], GateResult]


class AlwaysPass:
    """Passes everything. For tests of the timing path only — never a default."""

    def __call__(self, request: GateRequest) -> GateResult:
        same = sum(a == b for a, b in zip(request.candidate_outputs, request.incumbent_outputs))
        n = len(request.prompts)
        return GateResult(True, {"gate": "always-pass", "prompts": n,
                                 "identical_outputs": same, "identical_rate": same / n if n else math.nan})


ALWAYS_PASS = AlwaysPass()


def load_gate(path: str = DEFAULT_GATE) -> Gate:
    """The gate named by "module:attr" (a callable GateRequest -> GateResult)."""
    try:
        gate = load_object(path, "guard gate")
    except ConfigError as err:
        raise ConfigError(f"{err}; the token-forcing guard is needed to promote (pass --gate module:attr)") from None
    if not callable(gate):
        raise ConfigError(f"guard gate {path!r} is not callable")
    return gate
