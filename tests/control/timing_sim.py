"""A simulated pair of arms for testing the rule: request times with heavy tails, spikes and drift.

Request-level model, in log seconds, for the r-th request served (clock r):

    log T = drift * sin(2 pi r / period) + walk_r + noise * t3 / sqrt(3) + log(1 + spike) [w.p. spike_rate]
            - log(1 + gain)  [candidate only]

walk_r is a Gaussian random walk (slow drift that does not come back); t3 / sqrt(3) is a Student-t
with 3 degrees of freedom scaled to unit variance (heavy tails); spikes are rare outliers (another
process, a GC pause). Blocks are built with the controller's own schedule (`blocks.first_arms`)
and statistic (`BlockResult.log_ratio`), one device, arms alternating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specpilot.control.blocks import Arm, BlockResult, first_arms
from specpilot.control.config import ControllerConfig


@dataclass(frozen=True)
class TimingModel:
    gain: float = 0.0  # true speed-up of the candidate
    noise: float = 0.005  # per-request sd of log time
    spike_rate: float = 0.01
    spike: float = 0.2
    drift: float = 0.02
    period: float = 400.0  # requests per drift cycle
    walk: float = 0.0005  # random-walk step per request


class SimulatedPair:
    def __init__(self, model: TimingModel, config: ControllerConfig, rng: np.random.Generator, stream: str = "timing"):
        self.model, self.config, self.rng, self.stream = model, config, rng, stream
        self.clock = 0
        self.level = 0.0

    def request_seconds(self, arm: Arm) -> float:
        m, rng = self.model, self.rng
        self.clock += 1
        self.level += rng.normal(0.0, m.walk)
        log_t = m.drift * math.sin(2 * math.pi * self.clock / m.period) + self.level
        log_t += m.noise * rng.standard_t(3) / math.sqrt(3)
        if rng.random() < m.spike_rate:
            log_t += math.log1p(m.spike)
        if arm is Arm.CANDIDATE:
            log_t -= math.log1p(m.gain)
        return math.exp(log_t)

    def block(self, index: int) -> BlockResult:
        times = {Arm.INCUMBENT: [], Arm.CANDIDATE: []}
        for first in first_arms(self.config, index, self.stream):
            for arm in (first, first.other):
                times[arm].append(self.request_seconds(arm))
        return BlockResult(index, (tuple(times[Arm.INCUMBENT]),), (tuple(times[Arm.CANDIDATE]),), ((),), ((),))

    def measure(self, start: int, count: int) -> list[float]:
        return [self.block(b).log_ratio for b in range(start, start + count)]
