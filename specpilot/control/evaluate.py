"""The library call: evaluate a candidate system against an incumbent and record it in the memory.

    recorded = evaluate_candidate("deployments/x.toml", "stock", "candidate.toml")
    recorded.evaluation.verdict, recorded.entry_id

Fingerprints the deployment, takes the stored stock-vs-stock noise floor for this deployment and
timing procedure from the memory (measuring and storing it first when there is none, or when
asked to), runs the controller and stores the evaluation with its numbers. `record_round` stores
a whole round's evaluations the same way.

Owns: wiring deployment, systems, backend, gate, prompts, controller and memory together. Does not
own any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specpilot.config import Deployment, System, load_deployment, load_system
from specpilot.control.backends.base import Backend
from specpilot.control.backends.local import LocalBackend
from specpilot.control.config import ControllerConfig
from specpilot.control.controller import Controller, Evaluation, RoundResult
from specpilot.control.gate import DEFAULT_GATE, Gate, load_gate
from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE, PromptSource, load_prompt_source
from specpilot.control.spec import DEFAULT_RUNNER, RunnerSpec
from specpilot.control.stats import NoiseFloor
from specpilot.memory.fingerprint import DeploymentFingerprint, fingerprint_deployment
from specpilot.memory.store import Memory


@dataclass(frozen=True)
class Recorded:
    evaluation: Evaluation
    entry_id: int | None  # None when not recorded
    noise_id: int | None
    fingerprint: DeploymentFingerprint
    noise_measured: bool  # the noise floor was measured in this call (not taken from the memory)


def source_commit() -> str:
    """git commit of the running code ('+dirty' when tracked files differ from it), or ''."""
    from specpilot.bench.provenance import git_state  # the project's one reader of git state

    state = git_state()
    return (state["git_commit"] or "") + ("+dirty" if state["git_dirty"] else "")


def runner_spec(deployment: str, system: System, runner: str = DEFAULT_RUNNER,
                workdir: str | None = None) -> RunnerSpec:
    return RunnerSpec(deployment, {"name": system.name, **system.knobs()}, workdir=workdir, factory=runner)


def default_config(deployment: Deployment, **changes) -> ControllerConfig:
    """The defaults with the deployment's regime batch and token budget, then `changes` (field -> value)."""
    base = {"request_size": deployment.regime.batch, "max_new_tokens": deployment.max_new_tokens}
    base.update(changes)
    return ControllerConfig.from_dict(base)


def noise_floor(controller: Controller, memory: Memory, fp: DeploymentFingerprint, stock: RunnerSpec,
                remeasure: bool = False) -> tuple[int, NoiseFloor, bool]:
    """(id, noise floor, measured now) for this deployment and procedure; measured and stored if missing."""
    stored = None if remeasure else memory.noise_floor(fp.digest, controller.procedure)
    if stored is not None:
        return stored[0], stored[1], False
    noise = controller.measure_noise(stock)
    return memory.record_noise(fp, noise), noise, True


def evaluate_candidate(
    deployment: str,
    incumbent: str | System,
    candidate: str | System,
    *,
    config: ControllerConfig | None = None,
    backend: Backend | None = None,
    gate: Gate | str = DEFAULT_GATE,
    prompt_source: PromptSource | str = DEFAULT_PROMPT_SOURCE,
    memory: Memory | str | Path | None = None,
    runner: str = DEFAULT_RUNNER,
    candidate_workdir: str | None = None,
    patch: str | None = None,
    round: str = "",
    remeasure_noise: bool = False,
    record: bool = True,
) -> Recorded:
    """Evaluate `candidate` against `incumbent` on `deployment` (files, shipped names, 'stock' / 'ar')."""
    dep = load_deployment(deployment)
    inc = incumbent if isinstance(incumbent, System) else load_system(incumbent, dep)
    cand = candidate if isinstance(candidate, System) else load_system(candidate, dep)
    config = config or default_config(dep)
    backend = backend or LocalBackend(placement=config.placement)
    gate = load_gate(gate) if isinstance(gate, str) else gate
    source = load_prompt_source(dep, prompt_source) if isinstance(prompt_source, str) else prompt_source
    own_memory = not isinstance(memory, Memory)
    mem = Memory(memory) if own_memory else memory
    try:
        fp = fingerprint_deployment(dep, backend.device_name(), cache=mem)
        controller = Controller(config, backend, gate, source, deployment)
        stock = runner_spec(deployment, dep.stock, runner)
        noise_id, noise, measured = noise_floor(controller, mem, fp, stock, remeasure_noise)
        evaluation = controller.evaluate(runner_spec(deployment, inc, runner),
                                         runner_spec(deployment, cand, runner, candidate_workdir), noise)
        entry = None
        if record:
            entry = mem.record_evaluation(fp, evaluation, config, round=round, patch=patch, noise_id=noise_id,
                                          commit=source_commit())
        return Recorded(evaluation, entry, noise_id, fp, measured)
    finally:
        if own_memory:
            mem.close()


def record_round(memory: Memory, fp: DeploymentFingerprint, result: RoundResult, config: ControllerConfig,
                 round: str, patches: Sequence[str | None] | None = None, noise_id: int | None = None) -> list[int]:
    """Store every final evaluation of a round (the winner's re-measured one); returns their ids."""
    patches = patches or [None] * len(result.evaluations)
    commit = source_commit()
    return [memory.record_evaluation(fp, e, config, round=round, patch=p, noise_id=noise_id, commit=commit)
            for e, p in zip(result.evaluations, patches, strict=True)]
