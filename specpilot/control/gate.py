"""The guard gate: the losslessness check a candidate must pass before any time is spent timing it.

    Gate = Callable[[GateRequest], GateResult]

The controller generates the candidate's (and the incumbent's) outputs on a cheap subset of
prompts in their own isolated workers and hands them to the gate; the gate (the token-forcing
guard, `specpilot.guard`, wired by name) decides from tokens alone and returns numbers for the
memory. A candidate whose gate fails is rejected untimed and is never promoted, whatever its
speed. The gate never sees timing data, so gating first does not bias the timing statistics.

`AlwaysPass` exists only for tests of the timing path; the CLI has no name for it and defaults
to the guard.

Under a sampled regime (the deployment's `Regime.sampling`) `controller_gate` is the sampling
guard (`sampled_gate`: PIT uniformity of the sampled outputs forced through the stock target)
instead of token forcing; greedy deployments are judged as before.

Owns: `GateRequest`, `GateResult`, `AlwaysPass`, `controller_gate` (the guard as a gate), `sampled_gate`,
`load_gate`.
Does not own the guard's statistics.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable

from specpilot.control.blocks import Outputs
from specpilot.control.arm import ArmSpec, load_object
from specpilot.errors import ConfigError

DEFAULT_GATE = "specpilot.control.gate:controller_gate"  # the token-forcing guard


@dataclass(frozen=True)
class GateRequest:
    deployment: str  # deployment file or shipped name
    incumbent: ArmSpec
    candidate: ArmSpec
    prompts: Outputs  # the cheap subset's prompt ids
    candidate_outputs: Outputs  # generated in the candidate's isolated worker
    incumbent_outputs: Outputs  # generated in the incumbent's worker (a reference; the guard may rescore)
    max_new_tokens: int
    seeds: tuple[int, ...] = ()  # per prompt, the sampling seeds both arms used; () when the regime is greedy


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


def controller_gate(request: GateRequest, config=None) -> GateResult:
    """The token-forcing guard as a gate: the candidate's outputs vs *stock AR* outputs for the same
    prompts, generated and forced in this process's session for the deployment and device (so in
    the dtype the workers use). The baseline is stock AR, not the incumbent: comparing against the
    incumbent would let the allowed excess compound over successive promotions."""
    from specpilot.guard.config import GuardConfig
    from specpilot.guard.gate import cached_session, gate, rejection_reason, stock_forcing
    from specpilot.guard.records import records_from_outputs

    config = config or GuardConfig()
    device = request.candidate.device
    session = cached_session(request.deployment, device)
    if session.deployment.regime.sampled:
        return sampled_gate(request, session, chunk=config.chunk)
    prompts = tuple(tuple(p) for p in request.prompts)
    stock = stock_forcing(request.deployment, device, prompts, request.max_new_tokens, config.chunk)
    candidate = records_from_outputs([list(p) for p in prompts], [list(o) for o in request.candidate_outputs])
    verdict = gate(session, candidate, stock, config)
    return GateResult(verdict.passed, {"guard": "token-forcing", "baseline": "stock-ar", **verdict.to_dict()},
                      rejection_reason(verdict))


def sampled_gate(request: GateRequest, session, config=None, chunk: int = 512) -> GateResult:
    """The sampling guard as a gate, for a deployment whose regime samples: the candidate's sampled
    outputs and *stock AR*'s, sampled for the same prompts with the same seeds (`request.seeds`;
    without them, the seeds the runner gives unseeded prompts, `engine.runner.prompt_seeds`), each
    teacher-forced through the stock target, the emitted tokens' randomized PIT values tested for
    uniformity (`guard.sampled_forcing.sampling_gate`, `guard.sampling.compare_sampled`)."""
    from specpilot.engine.runner import prompt_seeds, sampling_params
    from specpilot.guard.gate import stock_sampled
    from specpilot.guard.records import records_from_outputs
    from specpilot.guard.sampled_forcing import sampling_gate
    from specpilot.guard.sampling import SamplingGuardConfig

    config = config or SamplingGuardConfig()
    sampling = session.deployment.regime.sampling
    prompts = tuple(tuple(p) for p in request.prompts)
    seeds = tuple(int(s) for s in request.seeds) or tuple(prompt_seeds([list(p) for p in prompts]))
    stock = stock_sampled(request.deployment, request.candidate.device, prompts, seeds, request.max_new_tokens)
    candidate = records_from_outputs([list(p) for p in prompts], [list(o) for o in request.candidate_outputs])
    verdict = sampling_gate(session.target, candidate, stock, sampling_params(sampling), config, chunk)
    return GateResult(verdict.passed, {"guard": "sampling", "baseline": "stock-ar", "sampling": sampling.to_dict(),
                                       **verdict.to_dict()}, verdict.reason())
