"""Timing a projection kernel as the engine runs it, and checking it before it is timed (GPU).

Owns: the rule every kernel timing of the project follows -- calls captured in a CUDA graph and
replayed, CUDA events around each replay, the median over replays -- over rotating weight sets
that together exceed L2 (so the weights come from HBM, as in a decoder forward); random weights
without zeros; side-by-side rounds in rotated order (`time_arms`: with a wall-clock stand-in for
smoke runs off a GPU); the copy bandwidth byte floors are taken against; the reference check of a config's output
(`check_output`); and `GraphTimer`, the `search.Timer` that checks, then times, one config.

Does not own which configs to try or which one wins (`search.py`). Importing it needs no GPU:
Triton is imported by the kernels on their first launch.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from specpilot.kernels.configs import Fallback, LaunchConfig
from specpilot.kernels.dispatch import run_config, run_fallback
from specpilot.kernels.reference import error_bound, reference_linear
from specpilot.kernels.search import Problem, Trial
from specpilot.w12.weight import W12Weight

L2_COVER_BYTES = 200e6  # the weight sets of one timing together exceed this (>= 3x a 50-60 MB L2)
WEIGHT_STD = 0.02
MIN_SETS, MAX_SETS = 4, 32


def graph_time_us(calls: Sequence[Callable[[], object]], passes: int = 2, replays: int = 7) -> float:
    """Median µs per call of `calls` (one per weight set) replayed back to back in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and compilation) outside the capture
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(passes):
            for fn in calls:
                fn()
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / (passes * len(calls)))
    del graph
    return statistics.median(per_call)


def warm_clocks(ms: float = 30.0, device: str = "cuda") -> None:
    """Keep the GPU busy for about `ms` so that its clocks are up before a baseline is timed: the
    first timing after host-side work (e.g. encoding weights) runs at lower clocks."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    start = time.monotonic()
    while (time.monotonic() - start) * 1e3 < ms:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def rotated_rounds(arms: dict[str, list], rounds: int = 3, replays: int | None = None
                   ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(fastest µs per arm, every round's µs) of `arms` (name -> calls for `graph_time_us`, at
    `replays` replays if given), each timed once per round, in an order rotated by one arm per
    round, after warming the clocks: a single timing per arm would compare a cold arm with a warm one."""
    keys = list(arms)
    runs: dict[str, list[float]] = {k: [] for k in keys}
    more = {} if replays is None else {"replays": replays}
    warm_clocks()
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            runs[k].append(graph_time_us(arms[k], **more))
    return {k: min(v) for k, v in runs.items()}, runs


def cpu_time_us(calls: Sequence[Callable[[], object]], replays: int) -> float:
    """Median µs per call, each call timed on its own by the wall clock (a smoke run off a GPU)."""
    per = []
    for _ in range(replays):
        for fn in calls:
            t0 = time.perf_counter()
            fn()
            per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)


def time_arms(arms: dict[str, list], rounds: int, replays: int, smoke: bool
              ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """`rotated_rounds` at `replays` replays; under `smoke` (no GPU) one `cpu_time_us` per arm."""
    if smoke:
        runs = {k: [cpu_time_us(v, replays)] for k, v in arms.items()}
        return {k: min(v) for k, v in runs.items()}, runs
    return rotated_rounds(arms, rounds, replays)


def copy_bandwidth(device: torch.device, smoke: bool) -> float:
    """Bytes per µs of a large copy on `device` (read + write), median of 10 after 2 warm-ups
    (`smoke`: a 16 MiB copy, else 1 GiB; CUDA events on a GPU, the wall clock elsewhere)."""
    n = 2**24 if smoke else 2**30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append((time.perf_counter() - t0) * 1e6)
    return 2 * n / statistics.median(times[2:])


def weight_sets(N: int, K: int, set_bytes: float) -> int:
    """How many weight sets of `set_bytes` each a timing rotates through: together >= L2_COVER_BYTES."""
    return max(MIN_SETS, min(MAX_SETS, math.ceil(L2_COVER_BYTES / set_bytes)))


def copies(weight, count: int) -> list:
    """`weight` and `count - 1` fresh copies of it (a BF16 tensor's clones, or a W12Weight's planes
    cloned, with nothing derived yet): rotating sets made of one real weight."""
    def clone(w):
        if isinstance(w, W12Weight):
            return W12Weight.from_planes(w.shape, {k: v.clone() for k, v in w.planes().items()})
        return w.clone()
    return [weight] + [clone(weight) for _ in range(count - 1)]


def random_weight(N: int, K: int, device: str = "cuda") -> torch.Tensor:
    """BF16 [N, K] normal weights of std WEIGHT_STD with no zeros (a zero is a W12 escape)."""
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * WEIGHT_STD
    return torch.where(w == 0, torch.full_like(w, WEIGHT_STD), w)


def check_output(y: torch.Tensor, x: torch.Tensor, weight, exact=None, bound=None) -> float:
    """Worst |y - exact| / bound over the finite outputs (a config passes at <= 1); raises
    AssertionError where y's NaN or Inf positions differ from the reference's. `exact, bound`:
    `error_bound(x, weight, y.dtype)`, computed here when not given."""
    ref = reference_linear(x, weight)  # [M, N]
    if not torch.equal(torch.isnan(y), torch.isnan(ref)):
        raise AssertionError("NaN positions differ from the reference")
    inf = torch.isinf(ref)
    if not torch.equal(y[inf], ref[inf]) or not torch.isfinite(y[~inf & ~torch.isnan(ref)]).all():
        raise AssertionError("Inf positions differ from the reference")
    if exact is None:
        exact, bound = error_bound(x, weight, y.dtype)
    fin = torch.isfinite(ref)
    return float(((y.double() - exact).abs() / bound)[fin].max()) if fin.any() else 0.0


def failure(err: BaseException) -> str:
    """One line of at most 300 characters naming an exception, for a results file."""
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


class GraphTimer:
    """A `search.Timer`: runs a config once on a problem's first weight set and checks it against
    the reference (`check_output`); only a config within the bound is timed, by `graph_time_us`
    over all the problem's weight sets. A failure is a Trial with an error, never an exception.

    `weights(problem)` gives the problem's weight sets (BF16 tensors or W12Weights [N, K]) and
    `inputs(problem)` its x [M, K]; each is asked once per problem, and the problem's x, sets and
    error bound are kept for the timer's lifetime.
    """

    def __init__(self, weights: Callable[[Problem], Sequence], inputs: Callable[[Problem], torch.Tensor],
                 time_calls: Callable[[list], float] = graph_time_us):
        self._weights, self._inputs, self._time_calls = weights, inputs, time_calls
        self._cases: dict[Problem, tuple] = {}

    def case(self, problem: Problem) -> tuple:
        """(x [M, K], weight sets, exact [M, N], bound [M, N]) of `problem`."""
        if problem not in self._cases:
            x, sets = self._inputs(problem), list(self._weights(problem))
            self._cases[problem] = (x, sets, *error_bound(x, sets[0], x.dtype))
        return self._cases[problem]

    def check(self, problem: Problem, config: LaunchConfig) -> Trial:
        """`config` run once on the first weight set and checked: a Trial without timing."""
        try:
            x, sets, exact, bound = self.case(problem)
            worst = check_output(run_config(x, sets[0], config), x, sets[0], exact, bound)
        except Exception as err:  # noqa: BLE001 - a config that fails is reported, not raised
            return Trial(config, error=failure(err))
        return Trial(config, worst_error_over_bound=worst, error=None if worst <= 1.0 else "exceeds the error bound")

    def __call__(self, problem: Problem, config: LaunchConfig) -> Trial:
        checked = self.check(problem, config)
        if checked.error is not None:
            return checked
        try:
            us = self._time_calls(self.calls(problem, config))
        except Exception as err:  # noqa: BLE001 - a config that fails is reported, not raised
            return dataclasses.replace(checked, error=failure(err))
        return dataclasses.replace(checked, us=us)

    def calls(self, problem: Problem, choice: LaunchConfig | Fallback) -> list[Callable[[], object]]:
        """One call of `choice` (a config, unchecked here, or a fallback) per weight set of `problem`:
        what `graph_time_us` times, alone or beside another choice's (`rotated_rounds`)."""
        x, sets, _, _ = self.case(problem)
        run = run_fallback if isinstance(choice, Fallback) else run_config
        return [lambda w=w: run(x, w, choice) for w in sets]

    def time_fallback(self, problem: Problem, fallback: Fallback) -> float | None:
        """µs per call of cuBLAS on the decoded weight (`dispatch.run_fallback`: bit-exact by
        construction, so unchecked) over the problem's weight sets; None if it fails."""
        try:
            return self._time_calls(self.calls(problem, fallback))
        except Exception:  # noqa: BLE001 - a path that fails is not a choice
            return None
