"""Synthetic fingerprints and evaluations for the memory's tests (no processes, no models).

Imported by the tests and by the subprocesses they start (via sys.path), so it is plain code.
"""

from __future__ import annotations

from specpilot.control.config import ControllerConfig, Placement, Stage
from specpilot.control.controller import Costs, Evaluation
from specpilot.control.gate import GateResult
from specpilot.control.outputs import OutputComparison
from specpilot.control.rule import Decision, Reason, Outcome
from specpilot.control.arm import ArmSpec
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.memory.fingerprint import DeploymentFingerprint

CONFIG = ControllerConfig(resamples=500)
TARGET = (("config.json", "c" * 64), ("model.safetensors", "a" * 64))


def fingerprint(name="fx", gpu="NVIDIA H200", target=TARGET, batch=1, torch="2.13") -> DeploymentFingerprint:
    return DeploymentFingerprint(name, target, (), "ngram", (1, 1), gpu, {"batch": batch}, 256, ("gsm8k",),
                                 {"specpilot": "0.1.0", "torch": torch, "cuda": "12.8", "python": "3.11"})


def noise_floor(offset=0.0) -> NoiseFloor:
    e = GainEstimate(tuple(offset + x for x in (0.001, -0.002, 0.0015, -0.0005, 0.0, 0.0008)), resamples=500)
    return NoiseFloor(e, CONFIG.procedure_key(Placement.ALTERNATE))


def spec(name: str, **knobs) -> ArmSpec:
    return ArmSpec("fx", {"name": name, "depth": 5, **knobs})


def evaluation(candidate: ArmSpec, incumbent: ArmSpec | None = None, gain: float = 0.05,
               verdict: Outcome = Outcome.PROMOTE, passed: bool = True) -> Evaluation:
    incumbent = incumbent or spec("stock")
    if not passed:  # untimed, and cheap: no bootstrap (and no SciPy import) in the processes that use it
        return Evaluation(incumbent, candidate, Stage.SINGLE, Placement.ALTERNATE,
                          Decision(Outcome.REJECT, (Reason.GUARD_FAILED,), 0.015), None,
                          GateResult(False, {"mismatch_rate": 0.02}, "mismatches"), None, None, Costs(total=1.0))
    import math

    noise = noise_floor()
    x = tuple(math.log1p(gain) + d for d in (0.001, -0.001, 0.002, -0.002, 0.0, 0.0005))
    est = GainEstimate(x, resamples=500)
    reason = {Outcome.PROMOTE: Reason.CLEARS_THRESHOLD, Outcome.REJECT: Reason.BELOW_THRESHOLD,
              Outcome.NEED_MORE_DATA: Reason.UNDECIDED}[verdict]
    decision = Decision(verdict, (reason,), 0.015, est.lower_bound(0.008), 0.008, 1, 3, 0.001)
    outputs = OutputComparison(24, 24, 240, 240, ())
    return Evaluation(incumbent, candidate, Stage.SINGLE, Placement.ALTERNATE, decision, noise,
                      GateResult(True, {"mismatch_rate": 0.007}), est, outputs, Costs(total=3.0, blocks=est.n))
