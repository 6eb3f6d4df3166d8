"""Synthetic measurements, memories and agent contexts for the loop's tests (no models, no processes)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from specpilot.config import Deployment, System
from specpilot.control.config import ControllerConfig, Placement, Stage
from specpilot.control.controller import Costs, Evaluation
from specpilot.control.gate import GateResult
from specpilot.control.rule import Decision, Reason, Outcome
from specpilot.control.arm import ArmSpec
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.engine.profile import StepProfile
from specpilot.loop.acceptance import TreeShape
from specpilot.loop.agents.base import LoopSetup, ProposerContext
from specpilot.loop.cost_model import analyze
from specpilot.loop.recall import Recall
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.fingerprint import DeploymentFingerprint

CONFIG = ControllerConfig(resamples=500)
DEPLOYMENT = Deployment(name="fx", target="fixture", drafter="fixture")
STOCK = DEPLOYMENT.stock  # depth 5, topk 4, tree_budget 7


def gpu_profile(**changes) -> StepProfile:
    """A memory-bound target (3.3B, 6.7 GB) with a small drafter, stock's tree, on a 4 TB/s device."""
    p = StepProfile(
        device="cuda:0", batch=1, tokens_per_round=2.6, round_ms=10.0, draft_ms=3.0, verify_ms=5.0,
        verify_curve_ms={1: 4.6, 2: 4.6, 4: 4.7, 8: 5.0, 16: 5.3, 24: 5.6, 32: 6.0, 48: 6.8, 64: 7.6},
        accept_at_depth=(0.75, 0.45, 0.25, 0.12, 0.04), tree_nodes=8, target_bytes=6_700_000_000,
        drafter_bytes=100_000_000, kv_bytes_per_token=106_496, bandwidth_gbps=4000.0, matmul_tflops=500.0,
        target_params=3_300_000_000, drafter_params=50_000_000, draft_forwards=5, context=600.0)
    return replace(p, **changes)


# EAGLE-3 switched in at stock's shape, measured in full (`loop.measure.switch_measurements`): slower
# per token than `cost_table()` there (3.90 vs 3.85 ms), each level dearer, acceptance higher
SLOW_SWITCH = {"ms_per_token": 15.0 / 3.85, "round_ms": 15.0, "tokens_per_round": 3.85,
               "accept_at_depth": [0.95, 0.8, 0.55, 0.35, 0.2]}


def cost_table(system: System = STOCK, **changes):
    return analyze(gpu_profile(**changes), TreeShape.of(system) if system.speculative else None, system.name, 4096)


def fingerprint(name: str = "fx", gpu: str = "NVIDIA H200", batch: int = 1) -> DeploymentFingerprint:
    target = (("config.json", "c" * 64), ("model.safetensors", "a" * 64))
    versions = {"specpilot": "0.1.0", "torch": "2.13", "cuda": "12.8", "python": "3.11"}
    return DeploymentFingerprint(name, target, (("config.json", "d" * 64),), "model", (16, 4), gpu, {"batch": batch},
                                 2048, ("gsm8k",), versions)


def spec(system: System) -> ArmSpec:
    return ArmSpec("fx", {"name": system.name, **system.knobs()})


def evaluation(candidate: System, incumbent: System = STOCK, gain: float | None = 0.05,
               verdict: Outcome = Outcome.PROMOTE, reasons: tuple[Reason, ...] | None = None) -> Evaluation:
    """A stored-looking evaluation: timed with `gain` (None: rejected by the guard, untimed)."""
    if gain is None:
        return Evaluation(spec(incumbent), spec(candidate), Stage.SINGLE, Placement.ALTERNATE,
                          Decision(Outcome.REJECT, (Reason.GUARD_FAILED,), 0.02), None,
                          GateResult(False, {}, "token forcing: mismatches"), None, None, Costs(total=1.0))
    x = tuple(math.log1p(gain) + d for d in (0.001, -0.001, 0.002, -0.002, 0.0, 0.0005))
    est = GainEstimate(x, resamples=500)
    noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, 0.0, -0.0005), resamples=500), "p")
    default = {Outcome.PROMOTE: (Reason.CLEARS_THRESHOLD,), Outcome.REJECT: (Reason.BELOW_THRESHOLD,),
               Outcome.NEED_MORE_DATA: (Reason.UNDECIDED,)}[verdict]
    decision = Decision(verdict, reasons or default, 0.02, est.lower_bound(0.025), 0.025, 1, 1, 0.01)
    return Evaluation(spec(incumbent), spec(candidate), Stage.SINGLE, Placement.ALTERNATE, decision, noise,
                      GateResult(True, {}), est, None, Costs(total=3.0, blocks=est.n))


def context(cost=None, incumbent: Incumbent | None = None, recall: Recall | None = None, device: str = "cuda",
            history=(), limit: int = 3, checkout=None, scratch: Path = Path("/tmp"), models=None,
            deployment: Deployment = DEPLOYMENT, log=None) -> ProposerContext:
    incumbent = incumbent or Incumbent(Candidate(STOCK))
    cost = cost or cost_table(incumbent.candidate.system)
    recall = recall or Recall("fx", (), ())
    setup = LoopSetup(deployment, device, "NVIDIA H200" if device == "cuda" else "cpu-x86_64", checkout, scratch)
    return ProposerContext(setup, 1, "test/r1", incumbent, Candidate(deployment.stock), cost, recall, limit, models,
                           tuple(history), log or (lambda line: None))


def git_repo(root: Path) -> Path:
    """A small git repository with one commit, a tracked change, an untracked and an ignored file."""
    import subprocess

    root.mkdir(parents=True, exist_ok=True)

    def git(*args):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (root / "pkg").mkdir()
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / ".gitignore").write_text("*.log\n")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    (root / "pkg" / "a.py").write_text("A = 2  # uncommitted\n")
    (root / "pkg" / "new.py").write_text("NEW = True\n")
    (root / "debug.log").write_text("ignored\n")
    return root


def run_context(**given):
    """A `RunContext` with only `given` set and None elsewhere: for tests of one step of a run (no
    models, no workers)."""
    from dataclasses import fields

    from specpilot.loop.context import RunContext

    names = [f.name for f in fields(RunContext)]
    assert set(given) <= set(names), f"not RunContext fields: {set(given) - set(names)}"
    return RunContext(**{name: given.get(name) for name in names})
