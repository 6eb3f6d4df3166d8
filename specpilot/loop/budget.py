"""The run's wall-clock budget and the estimates it is spent by.

A run with `--budget-minutes` starts a round only if the round *and* the final measurement fit in
what is left, so it stops cleanly and still measures and reports. The estimates:

- one paired evaluation: scaled from the noise measurement when it ran in this run (its worker
  start-up, warm-up, and its per-block time times the blocks of a candidate — half the extra
  blocks counted — plus the guard's outputs), else the median cost of this deployment's stored
  evaluations, else a guess per device;
- a compile warm-up: a system that turns on `draft_compile` or `verify_compile` (`compiles`) is
  compiled by torch.compile as its worker opens it, far longer than the evaluation's plain open
  (`SHARED_OPEN_S`). It is the longest open of a compiled candidate seen in this run less a plain
  open, else a guess per device (`COMPILE_OPEN_S`). A shared worker compiles a system once per
  run (a system this run timed before is compiled there already); an isolated worker pair at
  every open (`open_warmup`);
- a round: the longest round so far; before the first, proposing (the kernel agent's tuning
  budget when it is on, else nothing) plus 5 s plus (waves of screening + the winner's
  re-measurement) evaluations, a wave being as many candidates as the backend times at once;
- the final measurement: AR, stock and the final system over every prompt at their measured (AR
  and incumbent) ms per token, plus warm-up: a process's start, load and CUDA graphs where the
  final system carries a patch (it is benched in its worktree's own process), else only each
  system's graphs and warmed shapes in the loop's loaded process; plus a compile warm-up for each
  of stock and the final system that compiles. The held-out run (`final.heldout_config`) counts
  the same way: its tokens, and a second warm-up (a second process, or each system's shapes
  again). Served by
  continuous batching in C slots, a unit of R x C requests of at most T tokens ends within
  (R + 1 - 1/C) x T token times (its last request starts once the others' work, at most
  (R x C - 1) x T, is spread over the slots), which is the estimate: slots draining at its end
  and outputs ending early both fit in it.

When a full round does not fit but a smaller one does, the run times fewer candidates that round
(`fitting_candidates`) rather than stopping. Once a round's candidates are known (after proposing,
before timing) each has its own estimate (`CandidateCost`: its evaluations, its compile warm-ups,
and the final measurement should it become the final system), and the round times only those
that fit: in proposal order, a candidate is kept when the round of the ones kept before it and it
still ends with its final measurement inside the budget, else left out — a dear one does not
keep the cheaper ones after it from being timed (`fitting_selection`).

Owns: `Budget`, the estimates, the round size and the candidates that fit. Does not own what runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from specpilot.bench.serving import ServingConfig
from specpilot.control.config import ControllerConfig

GUESS_EVALUATION_S = {"cpu": 20.0, "cuda": 90.0}
WARMUP_S = {"cpu": 10.0, "cuda": 60.0}  # the final benchmark in a process of its own (a patched final system)
SYSTEM_WARMUP_S = {"cpu": 3.0, "cuda": 10.0}  # one system's warm-up in the loop's loaded process
SHARED_OPEN_S = 6.0  # warming a new system in a running shared worker (graph capture), settling included
COMPILE_OPEN_S = {"cpu": 30.0, "cuda": 90.0}  # torch.compile of a system's draft / verify forward as it opens


class Budget:
    """Wall-clock left for the run; `fits(s)` says whether `s` more seconds stay within it."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.monotonic()

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (time.monotonic() - self.start)

    def fits(self, seconds: float) -> bool:
        return seconds <= self.left()


def evaluation_seconds(noise_costs, ccfg: ControllerConfig, memory, digest: str, device: str) -> float:
    """What one paired evaluation should cost (see the module docstring)."""
    if noise_costs is not None and noise_costs.blocks:
        per_block = noise_costs.timed_blocks / noise_costs.blocks
        gate = ccfg.gate_prompts / ccfg.block_prompts * per_block  # both arms generate the gate's prompts
        blocks = ccfg.blocks + ccfg.extra_blocks / 2  # extra blocks are spent on undecided candidates only
        # a shared worker is started once, in the noise measurement: later knob comparisons only warm
        open_s = min(noise_costs.open, SHARED_OPEN_S) if ccfg.shared_workers else noise_costs.open
        return open_s + noise_costs.warmup_blocks + gate + blocks * per_block
    totals = sorted(e.detail["evaluation"]["costs"]["total"] for e in memory.entries(deployment=digest, limit=20)
                    if e.detail.get("evaluation", {}).get("estimate"))
    if totals:
        return totals[len(totals) // 2]
    return GUESS_EVALUATION_S[device]


def compiles(knobs: dict) -> bool:
    """Whether a system, by its knob dict, is compiled as it opens (`draft_compile`, `verify_compile`)."""
    return bool(knobs.get("draft_compile") or knobs.get("verify_compile"))


def compiled_opens(evaluations) -> list[float]:
    """The open seconds of the comparisons (`control.controller.Evaluation`) that compiled their
    candidate: a compiled candidate's first open (a re-measured winner's screening's)."""
    return [(e.screening or e).costs.open for e in evaluations if compiles(e.candidate.system)]


def compile_seconds(opens: list[float], device: str) -> float:
    """What compiling a system adds to opening it: the longest of this run's `opens` of compiled
    systems (`compiled_opens`) less a plain open, else the device's guess."""
    return max(0.0, max(opens) - SHARED_OPEN_S) if opens else COMPILE_OPEN_S[device]


def open_warmup(compiled: bool, warm: bool, shared: bool, compile_s: float) -> tuple[float, float]:
    """(at the screening, at the re-measurement): the compile warm-up of one arm of a comparison.
    None unless its system compiles; a shared worker (`shared`) compiles it at its first open only,
    none when it did before (`warm`); an isolated worker pair at every open."""
    if not compiled:
        return 0.0, 0.0
    return ((0.0 if warm else compile_s), 0.0) if shared else (compile_s, compile_s)


def round_seconds(past: list[float], per_evaluation: float, candidates: int, parallelism: int,
                  propose_s: float = 0.0) -> float:
    """The next round's time: the longest so far, else proposing (`propose_s`) + 5 s + screening
    waves + re-measurement."""
    if past:
        return max(past)
    return propose_s + 5.0 + (math.ceil(candidates / max(1, parallelism)) + 1) * per_evaluation


def fitting_candidates(past: list[float], per_evaluation: float, candidates: int, parallelism: int,
                       seconds: float, propose_s: float = 0.0) -> int:
    """The most candidates, at most `candidates`, whose round fits in `seconds`; 0 when not even one's
    does. A round of k is the full round's estimate (`round_seconds`) less the evaluations k saves:
    what is not evaluations in it (proposing, the rest) stays."""
    def evaluations(k: int) -> int:  # screening waves and the winner's re-measurement
        return math.ceil(k / max(1, parallelism)) + 1

    full = round_seconds(past, per_evaluation, candidates, parallelism, propose_s)
    rest = max(0.0, full - evaluations(candidates) * per_evaluation)
    return next((k for k in range(candidates, 0, -1) if rest + evaluations(k) * per_evaluation <= seconds), 0)


@dataclass(frozen=True)
class CandidateCost:
    """One candidate's part of a round, in seconds (see the module docstring)."""

    screen: float  # its screening evaluation, compile warm-ups included
    remeasure: float  # its re-measurement, should it win the screening
    final: float  # the final measurement's estimate should it become the final system (0: no final)
    warmup: float = 0.0  # the compile warm-up in `screen`


def selection_seconds(once: float, costs: list[CandidateCost], parallelism: int) -> float:
    """Timing the candidates of `costs` and the final measurement after them: `once` (a warm-up
    the round pays once), screening waves of `parallelism` (each as long as its longest), the
    winner's re-measurement (the longest of theirs) and the final (the longest of theirs)."""
    p = max(1, parallelism)
    waves = sum(max(c.screen for c in costs[i : i + p]) for i in range(0, len(costs), p))
    return once + waves + max(c.remeasure for c in costs) + max(c.final for c in costs)


def fitting_selection(once: float, costs: list[CandidateCost], parallelism: int, seconds: float) -> list[int]:
    """The candidates (indices into `costs`, in proposal order) a round times in `seconds`: each in
    turn is kept when the round of those kept before it and it, with its final measurement
    (`selection_seconds`), fits; else it is left out and the ones after it are still tried."""
    kept: list[int] = []
    for i in range(len(costs)):
        if selection_seconds(once, [costs[j] for j in (*kept, i)], parallelism) <= seconds:
            kept.append(i)
    return kept


def bench_tokens(bench, batch: int) -> float:
    """The token times (sequential steps of one sequence) of a `BenchConfig` or `ServingConfig`
    benchmark run, `batch` sequences decoded together (see the module docstring)."""
    if isinstance(bench, ServingConfig):  # token times of each unit, summed
        pool = len(bench.sets) * bench.n_prompts
        return sum(min(bench.units or pool, pool // bench.unit_size(c)) * (bench.requests_per_slot + 1 - 1 / c)
                   for c in bench.concurrency) * bench.max_new_tokens
    return len(bench.sets) * bench.n_prompts * bench.max_new_tokens / batch


def final_seconds(cost, bench, batch: int, device: str, own_process: bool = True, compile_s: float = 0.0,
                  heldout=None) -> float:
    """The final measurement's time for its `BenchConfig` or `ServingConfig` `bench`, from the
    incumbent's cost table (ms per token of one sequence, `batch` decoded together); `own_process`
    False: it runs in the loop's loaded process (no patched final system is possible); `compile_s`:
    the compile warm-ups of its systems that compile (`compile_seconds` each); `heldout`: the
    held-out run's config (`final.heldout_config`), None when there is none."""
    ar = cost.predict_ms_per_token(None)
    per_token = (ar if math.isfinite(ar) else cost.ms_per_token) + 2 * cost.ms_per_token  # AR, stock, final
    runs = [bench] if heldout is None else [bench, heldout]
    tokens = sum(bench_tokens(b, batch) for b in runs)
    warmup = (WARMUP_S[device] if own_process else 3 * SYSTEM_WARMUP_S[device]) * len(runs)
    return 1.2 * per_token * tokens / 1e3 + warmup + compile_s
