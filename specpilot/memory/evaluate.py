"""The library call: evaluate a candidate system against an incumbent and record it in the memory.

    recorded = evaluate_candidate("deployments/x.toml", "stock", "candidate.toml")
    recorded.evaluation.verdict, recorded.entry_id

Fingerprints the deployment, takes the timing lock of its devices and memory (`TimingLock`:
waits for another timing run, or with `wait_s=0` times anyway and marks what it times as
contended), takes the stored stock-vs-stock noise floor for this deployment and timing procedure
from the memory when one was measured under a comparable load (`reusable_noise`; else, or when
asked to, it measures and stores one now), runs the controller and stores the evaluation with its
numbers and the load it was timed under. `record_round` stores a whole round's evaluations.

Owns: wiring deployment, systems, backend, gate, prompts, controller and memory together. Does not
own any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specpilot.config import System, load_deployment, load_system
from specpilot.control.backends.base import Backend
from specpilot.control.backends.local import LocalBackend
from specpilot.control.config import ControllerConfig
from specpilot.control.controller import Controller, Evaluation, RoundResult
from specpilot.control.defaults import default_config, runner_spec, source_commit
from specpilot.control.gate import DEFAULT_GATE, Gate, load_gate
from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE, PromptSource, load_prompt_source
from specpilot.control.arm import DEFAULT_RUNNER, ArmSpec
from specpilot.control.load import SHARE_BAND, Load, LoadProbe, not_comparable
from specpilot.control.stats import NoiseFloor
from specpilot.control.timing_lock import DEFAULT_WAIT_S, TimingLock
from specpilot.memory.fingerprint import DeploymentFingerprint, fingerprint_deployment
from specpilot.memory.records import StoredNoise
from specpilot.memory.store import Memory


@dataclass(frozen=True)
class Recorded:
    evaluation: Evaluation
    entry_id: int | None  # None when not recorded
    noise_id: int | None
    fingerprint: DeploymentFingerprint
    noise_measured: bool  # the noise floor was measured in this call (not taken from the memory)
    noise_note: str = ""  # why the noise floor was reused or measured
    load: Load | None = None  # the load the evaluation was timed under (contended: see TimingLock)

    @property
    def contended(self) -> bool:
        return self.load is not None and self.load.contended


def reusable_noise(memory: Memory, fp: DeploymentFingerprint, procedure: str, now: Load,
                   band: float = SHARE_BAND) -> tuple[StoredNoise | None, str]:
    """The newest stored noise floor measured under a load comparable to `now` (none when `now` is
    contended), and a line saying why it is used or why none is."""
    stored = memory.noise_floors(fp.digest, procedure)
    if not stored:
        return None, "measured now; none stored for this deployment and timing procedure"
    for s in stored:
        if not_comparable(s.load, now, band) is None:
            return s, f"from the memory (noise floor {s.id}, {s.load.describe()}; now {now.describe()})"
    why = not_comparable(stored[0].load, now, band)
    return None, f"measured now; the latest stored one (noise floor {stored[0].id}) is not reused: {why}"


def noise_floor(controller: Controller, memory: Memory, fp: DeploymentFingerprint, stock: ArmSpec,
                remeasure: bool = False, lock: TimingLock | None = None) -> tuple[int, NoiseFloor, bool, str]:
    """(id, noise floor, measured now, why) for this deployment and procedure: the memory's when one
    was measured under a load comparable to the current one (read through `lock`), else measured
    now and stored with its load. Without a lock, the latest stored one is taken as it is."""
    note = "measured now; asked to measure it again"
    if not remeasure and lock is None:
        latest = memory.noise_floor(fp.digest, controller.procedure)
        if latest is not None:
            return latest[0], latest[1], False, "from the memory (the latest; load not checked)"
        note = "measured now; none stored for this deployment and timing procedure"
    elif not remeasure:
        stored, note = reusable_noise(memory, fp, controller.procedure, lock.current())
        if stored is not None:
            return stored.id, stored.noise, False, note
    if lock is None:
        noise = controller.measure_noise(stock)
        return memory.record_noise(fp, noise), noise, True, note
    with lock.window() as w:
        noise = controller.measure_noise(stock)
    return memory.record_noise(fp, noise, w.load), noise, True, f"{note} ({w.load.describe()})"


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
    wait_s: float = DEFAULT_WAIT_S,
    say: Callable[[str], None] | None = None,
    probe: LoadProbe | None = None,
) -> Recorded:
    """Evaluate `candidate` against `incumbent` on `deployment` (files, shipped names, 'stock' / 'ar').
    Times under the timing lock of the backend's devices and the memory, waiting up to `wait_s` for
    another timing run (0: not at all); `say` gets the waiting and noise-floor lines (default
    stderr), `probe` reads the machine's load (default `/proc`)."""
    dep = load_deployment(deployment)
    inc = incumbent if isinstance(incumbent, System) else load_system(incumbent, dep)
    cand = candidate if isinstance(candidate, System) else load_system(candidate, dep)
    config = config or default_config(dep)
    own_backend = backend is None
    backend = backend or LocalBackend(placement=config.placement)
    gate = load_gate(gate) if isinstance(gate, str) else gate
    source = load_prompt_source(dep, prompt_source) if isinstance(prompt_source, str) else prompt_source
    own_memory = not isinstance(memory, Memory)
    mem = Memory(memory) if own_memory else memory
    try:
        fp = fingerprint_deployment(dep, backend.device_name(), cache=mem)
        controller = Controller(config, backend, gate, source, deployment)
        stock = runner_spec(deployment, dep.stock, runner)
        with TimingLock(getattr(backend, "devices", None) or ("cpu",), mem.path, wait_s=wait_s, say=say,
                        probe=probe) as lock:
            noise_id, noise, measured, note = noise_floor(controller, mem, fp, stock, remeasure_noise, lock)
            lock.say(f"noise floor {noise.value:.2%}: {note}")
            with lock.window() as w:
                evaluation = controller.evaluate(runner_spec(deployment, inc, runner),
                                                 runner_spec(deployment, cand, runner, candidate_workdir), noise)
        entry = None
        if record:
            entry = mem.record_evaluation(fp, evaluation, config, round=round, patch=patch, noise_id=noise_id,
                                          commit=source_commit(), load=w.load)
        return Recorded(evaluation, entry, noise_id, fp, measured, note, w.load)
    finally:
        if own_backend:
            backend.close()  # its shared workers
        if own_memory:
            mem.close()


def record_round(memory: Memory, fp: DeploymentFingerprint, result: RoundResult, config: ControllerConfig,
                 round: str, patches: Sequence[str | None] | None = None, noise_id: int | None = None,
                 load: Load | None = None) -> list[int]:
    """Store every final evaluation of a round (the winner's re-measured one); returns their ids."""
    patches = patches or [None] * len(result.evaluations)
    commit = source_commit()
    return [memory.record_evaluation(fp, e, config, round=round, patch=p, noise_id=noise_id, commit=commit, load=load)
            for e, p in zip(result.evaluations, patches, strict=True)]
