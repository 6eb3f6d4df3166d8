"""Paired blocks: what one block asks of the two arms, in which order, and the numbers it yields.

A block is `requests_per_block` requests of `request_size` prompts each, the same prompts for both
arms. Every request is timed separately by the controller; an arm's block time is the sum over its
requests, and the block's statistic is

    x = log((T_incumbent / n_incumbent) / (T_candidate / n_candidate))   one device (alternate)
    x = mean over the two placements of that                             two devices (side by side)

with n an arm's generated tokens in the block: time per token. Under continuous batching a shared
worker also reports each request's saturated stretches (while a prompt waited for a slot: every
slot taken, `ServingResult.saturated_*`); a request pair whose two arms both saturated is compared
on those seconds and tokens alone: the rate of a server at its concurrency, without the ramp-down
as the last requests finish alone, and less spread between blocks (`scripts/serving_timing_noise.py`
measures both).
Lossless arms generate the same tokens in exact arithmetic, but in bf16 a different tree shape or
kernel reduces in another order and a near-tie can flip, after which the outputs -- and their
lengths -- differ (on a GPU, a lossless tree candidate against stock). Per token, such a difference does not pass for a speed change. Blocks whose outputs
carry no tokens (simulations) use the times alone.

Under a sampled regime (`ControllerConfig.sampled`) a plan carries one seed per prompt
(`request_seeds`), which both arms' requests carry: a request pair samples with the same seeds.

* One device: arms alternate request by request, which arm goes first following `Order`: ABBA
  (A B | B A | A B ..., continued across blocks, so a linear drift within any two consecutive
  pairs cancels) or a seeded coin. The idle arm is frozen while the other is timed.
* Two devices: both arms serve each request at once, on different devices; each block is run
  twice with the devices swapped (and the swap order flips from block to block), so a faster
  device helps each arm equally inside every block and the device difference cancels in x
  instead of inflating its variance. The arm sent first alternates per request.

Owns: `Arm`, `Phase`, `BlockPlan`, `BlockResult` and the schedule (`plan_block`). Pure: no
processes. Does not own running a plan (`pair.py`) or the statistics (`stats.py`).
"""

from __future__ import annotations

import enum
import hashlib
import math
import statistics
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specpilot.control.config import ControllerConfig, Order, Placement

if TYPE_CHECKING:
    from specpilot.control.census import BlockCensus


class Arm(enum.Enum):
    INCUMBENT = "A"
    CANDIDATE = "B"

    @property
    def other(self) -> "Arm":
        return Arm.CANDIDATE if self is Arm.INCUMBENT else Arm.INCUMBENT


@dataclass(frozen=True)
class Phase:
    """Device indices (into the session's devices) of each arm for one pass over the requests."""

    incumbent: int
    candidate: int

    def device(self, arm: Arm) -> int:
        return self.incumbent if arm is Arm.INCUMBENT else self.candidate

    @property
    def concurrent(self) -> bool:
        return self.incumbent != self.candidate


@dataclass(frozen=True)
class BlockPlan:
    index: int
    prompts: tuple[tuple[int, ...], ...]
    request_size: int
    max_new_tokens: int
    phases: tuple[Phase, ...]
    first: tuple[Arm, ...]  # per request: the arm sent (on one device: run) first
    # per prompt: its sampling seed under a sampled regime, the same for both arms; () when greedy
    seeds: tuple[int, ...] = ()

    @property
    def requests(self) -> list[list[list[int]]]:
        """The prompts of each request, as the runner receives them."""
        p = [list(x) for x in self.prompts]
        return [p[i : i + self.request_size] for i in range(0, len(p), self.request_size)]

    @property
    def request_seeds(self) -> list[list[int] | None]:
        """The seeds of each request's prompts (None for every request when greedy)."""
        if not self.seeds:
            return [None] * len(self.requests)
        s = list(self.seeds)
        return [s[i : i + self.request_size] for i in range(0, len(s), self.request_size)]


def derived_seed(seed: int, *parts) -> int:
    """A 63-bit seed from the config seed and labels; stable across processes and versions."""
    text = ":".join(str(x) for x in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def request_seeds(config: ControllerConfig, n: int, *labels) -> tuple[int, ...]:
    """Sampling seeds of `n` prompts drawn under `labels` (stream and block index, or the gate's key):
    a function of the config seed and those labels only, so both arms of every request pair, and a
    re-run of the same plan, decode each prompt with the same seed; () unless `config.sampled`."""
    if not config.sampled:
        return ()
    return tuple(derived_seed(config.seed, "sampling", *labels, i) for i in range(n))


def phases_for(placement: Placement, index: int) -> tuple[Phase, ...]:
    if placement is Placement.ALTERNATE:
        return (Phase(0, 0),)
    if placement is Placement.SIDE_BY_SIDE:
        swap = (Phase(0, 1), Phase(1, 0))
        return swap if index % 2 == 0 else swap[::-1]
    raise ValueError(f"placement {placement} must be resolved before planning")


def first_arms(config: ControllerConfig, index: int, stream: str) -> tuple[Arm, ...]:
    """Which arm goes first in each request of block `index` (see `Order`)."""
    R = config.requests_per_block
    if config.order is Order.ABBA:
        return tuple(Arm.INCUMBENT if (index * R + r) % 2 == 0 else Arm.CANDIDATE for r in range(R))
    coin = random.Random(derived_seed(config.seed, "order", stream, index))
    return tuple(Arm.INCUMBENT if coin.random() < 0.5 else Arm.CANDIDATE for _ in range(R))


def plan_block(config: ControllerConfig, placement: Placement, index: int, prompts, stream: str) -> BlockPlan:
    if len(prompts) != config.block_prompts:
        raise ValueError(f"block needs {config.block_prompts} prompts, got {len(prompts)}")
    return BlockPlan(index, tuple(tuple(p) for p in prompts), config.request_size, config.max_new_tokens,
                     phases_for(placement, index), first_arms(config, index, stream),
                     request_seeds(config, len(prompts), stream, index))


Outputs = tuple[tuple[int, ...], ...]  # generated ids per prompt


@dataclass(frozen=True)
class BlockResult:
    index: int
    incumbent_seconds: tuple[tuple[float, ...], ...]  # [phase][request], controller clock
    candidate_seconds: tuple[tuple[float, ...], ...]
    incumbent_outputs: tuple[Outputs, ...]  # [phase] -> per prompt
    candidate_outputs: tuple[Outputs, ...]
    # What each worker says its own generate call took, [phase][request]. Untrusted (a candidate
    # could report anything): never used in a statistic, only kept to tell engine time from the
    # cost of the round trip when a report shows noise.
    incumbent_reported: tuple[tuple[float, ...], ...] = ()
    candidate_reported: tuple[tuple[float, ...], ...] = ()
    # Who else took CPU / GPU time during the block (`census.BlockCensus`); None where no census
    # is taken (simulations, shared workers). A void census voids the block (`controller.py`).
    census: "BlockCensus | None" = None
    # (seconds, tokens) of each request's saturated stretches, [phase][request]; () where the
    # runner reports none (static batches, isolated workers). Trusted: only shared workers send them.
    incumbent_saturated: tuple[tuple[tuple[float, int], ...], ...] = ()
    candidate_saturated: tuple[tuple[tuple[float, int], ...], ...] = ()

    @property
    def log_ratio(self) -> float:
        """x = mean over phases of the median over request pairs i of
        log((T_incumbent,i / n_incumbent,i) / (T_candidate,i / n_candidate,i)): time per token.

        Request i of each arm ran back to back, so a pair shares the machine's state; the median
        keeps one disturbed request (a stall, a clock dip) from moving the block, and a request
        pair is the finest unit both arms saw alike. Without outputs, n is taken as equal. A pair
        whose arms both report saturated stretches uses their seconds and tokens instead."""
        per_phase = []
        for phase, (a, b) in enumerate(zip(self.incumbent_seconds, self.candidate_seconds)):
            n_a = _request_tokens(self.incumbent_outputs, phase, len(a))
            n_b = _request_tokens(self.candidate_outputs, phase, len(b))
            sat_a = _saturated(self.incumbent_saturated, phase, len(a))
            sat_b = _saturated(self.candidate_saturated, phase, len(b))
            pairs = [((sa, sb) if sa and sb else ((ta, ka), (tb, kb)))
                     for ta, tb, ka, kb, sa, sb in zip(a, b, n_a, n_b, sat_a, sat_b)]
            per_phase.append(statistics.median(
                math.log(ta / tb) + (math.log(kb / ka) if ka and kb else 0.0)
                for (ta, ka), (tb, kb) in pairs))
        return sum(per_phase) / len(per_phase)

    @property
    def seconds(self) -> float:
        """Summed request time of both arms (the block's cost when arms alternate)."""
        return sum(map(sum, self.incumbent_seconds)) + sum(map(sum, self.candidate_seconds))

    def timings(self) -> dict:
        """Plain-data request times of this block: controller clock, and the workers' own reports."""
        def plain(rows):  # NaN (no report) as None: strict JSON
            return [[t if t == t else None for t in row] for row in rows]

        out = {"index": self.index, "incumbent": plain(self.incumbent_seconds),
               "candidate": plain(self.candidate_seconds),
               "incumbent_reported": plain(self.incumbent_reported),
               "candidate_reported": plain(self.candidate_reported)}
        if self.incumbent_saturated or self.candidate_saturated:
            out["incumbent_saturated"] = [[list(x) for x in row] for row in self.incumbent_saturated]
            out["candidate_saturated"] = [[list(x) for x in row] for row in self.candidate_saturated]
        return out

    def arm_seconds(self, arm: Arm) -> tuple[float, ...]:
        rows = self.incumbent_seconds if arm is Arm.INCUMBENT else self.candidate_seconds
        return tuple(t for row in rows for t in row)


def saturated_pairs(timing: dict) -> tuple[int, int]:
    """(request pairs compared on saturated stretches, request pairs) of one block's `timings()`."""
    inc, cand = timing.get("incumbent_saturated") or [], timing.get("candidate_saturated") or []
    pairs = sum(len(row) for row in timing.get("incumbent", []))
    both = sum(1 for ra, rb in zip(inc, cand) for a, b in zip(ra, rb) if min(*a, *b) > 0)
    return both, pairs


def _saturated(rows: tuple, phase: int, requests: int) -> list[tuple[float, int] | None]:
    """Each request's saturated (seconds, tokens) of one phase; None where it has none."""
    row = rows[phase] if phase < len(rows) else ()
    if len(row) != requests:
        return [None] * requests
    return [(float(t), int(n)) if t and n and t > 0 and n > 0 else None for t, n in row]


def _request_tokens(outputs: tuple[Outputs, ...], phase: int, requests: int) -> list[int]:
    """Tokens generated by each request of one phase (zeros when the block carries no outputs)."""
    rows = outputs[phase] if phase < len(outputs) else ()
    if not rows or len(rows) % requests:
        return [0] * requests
    size = len(rows) // requests
    return [sum(len(o) for o in rows[i * size : (i + 1) * size]) for i in range(requests)]

