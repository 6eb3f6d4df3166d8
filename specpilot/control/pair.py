"""`WorkerPair`: the two arms of one comparison as worker processes on this machine.

One device (alternate): two workers, incumbent and candidate, on that device. Two devices (side
by side): four workers — each arm on each device, all loaded once — so swapping devices between
phases is a matter of routing requests, not of reloading models (each device holds both arms,
as in alternate mode).

Timing: for every request the session freezes every worker not serving it (`freeze_idle`), takes
`time.perf_counter_ns()` in this process right before the request is written to the worker's
socket and again when the reply becomes readable, then reads, decodes and checks the reply
outside the timed span. Concurrent requests (side by side) are sent back to back and their
arrivals taken from one `multiprocessing.connection.wait` loop. With `collect_garbage`, each worker
about to be timed first runs Python's cyclic garbage collector on request (untimed) and keeps it
off for the timed run call, so a collection pause never lands inside one arm's request at
random (as `timeit` and pyperf do); objects that were alive after warm-up are frozen out of
every collection. With `pin_cpus`, every worker runs on its own equal set of cores
(`specpilot.control.cpus`).

Containment: freezing a worker stops every process of its tree (`worker.py`); every block carries
the process census of its span (`census.py`: CPU time, and the GPU's compute-process list, of
every process outside the controller's tree), and closing the pair kills, after the workers'
trees, every live process that is ours by evidence.

The Ray backend runs this same class inside a GPU-pinned actor, so the timer is never in a
worker's process on either backend.

Owns: starting, building and warming the workers, running a `BlockPlan`, untimed generation for
the gate, and blaming failures on the right arm (`ArmFailure`). Does not own the schedule
(`blocks.py`) or any decision.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Sequence

from specpilot import env
from specpilot.control.backends.base import devices_per_session
from specpilot.control.blocks import Arm, BlockPlan, BlockResult, Outputs
from specpilot.control.census import BlockCensus, Census
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.cpus import plan_cpus
from specpilot.control.outputs import OutputError, validate_outputs
from specpilot.control.arm import ArmSpec
from specpilot.control.worker import FailureKind, Worker, WorkerError
from specpilot.errors import SpecPilotError


class ArmFailure(SpecPilotError):
    """A worker of `arm` failed; the controller rejects a failing candidate and stops on a failing incumbent."""

    def __init__(self, arm: Arm, error: WorkerError):
        super().__init__(str(error))
        self.arm = arm
        self.kind = error.kind


class WorkerPair:
    """Workers for (incumbent, candidate) on `devices` (one for alternate, two for side by side)."""

    def __init__(self, incumbent: ArmSpec, candidate: ArmSpec, devices: Sequence[str],
                 config: ControllerConfig, placement: Placement, warmup: Sequence[Sequence[Sequence[int]]] = ()):
        need = devices_per_session(placement)
        if placement is Placement.AUTO or len(devices) != need:
            raise ValueError(f"{placement.value} placement needs {need} device(s), got {list(devices)}")
        self.config = config
        self.placement = placement
        self.devices = tuple(devices)
        self.log_dir = Path(tempfile.mkdtemp(prefix="pair-", dir=env.worker_logs()))
        self.workers: dict[tuple[Arm, int], Worker] = {}
        # before any worker starts: what runs already is background, never the candidate's
        self.census = Census(gpu=any(str(d).startswith("cuda") for d in self.devices))
        cpus = plan_cpus(2 * len(self.devices)) if config.pin_cpus else None
        try:
            for arm, spec in ((Arm.INCUMBENT, incumbent), (Arm.CANDIDATE, candidate)):
                for d, device in enumerate(self.devices):
                    label = f"{arm.value}{d}"
                    mine = cpus.pop(0) if cpus else None
                    self.workers[arm, d] = Worker.start(spec.placed(device), label, self.log_dir, mine)
                    self.census.add_markers([self.workers[arm, d].marker])
            replies = self._all(lambda w: {"op": "build", "spec": w.spec.to_dict()}, config.startup_timeout_s)
            for w, reply in replies.items():
                w.info = reply
            for request in warmup:
                self._all(lambda w: {"op": "warm", "system": w.spec.system, "prompts": [list(p) for p in request],
                                     "max_new_tokens": config.max_new_tokens}, config.startup_timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- the session interface -----------------------------------------------------------
    def generate(self, arm: Arm, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 seeds: Sequence[int] | None = None) -> Outputs:
        """Untimed generation on the arm's first worker (the gate's cheap subset); `seeds`: one per
        prompt under a sampled regime."""
        worker = self.workers[arm, 0]
        self._activate([worker])
        try:
            reply = worker.request(_run(worker, prompts, max_new_tokens, False, seeds), self.config.request_timeout_s)
        except WorkerError as err:
            raise ArmFailure(arm, err) from None
        return self._outputs(arm, worker, reply, len(prompts), max_new_tokens)

    def run_block(self, plan: BlockPlan) -> BlockResult:
        before = self.census.begin()
        seconds = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        outputs = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        reported = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        for phase in plan.phases:
            times = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
            reports = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
            outs = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
            for request, first, seeds in zip(plan.requests, plan.first, plan.request_seeds):
                order = (first, first.other)
                workers = {arm: self.workers[arm, phase.device(arm)] for arm in order}
                msgs = {arm: json.dumps(_run(workers[arm], request, plan.max_new_tokens,
                                             self.config.collect_garbage, seeds)).encode() for arm in order}
                if phase.concurrent:
                    self._collect(order, workers)
                    got = self._timed_together(order, workers, msgs)
                else:
                    got = {}
                    for arm in order:
                        self._collect((arm,), workers)
                        got[arm] = self._timed_alone(arm, workers[arm], msgs[arm])
                for arm, (t, reply) in got.items():
                    times[arm].append(t)
                    reports[arm].append(_reported_seconds(reply))
                    outs[arm].extend(self._outputs(arm, workers[arm], reply, len(request), plan.max_new_tokens))
            for arm in seconds:
                seconds[arm].append(tuple(times[arm]))
                reported[arm].append(tuple(reports[arm]))
                outputs[arm].append(tuple(outs[arm]))
        return BlockResult(plan.index, tuple(seconds[Arm.INCUMBENT]), tuple(seconds[Arm.CANDIDATE]),
                           tuple(outputs[Arm.INCUMBENT]), tuple(outputs[Arm.CANDIDATE]),
                           tuple(reported[Arm.INCUMBENT]), tuple(reported[Arm.CANDIDATE]),
                           census=self._census(before))

    def close(self) -> None:
        try:
            for w in self.workers.values():
                w.close()
        finally:
            self.census.sweep(self._tracked())
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- containment -------------------------------------------------------------------------
    def _census(self, before) -> BlockCensus:
        """The census of the span since `before` (untimed: after the block's last request)."""
        after = self.census.snapshot()
        for w in self.workers.values():
            w.track(after.table)
        return self.census.judge(before, after, self._tracked(), [w.proc.pid for w in self.workers.values()])

    def _tracked(self) -> dict[int, int]:
        tracked = {}
        for w in self.workers.values():
            tracked.update(w.tracked)
        return tracked

    # ---- timing ------------------------------------------------------------------------------
    def _activate(self, active: list[Worker]) -> None:
        """Thaw the workers about to be timed; freeze every other one (when configured)."""
        for w in active:
            w.thaw()
        if self.config.freeze_idle:
            for w in self.workers.values():
                if all(w is not a for a in active):
                    w.freeze()

    def _collect(self, arms: Sequence[Arm], workers: dict[Arm, Worker]) -> None:
        """Untimed: the workers about to be timed collect their garbage (when configured)."""
        if not self.config.collect_garbage:
            return
        self._activate([workers[arm] for arm in arms])
        self._all(lambda w: {"op": "collect"}, self.config.request_timeout_s,  # side by side: at once
                  [(arm, workers[arm]) for arm in arms])

    def _timed_alone(self, arm: Arm, worker: Worker, msg: bytes) -> tuple[float, dict]:
        self._activate([worker])
        try:
            t0 = time.perf_counter_ns()
            worker.send_bytes(msg)
            worker.wait_ready(self.config.request_timeout_s)
            t1 = time.perf_counter_ns()
            return (t1 - t0) / 1e9, worker.receive()
        except WorkerError as err:
            raise ArmFailure(arm, err) from None

    def _timed_together(self, order: tuple[Arm, Arm], workers: dict[Arm, Worker], msgs: dict[Arm, bytes]) -> dict:
        self._activate(list(workers.values()))
        t0, t1 = {}, {}
        for arm in order:
            try:
                t0[arm] = time.perf_counter_ns()
                workers[arm].send_bytes(msgs[arm])
            except WorkerError as err:
                raise ArmFailure(arm, err) from None
        pending = {workers[arm].conn: arm for arm in order}
        deadline = time.monotonic() + self.config.request_timeout_s
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            now = time.perf_counter_ns()
            if not ready:
                arm = next(iter(pending.values()))
                err = WorkerError(f"worker {workers[arm].label} ({workers[arm].spec.name}) no reply within "
                                  f"{self.config.request_timeout_s:.0f} s", FailureKind.TIMEOUT)
                raise ArmFailure(arm, err)
            for conn in ready:
                t1[pending.pop(conn)] = now
        out = {}
        for arm in order:
            try:
                out[arm] = ((t1[arm] - t0[arm]) / 1e9, workers[arm].receive())
            except WorkerError as err:
                raise ArmFailure(arm, err) from None
        return out

    def _outputs(self, arm: Arm, worker: Worker, reply: dict, prompts: int, max_new_tokens: int) -> Outputs:
        try:
            return validate_outputs(reply.get("outputs"), prompts, max_new_tokens)
        except OutputError as err:
            error = WorkerError(f"worker {worker.label} ({worker.spec.name}) returned bad outputs: {err}",
                                FailureKind.PROTOCOL)
            raise ArmFailure(arm, error) from None

    def _all(self, message, timeout: float, targets: Sequence[tuple[Arm, Worker]] | None = None) -> dict[Worker, dict]:
        """Send `message(worker)` to every worker of `targets` (default: all) at once, so they work in
        parallel, then collect the replies."""
        targets = [(arm, w) for (arm, _), w in self.workers.items()] if targets is None else targets
        for arm, w in targets:
            try:
                w.send(message(w))
            except WorkerError as err:
                raise ArmFailure(arm, err) from None
        replies = {}
        for arm, w in targets:
            try:
                w.wait_ready(timeout)
                replies[w] = w.receive()
            except WorkerError as err:
                raise ArmFailure(arm, err) from None
        return replies


def _run(worker: Worker, prompts, max_new_tokens: int, gc_off: bool, seeds=None) -> dict:
    """A `run` request for the worker's own system, stopping at EOS as a deployment does; with the
    prompts' sampling seeds where the regime samples (greedy requests carry none, as before)."""
    msg = {"op": "run", "system": worker.spec.system, "prompts": [list(p) for p in prompts],
           "max_new_tokens": max_new_tokens, "stop_at_eos": True, "gc_off": gc_off}
    if seeds is not None:
        msg["seeds"] = [int(s) for s in seeds]
    return msg


def _reported_seconds(reply: dict) -> float:
    """The worker's own account of its run call (diagnostics only); NaN if absent or not a number."""
    value = reply.get("seconds")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")
