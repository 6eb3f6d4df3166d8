"""Shared workers: knob-only comparisons in one persistent, trusted worker per device.

A comparison whose two arms run the controller's own code (no patch worktree, a runner factory
of the `specpilot` package) needs no process isolation: both arms are systems of one deployment,
and one process can hold them all over one copy of the weights (`SessionRunner`, the runner an
isolated worker uses for its one system; the arms' own factory builds it here too).
A shared worker is started and built once per (deployment, device, factory) and stays up across
comparisons and rounds until its backend closes; its clocks are settled once, before its first
timed request (`settle`). Code-patch candidates never come here: they keep fresh isolated workers
(`pair.py`), timed from the controller's side.

Timing: the arms' requests alternate in the block's order (ABBA), one at a time, each running a
fixed number of new tokens with EOS ignored, so both arms do the same work. Nothing runs between
two timed requests: no garbage collection (Python's collector is off inside a request, and what
was alive after warm-up is frozen out of it), since any host work there leaves the GPU idle and
its clock dips, which the next request pays for (`scripts/timing_probe.py` measures it). A request's time is
its decode time after prefill, by CUDA events in the worker (the wall clock on CPU); under continuous
batching the whole serving run, and its saturated stretches, which the block statistic compares
when both arms have them (`blocks.BlockResult.log_ratio`). The worker's
wall clock cross-checks it: a request whose two clocks disagree by more than `CLOCK_TOLERANCE` is
run again (at most `MAX_RERUNS` times), since then the two clocks did not see the same work.

Failure: a shared worker that dies during a comparison (its process gone) charges the death to the
candidate, the only system the comparison brought into the process; the candidate is rejected,
the next comparison starts a new worker, and the dead one's output is kept for the user.

Owns: the pool of shared workers, settling, and `SharedPair` (the session interface the
controller drives). Does not own the worker process (`worker.py`) or the block statistic
(`blocks.py`).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from specpilot import env
from specpilot.control.arm import ArmSpec
from specpilot.control.blocks import Arm, BlockPlan, BlockResult, Outputs
from specpilot.control.config import ControllerConfig
from specpilot.control.outputs import OutputError, validate_outputs
from specpilot.control.pair import ArmFailure
from specpilot.control.worker import FailureKind, Worker, WorkerError

CLOCK_TOLERANCE = 0.01  # |GPU span - wall span| / wall span above which a timed request is run again
MAX_RERUNS = 3
RESETTLE_SECONDS = 5.0  # settling cap of every comparison after a worker's first


def shareable(incumbent: ArmSpec, candidate: ArmSpec) -> bool:
    """Both arms run the controller's own code (a runner of this package, no worktree), on one
    deployment: only then are the times a runner reports about itself trusted."""
    return (incumbent.workdir is None and candidate.workdir is None
            and incumbent.factory == candidate.factory and incumbent.factory.startswith("specpilot.")
            and incumbent.deployment == candidate.deployment)


@dataclass
class Settling:
    """How a shared worker's clocks were settled: per-token decode seconds of each warm-up request."""

    trace: list[float] = field(default_factory=list)
    settled: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"trace": self.trace, "settled": self.settled, "seconds": self.seconds}


def per_token(reply: dict) -> float:
    timing = reply["timing"]
    return timing["decode_s"] / max(1, timing["tokens"])


def _saturated_of(timing: dict) -> tuple[float, int]:
    """A request's saturated (seconds, tokens) under continuous batching; (0.0, 0) when it reports none."""
    t, n = timing.get("saturated_s"), timing.get("saturated_tokens")
    if isinstance(t, (int, float)) and isinstance(n, int) and t > 0 and n > 0:
        return float(t), n
    return 0.0, 0


def settle(run, tolerance: float, window: int, max_seconds: float) -> Settling:
    """Run `run()` (one request, returning its reply) until the last `window` per-token times lie
    within `tolerance` of their median, or `max_seconds` have passed: GPU clocks ramp up after idle,
    and a timed block must not start on the ramp."""
    out = Settling()
    start = time.monotonic()
    while True:
        out.trace.append(per_token(run()))
        last = out.trace[-window:]
        if len(last) == window and (max(last) - min(last)) <= tolerance * statistics.median(last):
            out.settled = True
            break
        if time.monotonic() - start >= max_seconds:
            break
    out.seconds = time.monotonic() - start
    return out


class SharedWorkers:
    """The pool: one built, settled worker per (deployment, device, factory), kept until `close`."""

    def __init__(self):
        self._workers: dict[tuple, Worker] = {}
        self.settling: dict[tuple, Settling] = {}
        self._lock = threading.Lock()
        self._log_dir = Path(tempfile.mkdtemp(prefix="shared-", dir=env.worker_logs()))
        self._keep_logs = False  # a worker died: its output stays in `_log_dir` for the user

    def worker(self, spec: ArmSpec, device: str, config: ControllerConfig) -> Worker:
        key = (spec.deployment, device, spec.factory)
        with self._lock:
            worker = self._workers.get(key)
            if worker is not None and worker.proc.poll() is None:
                return worker
            if worker is not None:  # died since: start afresh, keeping its log
                self._keep_logs = True
                worker.close()
            shared = ArmSpec(spec.deployment, {"name": "shared"}, device, None, spec.factory)
            worker = Worker.start(shared, f"shared{len(self._workers)}", self._log_dir)
            try:
                worker.info = worker.request({"op": "build", "spec": worker.spec.to_dict()}, config.startup_timeout_s)
            except BaseException:
                worker.close()
                raise
            self._workers[key] = worker
            return worker

    def close(self) -> None:
        with self._lock:
            for w in self._workers.values():
                self._keep_logs |= w.crashed
                w.close()
            self._workers.clear()
        if not self._keep_logs:
            shutil.rmtree(self._log_dir, ignore_errors=True)


class SharedPair:
    """Both arms of one comparison as systems of one shared worker (the session interface)."""

    def __init__(self, pool: SharedWorkers, incumbent: ArmSpec, candidate: ArmSpec, device: str,
                 config: ControllerConfig, warmup: Sequence[Sequence[Sequence[int]]] = ()):
        self.config = config
        self.systems = {Arm.INCUMBENT: dict(incumbent.system), Arm.CANDIDATE: dict(candidate.system)}
        self.specs = {Arm.INCUMBENT: incumbent, Arm.CANDIDATE: candidate}
        self.reruns = 0  # timed requests run again because their clocks disagreed
        try:
            self.worker = pool.worker(incumbent, device, config)
        except WorkerError as err:
            raise ArmFailure(Arm.INCUMBENT, err) from None
        key = (incumbent.deployment, device, incumbent.factory)
        for request in warmup:
            for arm in (Arm.INCUMBENT, Arm.CANDIDATE):
                self._request(arm, {"op": "warm", "system": self.systems[arm], "prompts": [list(p) for p in request],
                                    "max_new_tokens": config.max_new_tokens}, config.startup_timeout_s)
        self.settling = None
        if warmup:  # the GPU idled while the comparison was set up: settle again before timing
            prompts = [list(p) for p in warmup[0]]
            limit = config.settle_seconds if key not in pool.settling else min(config.settle_seconds, RESETTLE_SECONDS)
            self.settling = settle(lambda: self._run(Arm.INCUMBENT, prompts, config.max_new_tokens, False),
                                   config.settle_tolerance, 3, limit)
            pool.settling.setdefault(key, self.settling)

    def generate(self, arm: Arm, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 seeds: Sequence[int] | None = None) -> Outputs:
        """Untimed generation, stopping at EOS as a deployment does (the gate's cheap subset); `seeds`:
        one per prompt under a sampled regime."""
        reply = self._run(arm, [list(p) for p in prompts], max_new_tokens, True, seeds)
        return self._outputs(arm, reply, len(prompts), max_new_tokens)

    def run_block(self, plan: BlockPlan) -> BlockResult:
        if len(plan.phases) != 1 or plan.phases[0].concurrent:
            raise ValueError("a shared worker times arms in turn on one device")
        seconds = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        walls = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        outputs = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        saturated = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        for request, first, seeds in zip(plan.requests, plan.first, plan.request_seeds):
            for arm in (first, first.other):
                reply = self._timed(arm, request, plan.max_new_tokens, **({} if seeds is None else {"seeds": seeds}))
                timing = reply["timing"]
                seconds[arm].append(timing["decode_s"])
                walls[arm].append(timing["wall_s"] - timing["wall_prefill_s"])
                outputs[arm].extend(self._outputs(arm, reply, len(request), plan.max_new_tokens))
                saturated[arm].append(_saturated_of(timing))
        sat = {arm: ((tuple(rows),) if any(n for _, n in rows) else ()) for arm, rows in saturated.items()}
        return BlockResult(plan.index, (tuple(seconds[Arm.INCUMBENT]),), (tuple(seconds[Arm.CANDIDATE]),),
                           (tuple(outputs[Arm.INCUMBENT]),), (tuple(outputs[Arm.CANDIDATE]),),
                           (tuple(walls[Arm.INCUMBENT]),), (tuple(walls[Arm.CANDIDATE]),),
                           incumbent_saturated=sat[Arm.INCUMBENT], candidate_saturated=sat[Arm.CANDIDATE])

    def close(self) -> None:
        """Nothing to stop: the worker stays up for the next comparison."""

    # ---- requests ----------------------------------------------------------------------------
    def _timed(self, arm: Arm, request, max_new_tokens: int, seeds=None) -> dict:
        """One timed request whose two clocks agree (run again when they do not)."""
        for attempt in range(MAX_RERUNS + 1):
            reply = self._run(arm, request, max_new_tokens, False, seeds)
            timing = reply["timing"]
            if timing.get("gpu_s") is None:
                return reply
            wall = timing["wall_s"]
            if wall > 0 and abs(timing["gpu_s"] - wall) <= CLOCK_TOLERANCE * wall:
                return reply
            self.reruns += 1
        raise ArmFailure(arm, WorkerError(f"GPU and wall clocks disagreed on {MAX_RERUNS + 1} runs of one request "
                                          f"(GPU {timing['gpu_s']:.4f} s, wall {wall:.4f} s)", FailureKind.PROTOCOL))

    def _run(self, arm: Arm, prompts, max_new_tokens: int, stop_at_eos: bool, seeds=None) -> dict:
        msg = {"op": "run", "system": self.systems[arm], "prompts": [list(p) for p in prompts],
               "max_new_tokens": max_new_tokens, "stop_at_eos": stop_at_eos, "gc_off": self.config.collect_garbage}
        if seeds is not None:  # a sampled regime: the request pair's seeds (greedy requests carry none)
            msg["seeds"] = [int(s) for s in seeds]
        reply = self._request(arm, msg, self.config.request_timeout_s)
        timing = reply.get("timing")
        if not isinstance(timing, dict) or not isinstance(timing.get("decode_s"), (int, float)):
            raise ArmFailure(arm, WorkerError("shared worker sent no timing", FailureKind.PROTOCOL))
        return reply

    def _request(self, arm: Arm, msg: dict, timeout: float) -> dict:
        try:
            return self.worker.request(msg, timeout)
        except WorkerError as err:
            if err.kind is FailureKind.CRASHED and self.systems[Arm.CANDIDATE] != self.systems[Arm.INCUMBENT]:
                raise ArmFailure(Arm.CANDIDATE, WorkerError(
                    f"{err} [one process serves both arms: its death is charged to the candidate "
                    f"{self.specs[Arm.CANDIDATE].name!r}, which is rejected; the next comparison starts a new "
                    "worker]", err.kind)) from None
            raise ArmFailure(arm, err) from None

    def _outputs(self, arm: Arm, reply: dict, prompts: int, max_new_tokens: int) -> Outputs:
        try:
            return validate_outputs(reply.get("outputs"), prompts, max_new_tokens)
        except OutputError as err:
            raise ArmFailure(arm, WorkerError(f"shared worker returned bad outputs for {self.specs[arm].name}: {err}",
                                              FailureKind.PROTOCOL)) from None
