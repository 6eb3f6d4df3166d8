"""Tuning a list of projection shapes within a time budget: each shape's choice today against its
byte floor, the config search and the cuBLAS fallbacks, and the fastest of them.

A `ProjectionShape` is one projection a deployment runs, y [m, n] = x [m, k] @ W [n, k].T, named
and counted in calls (which ones a decode round runs: `engine.round_shapes`). `tune`

1. times what the dispatcher runs today (`configs.choose`: the device's tuned table with the user
   cache and a system's own table over it, else the fallback rule) and computes the byte floor
   (weights + activations in and out / the measured bandwidth), so each shape's excess
   = (time - floor) x calls;
2. in order of excess, largest first, while the budget lasts, times cuBLAS on the decoded weight
   (each `Fallback`: decoded into a shared buffer at each call, or, for W12, kept decoded) and runs
   the config search (`search.tune`, up to `GEMM_MAX_M` rows; each config checked against the
   reference within `reference.error_bound` before it is timed) on each shape the kernels can
   take, so each row count takes the fastest path. Today's choice ranks with the rest and is timed
   again at the end, its faster timing counting, so that a slow first timing never passes for a gain.

`table_document` writes the choices at least `MIN_SPEEDUP` faster than today's (or every shape's
best) as a tuned table. The timings come through a small interface (`KernelBench`):
`GpuKernelBench` times on a deployment's own weights with `timing.GraphTimer` (CUDA-graph replays,
as the engine runs the kernels); the tests use a simulated bench on CPU.

Does not own which shapes a round runs (`engine.round_shapes`), the search (`search.py`), the
timing rule (`timing.py`), or what a loop does with a table (`loop.agents.kernel`). Importing it
needs neither Triton nor a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from specpilot.kernels.configs import GEMM_MAX_M, Choice, Fallback, LaunchConfig, WeightFormat, m_bucket
from specpilot.kernels.search import OutOfBudget, Problem, SearchSettings, Trial, tuned_document
from specpilot.kernels.search import tune as search

MIN_SPEEDUP = 1.03  # a tuned choice must beat today's by 3% to enter the table


@dataclass(frozen=True)
class ProjectionShape:
    """One projection y [m, n] = x [m, k] @ W [n, k].T that a deployment runs, `count` times."""

    name: str  # "qkv", "o", "gate_up", "down", "lm_head"; "drafter.qkv", ... for the drafter's
    m: int  # rows (tokens of the batch in one forward)
    n: int  # output features
    k: int  # input features
    count: int  # calls per forward (layers, or 1 for lm_head); per round from `engine.round_shapes`


def choice_dict(choice: Choice) -> dict:
    """A choice as plain data: a launch config's dict, or {"path": "unpack_cublas"}."""
    return {"path": choice.value} if isinstance(choice, Fallback) else choice.to_dict()


def choice_of(d: dict) -> Choice:
    return Fallback(d["path"]) if "path" in d and "block_n" not in d else LaunchConfig.from_dict(d)


@dataclass(frozen=True)
class ShapeTiming:
    shape: ProjectionShape
    floor_us: float
    current: dict  # `choice_dict` of today's choice
    current_us: float
    best: dict  # the fastest correct choice (today's where none beat it)
    best_us: float
    tried: int  # configs the search timed besides today's
    complete: bool = False  # every choice the shape can take was timed (not cut by the budget)

    @property
    def excess_us(self) -> float:
        """Time above the byte floor, all calls of this shape (per forward, or per round)."""
        return max(self.current_us - self.floor_us, 0.0) * self.shape.count

    @property
    def saving_us(self) -> float:
        return max(self.current_us - self.best_us, 0.0) * self.shape.count

    @property
    def improved(self) -> bool:
        return self.current_us >= MIN_SPEEDUP * self.best_us

    def to_dict(self) -> dict:
        return {"shape": self.shape.__dict__, "floor_us": self.floor_us, "current": self.current,
                "current_us": self.current_us, "best": self.best, "best_us": self.best_us, "tried": self.tried,
                "complete": self.complete}


class KernelBench(Protocol):
    """Today's choice and the byte floor of a projection shape, a `kernels.search.Timer`, and a
    timer of the decode-then-cuBLAS paths."""

    device_name: str
    weight_format: WeightFormat  # of the weights it times
    sm_count: int

    def current(self, shape: ProjectionShape) -> Choice: ...  # what the dispatcher picks today

    def floor_us(self, shape: ProjectionShape) -> float: ...

    def time(self, problem: Problem, config: LaunchConfig) -> Trial: ...  # checked, then timed

    def time_fallback(self, problem: Problem, fallback: Fallback) -> float | None: ...  # µs of cuBLAS, decoded


def tune(shapes: list[ProjectionShape], bench: KernelBench, budget_s: float,
         log=lambda line: None) -> list[ShapeTiming]:
    """Rank shapes by excess over their floor, then, in that order within the budget, time cuBLAS on
    the decoded weight (each `Fallback`; plain weights need no decoding, so one) and, with what
    budget is left, search the kernel configs of those the kernels take (`kernels.search.tune`, up
    to GEMM_MAX_M rows); a shape reached after the budget keeps today's choice. The fallbacks come
    first: a timing each, and above GEMM_MAX_M rows the only other choices there are."""
    start = time.monotonic()
    problem = {s: Problem(bench.weight_format, s.n, s.k, s.m) for s in shapes}

    def time_choice(p: Problem, choice: Choice) -> float | None:
        return bench.time_fallback(p, choice) if isinstance(choice, Fallback) else bench.time(p, choice).us

    baseline = []  # (shape, today's choice, its first timing in µs, floor µs)
    for s in shapes:
        cur = bench.current(s)
        first = time_choice(problem[s], cur)
        if first is not None:
            baseline.append((s, cur, first, bench.floor_us(s)))
    baseline.sort(key=lambda b: -(b[2] - b[3]) * max(b[0].count, 1))
    known: dict[Problem, list[Trial]] = {}
    for s, cur, first, _ in baseline:
        if s.m <= GEMM_MAX_M:  # two shapes of one size are searched once
            known.setdefault(problem[s], [Trial(cur, us=first)] if isinstance(cur, LaunchConfig) else [])
    fallbacks = list(Fallback) if bench.weight_format is WeightFormat.W12 else [Fallback.UNPACK_CUBLAS]
    fallback_us: dict[tuple[Problem, Fallback], float | None] = {}
    for s, cur, _, _ in baseline:
        for fb in fallbacks:
            if fb is not cur and (problem[s], fb) not in fallback_us and time.monotonic() - start < budget_s:
                fallback_us[problem[s], fb] = bench.time_fallback(problem[s], fb)
    settings = SearchSettings(budget_s=budget_s, sm_count=bench.sm_count, out_of_budget=OutOfBudget.SKIP)
    found = {r.problem: r for r in search(list(known), bench.time, settings, known=known, started=start)}
    out = []
    for s, cur, first, floor in baseline:
        p = problem[s]
        options = [(cur, first)]
        result = found.get(p)
        if result is not None and result.best is not None:
            options.append((result.best.config, result.best.us))
        options += [(fb, fallback_us[p, fb]) for fb in fallbacks if fallback_us.get((p, fb)) is not None]
        # today's choice once more: its first timing can be a transient (on a GPU that has just
        # been idle, several times the next one) and must not pass for a gain of the tuned table
        cur_us = first
        again = time_choice(p, cur)
        if again is not None and again < cur_us:
            cur_us = again
            options[0] = (cur, again)
        best, best_us = min(options, key=lambda o: o[1])  # today's first on ties
        tried = len(result.tried) - len(known[p]) if result is not None else 0
        complete = (all(fb is cur or (p, fb) in fallback_us for fb in fallbacks)
                    and (s.m > GEMM_MAX_M or (result is not None and result.swept)))
        out.append(ShapeTiming(s, floor, choice_dict(cur), cur_us, choice_dict(best), best_us, tried, complete))
    _log_timings(out, log)
    return out


def _log_timings(timings: list[ShapeTiming], log) -> None:
    """A line per shape the search ran on or that improved, largest excess first; one for the rest
    (shapes no config search takes, whose only other paths are the fallbacks)."""
    rest = []
    for t in timings:
        s = t.shape
        if t.tried == 0 and not t.improved:
            rest.append(t)
            continue
        log(f"kernel: {s.name} M={s.m} N={s.n} K={s.k}: {t.current_us:.1f} us today (floor {t.floor_us:.1f}), "
            f"best {t.best_us:.1f} us ({_label(choice_of(t.best))}) over {t.tried} configs")
    if rest:
        log(f"kernel: {len(rest)} more shape(s) timed but searched by no config (above {GEMM_MAX_M} rows, or past "
            "the budget): today's choice kept")


def _label(choice: Choice) -> str:
    return choice.value if isinstance(choice, Fallback) else choice.label()


def table_document(device_name: str, fmt: str, existing: dict, timings: list[ShapeTiming],
                   every=False, written_by: str = __name__) -> dict:
    """A tuned table: `existing` ({(format, m, n, k): choice}) plus the improvements (`every`, a bool
    or a predicate on shapes: each such shape's best, improved or not, as a model on cuBLAS turning
    to the kernels needs: a shape without an entry would run the untuned heuristic instead of the
    cuBLAS it ran)."""
    entries: dict = dict(existing)
    needs = every if callable(every) else (lambda shape: every)
    for t in timings:
        if t.improved or needs(t.shape):
            entries[(fmt, m_bucket(t.shape.m), t.shape.n, t.shape.k)] = choice_of(t.best)
    return tuned_document(device_name, entries, written_by=written_by)


class GpuKernelBench:
    """Real timings on the GPU, on a deployment's own weights: `weight(n, k)` gives the [n, k]
    weight a shape is timed on (W12-encoded here if `w12`); today's choice as the dispatcher makes
    it under `table`, or cuBLAS for the shapes whose model runs it (`cublas(shape)`)."""

    def __init__(self, weight: Callable[[int, int], object], device, w12: bool, bandwidth_gbps: float,
                 table: str = "", cublas: Callable[[ProjectionShape], bool] = lambda shape: False):
        from specpilot.kernels.dispatch import device_name
        from specpilot.kernels.launch import sm_count
        from specpilot.kernels.timing import GraphTimer

        self.weight, self.table, self.cublas = weight, table, cublas
        self.weight_format = WeightFormat.W12 if w12 else WeightFormat.DENSE
        self.bandwidth = bandwidth_gbps * 1e9  # bytes moved per second, as the cost model counts it
        self.device = device
        self.device_name = device_name(device)
        self.sm_count = sm_count(device)
        self._weights: dict[tuple[int, int], list] = {}
        self._timer = GraphTimer(lambda p: self._weight_sets(p.n, p.k), self._input)

    def _weight_sets(self, n: int, k: int) -> list:
        """The [n, k] weight (W12-encoded for a W12 bench) and copies of it, together
        beyond L2 (`timing.weight_sets`): each call reads its weight from HBM, as in a forward,
        whatever the weight's size."""
        import torch

        from specpilot.kernels.timing import copies, weight_sets

        if (n, k) not in self._weights:
            w = self.weight(n, k).detach().to(torch.bfloat16)
            if self.weight_format is WeightFormat.W12:
                from specpilot.w12 import encode

                w = encode(w)
            set_bytes = n * k * (1.5 if self.weight_format is WeightFormat.W12 else 2.0)
            self._weights[n, k] = copies(w, weight_sets(n, k, set_bytes))
        return self._weights[n, k]

    def _input(self, p: Problem):
        import torch

        g = torch.Generator(device="cpu").manual_seed(p.m * 7919 + p.k)
        return torch.randn(p.m, p.k, generator=g).to(self.device, torch.bfloat16)  # [M, K]

    def current(self, shape: ProjectionShape) -> Choice:
        from specpilot.kernels.configs import choose

        if self.cublas(shape):
            return Fallback.UNPACK_CUBLAS  # plain F.linear, which the unpack path is for plain weights
        return choose(self.weight_format, shape.m, shape.n, shape.k, self.device_name, self.table)

    def floor_us(self, shape: ProjectionShape) -> float:
        weight_bytes = shape.n * shape.k * (1.5 if self.weight_format is WeightFormat.W12 else 2.0)
        act_bytes = 2 * shape.m * (shape.k + shape.n)
        return (weight_bytes + act_bytes) / self.bandwidth * 1e6

    def time(self, problem: Problem, config: LaunchConfig) -> Trial:
        return self._timer(problem, config)

    def time_fallback(self, problem: Problem, fallback: Fallback) -> float | None:
        return self._timer.time_fallback(problem, fallback)

    def calls(self, problem: Problem, choice: Choice) -> list:
        """`choice`'s calls over the problem's weight sets, to time beside another bench's."""
        return self._timer.calls(problem, choice)
