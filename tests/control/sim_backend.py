"""An in-process backend whose arms are simulated (timing_sim.py): tests the controller's logic fast.

A system's knobs drive it: `gain` (speed-up over a system with gain 0), `wrong` (generates wrong
tokens), `short` (generates one token per prompt). Every session and block is logged on the backend.
"""

from __future__ import annotations

import numpy as np

from fake_runners import expected_tokens
from specpilot.control.blocks import Arm, BlockResult
from specpilot.control.config import Placement
from timing_sim import SimulatedPair, TimingModel


class SimSession:
    def __init__(self, backend, incumbent, candidate, config):
        self.backend, self.config = backend, config
        self.knobs = {Arm.INCUMBENT: incumbent.system, Arm.CANDIDATE: candidate.system}
        gain = (1 + candidate.system.get("gain", 0.0)) / (1 + incumbent.system.get("gain", 0.0)) - 1
        model = TimingModel(gain=gain, noise=backend.noise, spike_rate=0.0, drift=0.005)
        backend.sessions += 1
        self.pair = SimulatedPair(model, config, np.random.default_rng(backend.seed + backend.sessions))

    def _outputs(self, arm, prompts, max_new_tokens):
        k = self.knobs[arm]
        out = [tuple(expected_tokens(list(p), max_new_tokens)) for p in prompts]
        if k.get("wrong"):
            out = [tuple((t + 1) % 997 for t in o) for o in out]
        if k.get("short"):
            out = [o[:1] for o in out]
        return tuple(out)

    def generate(self, arm, prompts, max_new_tokens):
        self.backend.log.append(("generate", arm, tuple(map(tuple, prompts))))
        return self._outputs(arm, prompts, max_new_tokens)

    def run_block(self, plan):
        self.backend.log.append(("block", plan.index, plan.prompts))
        times = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        for first in plan.first:
            for arm in (first, first.other):
                times[arm].append(self.pair.request_seconds(arm))
        outs = {arm: self._outputs(arm, plan.prompts, plan.max_new_tokens) for arm in times}
        return BlockResult(plan.index, (tuple(times[Arm.INCUMBENT]),), (tuple(times[Arm.CANDIDATE]),),
                           (outs[Arm.INCUMBENT],), (outs[Arm.CANDIDATE],))

    def close(self):
        self.backend.closed += 1


class SimBackend:
    name = "sim"
    placement = Placement.ALTERNATE
    parallelism = 2

    def __init__(self, seed: int = 0, noise: float = 0.005):
        self.seed, self.noise = seed, noise
        self.sessions = self.closed = 0
        self.log: list = []

    def open(self, incumbent, candidate, config, warmup=()):
        return SimSession(self, incumbent, candidate, config)

    def device_name(self) -> str:
        return "sim"

    def close(self) -> None:
        pass

    def blocks(self) -> list:
        return [e for e in self.log if e[0] == "block"]
