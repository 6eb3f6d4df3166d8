"""The kernel agent: tunes the projections of the deployment's own shapes, furthest from their floor.

GPU only. Each round, for the projections the incumbent runs -- the target's (qkv, o, gate_up,
down per block, and lm_head when it runs through the kernels) and the drafter's, at the row counts
it runs them (`deployment_shapes`: verification = batch x tree nodes, drafting = batch x topk per
draft step, the prefill buckets up to MAX_ROWS) -- it

1. times what the dispatcher runs today (`kernels.configs.choose`: the device's tuned table with
   the user cache and the incumbent's own table over it, else the fallback rule) and computes the
   byte floor (weights + activations in and out / the measured bandwidth), so each shape's excess
   = (time - floor) x calls per round;
2. in order of excess, largest first, runs the package's config search on each shape the kernels
   can take (`kernels.search.tune`, up to `GEMM_MAX_M` rows; each config checked against the
   reference within `kernels.reference.error_bound` before it is timed) on the deployment's own
   weights (W12-encoded when the incumbent runs W12), while `kernel_budget_s` lasts; and times
   cuBLAS on the decoded weight (`Fallback`: decoded into a shared buffer at each call, or, for
   W12, kept decoded), so each row count takes the fastest path. Today's choice ranks with the rest
   and is timed again at the end, its faster timing counting, so that a slow first timing never
   passes for a gain;
3. records each shape searched in full (every config and fallback timed) that nothing beat, with
   the choice it ran, in the user cache (`user_cache.searched_path`: per GPU and versions); later
   rounds and runs skip a recorded shape while it runs that choice, so a round on shapes already
   searched costs no search;
4. keeps the choices at least `MIN_SPEEDUP` faster than today's and writes them, over the
   incumbent's own table, to a table file of the candidate in the user cache
   (`kernels.user_cache.candidate_path`). The candidate is the incumbent with `kernel_table = <its
   id>` (the file's name, found under whichever home runs it: a memory export carries the file,
   an import puts it there) and the kernels turned on for each model with a shape that gained:
   `kernel = "triton"` for the target's, `draft_kernel = "triton"` for the drafter's (its own
   weights: a draft model, an EAGLE-3 head or a DFlash drafter, counted only on plain weights):
   any worker loads it, no git checkout or worktree needed. When the loop promotes it, `promote_table` merges the file
   into the user cache of the GPU and these versions, so every later run on this machine starts
   from it.
One tuned table is timed per incumbent: once one was timed against it (whatever the verdict), the
agent proposes none until the incumbent changes, since a table tuned again on the same shapes
differs by noise in the search, and so would its gain (`timed_table`).
Timings are `kernels.timing.GraphTimer`'s: CUDA-graph replays, as the engine runs the kernels.

On CPU (or without Triton) it is off, and says so once. Today's choice, the floor and the timers sit
behind a small interface (`KernelBench`), so the ranking, selection and table are tested on CPU
with a simulated bench.

Owns: choosing shapes, keeping improvements, writing and promoting the candidate's table. Does not
own the search, the kernels, their configs' meaning or the cache's layout (`specpilot.kernels`), or
judging the candidate (guard, controller).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from specpilot.config import DRAFTER_MODELS, DrafterKind, Kernel, System
from specpilot.engine.generator import PREFILL_BUCKET
from specpilot.kernels import user_cache
from specpilot.kernels.configs import (
    GEMM_MAX_M,
    Choice,
    Fallback,
    LaunchConfig,
    WeightFormat,
    device_slug,
    entry_choice,
    m_bucket,
)
from specpilot.kernels.search import OutOfBudget, Problem, SearchSettings, Trial, tuned_document
from specpilot.kernels.search import tune as search
from specpilot.loop.agents.base import AgentStatus, LoopSetup, Proposal, Proposer, ProposerContext, register
from specpilot.loop.cost_model import GapKind
from specpilot.loop.systems import Candidate

MIN_SPEEDUP = 1.03  # a tuned choice must beat today's by 3% to enter the table
MAX_ROWS = 257  # the most rows per batch row a verification runs (a 256-token tree and its root)


@dataclass(frozen=True)
class ProjectionShape:
    name: str  # "qkv", "o", "gate_up", "down", "lm_head"; "drafter.qkv", ... for the drafter's
    m: int  # rows (tokens of the batch in one forward)
    n: int  # output features
    k: int  # input features
    count: int  # calls per forward (layers, or 1 for lm_head); per round from `deployment_shapes`


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


def projection_shapes(config, rows: int, lm_head: bool) -> list[ProjectionShape]:
    """The target's projections (a `models.config.ModelConfig`) at `rows` rows."""
    C, I, L = config.hidden_size, config.intermediate_size, config.num_layers
    H, Hkv, D = config.num_heads, config.num_kv_heads, config.head_dim
    out = [ProjectionShape("qkv", rows, (H + 2 * Hkv) * D, C, L), ProjectionShape("o", rows, C, H * D, L),
           ProjectionShape("gate_up", rows, 2 * I, C, L), ProjectionShape("down", rows, C, I, L)]
    if lm_head:
        out.append(ProjectionShape("lm_head", rows, config.vocab_size, C, 1))
    return out


def drafter_weights(kind: DrafterKind, drafter) -> dict[str, tuple[int, int, int]]:
    """{name: (n, k, calls per forward)} of a drafter's own projections, lm_head and feature fusion
    (`fc`): a draft model's (`drafter` the model or its `ModelConfig`), an EAGLE-3 head's or a
    DFlash drafter's (`drafter` the model, for its `config` and `spec`). An EAGLE-3 layer's qkv
    reads [embedding ; hidden] (2C); a DFlash drafter drafts through the target's lm_head."""
    if kind is DrafterKind.MODEL:
        return {s.name: (s.n, s.k, s.count) for s in projection_shapes(getattr(drafter, "config", drafter), 1, True)}
    c, spec = drafter.config, drafter.spec
    out = {s.name: (s.n, s.k, s.count) for s in projection_shapes(c, 1, False)}
    C = c.hidden_size
    if kind is DrafterKind.EAGLE3:
        out["qkv"] = ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, 2 * C, c.num_layers)
        out["fc"] = (C, len(spec.layer_ids) * spec.target_hidden_size, 1)
        out["lm_head"] = (spec.draft_vocab_size, C, 1)
    else:
        out["fc"] = (C, len(spec.target_layer_ids) * C, 1)
    return out


def drafter_round(kind: DrafterKind, system: System, batch: int, draft_forwards: int) -> list[tuple[str, int, int]]:
    """(name, rows, forwards per round) of the drafter's own projections in one decode round: a
    draft model's catch-up over batch x window rows (its lm_head on the roots), then its
    `draft_forwards - 1` expansions over batch x topk; an EAGLE-3 head's catch-up over batch x
    (depth + 1) rows through `fc` and its layer (lm_head on the roots), then its expansions; a
    DFlash drafter's context (`fc` and its layers' projections) and its block, each over batch x
    block_size rows."""
    blocks = ("qkv", "o", "gate_up", "down")
    expansions = [(n, batch * max(1, system.topk), draft_forwards - 1) for n in (*blocks, "lm_head")]
    if kind is DrafterKind.MODEL:
        return [(n, batch * system.window, 1) for n in blocks] + [("lm_head", batch, 1)] + expansions
    if kind is DrafterKind.EAGLE3:
        catch_up = [(n, batch * (system.depth + 1), 1) for n in (*blocks, "fc")]
        return catch_up + [("lm_head", batch, 1)] + expansions
    rows = batch * system.block_size
    return [(n, rows, 2) for n in blocks] + [("fc", rows, 1)]


def deployment_shapes(target, drafter, system: System, batch: int, tree_nodes: int,
                      draft_forwards: int, drafter_kernels: bool = False) -> list[ProjectionShape]:
    """The projections the incumbent runs (`target` its `ModelConfig`; `drafter` what
    `drafter_weights` reads for the incumbent's drafter, None without one), counted per decode
    round: the target's verification over batch x tree nodes rows; the drafter's own projections
    as `drafter_round` runs them; and each prefill bucket of both models up to MAX_ROWS rows per
    batch row, counted 0 (prefill runs once per request). The drafter's shapes count only with
    `drafter_kernels` (its projections can turn to the kernels: `draft_kernel`; counted 0
    otherwise: tuned, but saving nothing). One shape per (name, rows), its counts summed; the
    search times a size once however many shapes share it."""
    out = [ProjectionShape(s.name, s.m, s.n, s.k, s.count)
           for s in projection_shapes(target, batch * tree_nodes, system.kernel_lm_head)]
    buckets = range(PREFILL_BUCKET, MAX_ROWS + 1, PREFILL_BUCKET)
    for rows in buckets:
        out += [ProjectionShape(f"{s.name}@prefill", s.m, s.n, s.k, 0)
                for s in projection_shapes(target, batch * rows, system.kernel_lm_head)]
    kind = system.drafter
    if drafter is not None and kind in DRAFTER_MODELS and system.speculative and draft_forwards:
        weights, on = drafter_weights(kind, drafter), int(drafter_kernels)
        for name, rows, forwards in drafter_round(kind, system, batch, draft_forwards):
            n, k, calls = weights[name]
            out.append(ProjectionShape(f"drafter.{name}", rows, n, k, calls * forwards * on))
        for rows in buckets:
            out += [ProjectionShape(f"drafter.{name}@prefill", batch * rows, n, k, 0)
                    for name, (n, k, _) in weights.items()]
    merged: dict[tuple[str, int], ProjectionShape] = {}
    for s in out:
        key = (s.name, s.m)
        merged[key] = replace(merged[key], count=merged[key].count + s.count) if key in merged else s
    return list(merged.values())


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
                   every=False) -> dict:
    """A tuned table: `existing` ({(format, m, n, k): choice}) plus the improvements (`every`, a bool
    or a predicate on shapes: each such shape's best, improved or not, as a model on cuBLAS turning
    to the kernels needs: a shape without an entry would run the untuned heuristic instead of the
    cuBLAS it ran)."""
    entries: dict = dict(existing)
    needs = every if callable(every) else (lambda shape: every)
    for t in timings:
        if t.improved or needs(t.shape):
            entries[(fmt, m_bucket(t.shape.m), t.shape.n, t.shape.k)] = choice_of(t.best)
    return tuned_document(device_name, entries, written_by="specpilot.loop.agents.kernel")


def shape_key(fmt: str, shape: ProjectionShape) -> tuple[str, int, int, int]:
    """The table key a shape's choice is stored under: (format, M bucket, N, K)."""
    return (fmt, m_bucket(shape.m), shape.n, shape.k)


def read_searched(slug: str) -> dict:
    """{table key: its record (`record_searched`)}: the shapes searched in full without a gain."""
    doc = user_cache.read_document(user_cache.searched_path(slug)) or {"entries": []}
    return {user_cache.entry_key(e): e for e in doc["entries"]}


def record_searched(slug: str, fmt: str, timings: list[ShapeTiming]) -> None:
    """Add the shapes searched in full that nothing beat by MIN_SPEEDUP to the record."""
    new = [{"format": fmt, "m": m_bucket(t.shape.m), "n": t.shape.n, "k": t.shape.k, "today": t.current,
            "today_us": t.current_us, "best": t.best, "best_us": t.best_us, "configs": t.tried}
           for t in timings if t.complete and not t.improved]
    if new:
        path = user_cache.searched_path(slug)
        doc = user_cache.read_document(path) or {"entries": []}
        user_cache.write_document(path, {"entries": user_cache.merged_entries(doc["entries"], new),
                                         "written_by": "specpilot.loop.agents.kernel"})


def own_entries(system: System, slug: str) -> dict:
    """{(format, m, n, k): choice} of the system's own table (`kernel_table`), {} without one."""
    if not system.kernel_table:
        return {}
    doc = user_cache.read_document(user_cache.resolve(system.kernel_table, slug)) or {"entries": []}
    return {user_cache.entry_key(e): entry_choice(e) for e in doc["entries"]}


def promote_table(previous: System, promoted: System, device_name: str) -> Path | None:
    """When a promotion brings a new `kernel_table`, merge it into the user cache of the GPU and
    these versions (so later runs start from it); returns the cache file, else None."""
    if not promoted.kernel_table or promoted.kernel_table == previous.kernel_table:
        return None
    slug = device_slug(device_name)
    return user_cache.promote(user_cache.resolve(promoted.kernel_table, slug), slug)


def own_drafter(session, kind: DrafterKind):
    """The session's model of drafter `kind` (a draft model, an EAGLE-3 head, a DFlash drafter);
    None for the others, or where the session holds none."""
    return getattr(session, DRAFTER_MODELS[kind], None) if kind in DRAFTER_MODELS else None


def projection_weight(models, n: int, k: int):
    """The first [n, k] weight among the models' blocks' projections, lm_heads and feature fusions
    (`fc`), in order (target first): a shape's weights to time it on."""
    from specpilot.models.transformer import decoder_blocks, projection_names

    for model in models:
        projections = [block.get_submodule(name) for _, block in decoder_blocks(model)
                       for name in projection_names(block)]
        heads = [getattr(model, name, None) for name in ("lm_head", "fc")]
        for module in projections + heads:
            if module is not None and tuple(module.weight.shape) == (n, k):
                return module.weight
    raise KeyError(f"no projection weight of shape [{n}, {k}]")


def is_drafter_shape(shape: ProjectionShape) -> bool:
    return shape.name.startswith("drafter.")


class GpuKernelBench:
    """Real timings on the loop's GPU, on the deployment's own weights (W12-encoded if `w12`);
    today's choice as the dispatcher makes it under the incumbent's `table`, or cuBLAS where that
    model runs it (`cublas`: the target's projections; `draft_cublas`: the drafter's)."""

    def __init__(self, target, drafter, w12: bool, bandwidth_gbps: float, table: str = "", cublas: bool = False,
                 draft_cublas: bool = True):
        from specpilot.kernels.dispatch import device_name
        from specpilot.kernels.launch import sm_count
        from specpilot.kernels.timing import GraphTimer

        self.models = [m for m in (target, drafter) if m is not None]
        self.table, self.cublas, self.draft_cublas = table, cublas, draft_cublas
        self.weight_format = WeightFormat.W12 if w12 else WeightFormat.DENSE
        self.bandwidth = bandwidth_gbps * 1e9  # bytes moved per second, as the cost model counts it
        self.device = target.device
        self.device_name = device_name(target.device)
        self.sm_count = sm_count(target.device)
        self._weights: dict[tuple[int, int], list] = {}
        self._timer = GraphTimer(lambda p: self._weight_sets(p.n, p.k), self._input)

    def _weight_sets(self, n: int, k: int) -> list:
        """The model's [n, k] weight (W12-encoded for a W12 bench) and copies of it, together
        beyond L2 (`timing.weight_sets`): each call reads its weight from HBM, as in a forward,
        whatever the weight's size."""
        import torch

        from specpilot.kernels.timing import copies, weight_sets

        if (n, k) not in self._weights:
            w = projection_weight(self.models, n, k).detach().to(torch.bfloat16)
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

        if self.draft_cublas if is_drafter_shape(shape) else self.cublas:
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


def timed_table(evaluations, incumbent: str, own_table: str):
    """The latest evaluation (a `MemoryRecord`) of a candidate with a kernel table of its own timed
    against the incumbent with hash `incumbent` (whose own table is `own_table`), None if none."""
    return next((r for r in evaluations if r.incumbent == incumbent and r.gain is not None
                 and r.candidate.knobs.get("kernel_table", "") not in ("", own_table)), None)


@register("kernel")
class KernelAgent(Proposer):
    def status(self, setup: LoopSetup) -> AgentStatus:
        if setup.device != "cuda":
            return AgentStatus(False, f"it tunes Triton GPU kernels and candidates here run on {setup.device}")
        if importlib.util.find_spec("triton") is None:
            return AgentStatus(False, "Triton is not installed (pip install 'specpilot[triton]')")
        return AgentStatus(True, f"tunes projection kernels for {setup.device_name} "
                                 f"(tables in {user_cache.device_dir(device_slug(setup.device_name))})")

    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        session = ctx.models
        if session is None:
            return []
        system = ctx.incumbent.candidate.system
        bench = GpuKernelBench(session.target, own_drafter(session, system.drafter), system.w12,
                               ctx.cost.profile.bandwidth_gbps, system.kernel_table, system.kernel is Kernel.CUBLAS,
                               system.draft_kernel is Kernel.CUBLAS)
        return self.propose_with(ctx, bench)

    def propose_with(self, ctx: ProposerContext, bench) -> list[Proposal]:
        """The proposal from a given bench (the GPU one, or a simulated one in tests)."""
        inc = ctx.incumbent.candidate
        earlier = timed_table(ctx.recall.evaluations, inc.hash, inc.system.kernel_table)
        if earlier is not None:
            ctx.log(f"kernel: a tuned table was timed against this incumbent already ({earlier.gain:+.1%}, "
                    f"{earlier.verdict.value}, entry {earlier.id}): none again until the incumbent changes")
            return []
        profile = ctx.cost.profile
        kind = inc.system.drafter
        drafter = own_drafter(ctx.models, kind)
        # the drafter's projections save time when the kernels can take them: plain weights (a
        # bench of the target's W12 planes times no BF16 drafter shape)
        drafts = drafter is not None and bench.weight_format is WeightFormat.DENSE
        shapes = deployment_shapes(ctx.models.target.config, drafter, inc.system, profile.batch,
                                   profile.tree_nodes, profile.draft_forwards, drafts)
        slug = device_slug(bench.device_name)
        fmt = bench.weight_format.value
        today = {s: choice_dict(bench.current(s)) for s in shapes}
        searched = read_searched(slug)
        done = [s for s in shapes if searched.get(shape_key(fmt, s), {}).get("today") == today[s]]
        if done:
            ctx.log(f"kernel: {len(done)} of {len(shapes)} shape(s) searched in full before on this GPU and these "
                    f"versions, with the choice they run today, nothing {MIN_SPEEDUP - 1:.0%} faster: not searched "
                    f"again ({user_cache.searched_path(slug)})")
        timings = tune([s for s in shapes if s not in done], bench, self.options.kernel_budget_s, ctx.log)
        record_searched(slug, fmt, timings)
        better = [t for t in timings if t.improved]
        saved_us = sum(t.saving_us for t in better)
        if not better or saved_us * 1e-3 < 0.005 * ctx.cost.round_ms:
            ctx.log(f"kernel: nothing beats today's choice by {MIN_SPEEDUP - 1:.0%} where it matters")
            return []
        # the kernels for the target where one of its shapes that run every round gained (or it runs
        # them already), for the draft model where one of its did
        gained = {is_drafter_shape(t.shape) for t in better if t.saving_us}  # True: a draft model's shape
        target = False in gained or inc.system.kernel is Kernel.TRITON
        draft = True in gained or inc.system.draft_kernel is Kernel.TRITON

        def every(shape: ProjectionShape) -> bool:
            """Its model turns from cuBLAS to the kernels: each of its shapes needs its best."""
            if is_drafter_shape(shape):
                return draft and inc.system.draft_kernel is Kernel.CUBLAS
            return target and inc.system.kernel is Kernel.CUBLAS

        kept = {shape_key(fmt, s): choice_of(searched[shape_key(fmt, s)]["best"]) for s in done if every(s)}
        document = table_document(bench.device_name, fmt, {**kept, **own_entries(inc.system, slug)}, timings, every)
        digest = hashlib.sha256(json.dumps(document["entries"], sort_keys=True).encode()).hexdigest()[:8]
        table_id = f"{fmt}-{digest}"  # by content: a table judged before is the same candidate, not timed again
        path = user_cache.write_document(user_cache.candidate_path(slug, table_id), document)
        system = inc.system.with_changes(kernel=Kernel.TRITON if target else inc.system.kernel,
                                         draft_kernel=Kernel.TRITON if draft else inc.system.draft_kernel,
                                         kernel_table=table_id, name=f"kernel:tuned-{ctx.round_label}")
        shapes_text = ", ".join(f"{t.shape.name}@{t.shape.m} {t.current_us:.0f}->{t.best_us:.0f} us"
                                for t in sorted(better, key=lambda t: -t.saving_us)[:4])
        why = (f"tuned kernels for {len(better)} projection shape(s) ({shapes_text}): "
               f"{saved_us:.0f} us less per round of {ctx.cost.round_ms * 1e3:.0f} us")
        gap = GapKind.VERIFY_KERNELS if any(not is_drafter_shape(t.shape) for t in better) else GapKind.DRAFT_KERNELS
        return [Proposal(self.name, Candidate(system, inc.patch, inc.workdir), why, gap, None,
                         {"timings": [t.to_dict() for t in timings], "table": str(path)})]
