"""The kernel agent: tunes launch configurations of the projections furthest from their byte floor.

GPU only. Each round, for the target's projections at the incumbent's verify shape (M = batch x
tree nodes rows; qkv, o, gate_up, down per block, and lm_head when it runs through the kernels) it

1. times the configuration the dispatcher picks today (`kernels.configs.choose_config`: the
   device's tuned table, else the heuristic) and computes the byte floor (weights + activations in
   and out / the measured bandwidth), so each shape's excess = (time - floor) x calls per forward;
2. in order of excess, largest first, runs the package's config search on each shape
   (`kernels.search.tune`: the candidate configs and the phases that vary the fastest; each config
   checked against the reference within `kernels.reference.error_bound` before it is timed) on
   the target's own weights (W12-encoded when the incumbent runs W12), while `kernel_budget_s`
   lasts; today's config ranks with the candidates and is timed again after the search, its
   faster timing counting, so that a slow first timing never passes for a gain;
3. keeps the configurations at least `MIN_SPEEDUP` faster than today's choice, merges them into
   the device's tuned table, and proposes that table as a patch: a worktree whose
   `specpilot/kernels/tuned/<device>.json` holds it (the dispatcher reads tables from the package,
   so the candidate's workers see it), with `kernel = "triton"`.
Timings are `kernels.timing.GraphTimer`'s: CUDA-graph replays, as the engine runs the kernels.

On CPU (or without Triton, or outside a git checkout) it is off, and says so once. Today's config,
the floor and the timer sit behind a small interface (`KernelBench`), so the ranking, selection
and table are tested on CPU with a simulated bench.

Owns: choosing shapes and keeping improvements. Does not own the search, the kernels or their
configs' meaning (`specpilot.kernels`), or judging the candidate (guard, controller).
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass
from typing import Protocol

from specpilot.config import Kernel
from specpilot.kernels.configs import LaunchConfig, WeightFormat, m_bucket
from specpilot.kernels.search import OutOfBudget, Problem, SearchSettings, Trial, tuned_document
from specpilot.kernels.search import tune as search
from specpilot.loop.agents.base import AgentStatus, LoopSetup, Proposal, Proposer, ProposerContext, register
from specpilot.loop.cost_model import GapKind
from specpilot.loop.systems import Candidate
from specpilot.loop.worktree import WorktreeError

MIN_SPEEDUP = 1.03  # a tuned config must beat today's choice by 3% to enter the table
TABLE_DIR = "specpilot/kernels/tuned"  # where the dispatcher reads tuned tables (kernels/configs.py)


@dataclass(frozen=True)
class ProjectionShape:
    name: str  # "qkv", "o", "gate_up", "down", "lm_head"
    m: int  # rows (tokens of the batch in one verify forward)
    n: int  # output features
    k: int  # input features
    count: int  # calls per target forward (layers, or 1 for lm_head)


@dataclass(frozen=True)
class ShapeTiming:
    shape: ProjectionShape
    floor_us: float
    current: dict  # LaunchConfig.to_dict() of today's choice
    current_us: float
    best: dict  # the fastest correct config (today's where none beat it)
    best_us: float
    tried: int  # configs the search timed besides today's

    @property
    def excess_us(self) -> float:
        """Time above the byte floor per forward, all calls of this shape."""
        return max(self.current_us - self.floor_us, 0.0) * self.shape.count

    @property
    def saving_us(self) -> float:
        return max(self.current_us - self.best_us, 0.0) * self.shape.count

    @property
    def improved(self) -> bool:
        return self.current_us >= MIN_SPEEDUP * self.best_us

    def to_dict(self) -> dict:
        return {"shape": self.shape.__dict__, "floor_us": self.floor_us, "current": self.current,
                "current_us": self.current_us, "best": self.best, "best_us": self.best_us, "tried": self.tried}


class KernelBench(Protocol):
    """Today's config and the byte floor of a projection shape, and a `kernels.search.Timer`."""

    device_name: str
    weight_format: WeightFormat  # of the weights it times
    sm_count: int

    def current(self, shape: ProjectionShape) -> LaunchConfig: ...  # what the dispatcher picks today

    def floor_us(self, shape: ProjectionShape) -> float: ...

    def time(self, problem: Problem, config: LaunchConfig) -> Trial: ...  # checked, then timed


def projection_shapes(config, rows: int, lm_head: bool) -> list[ProjectionShape]:
    """The target's projections (a `models.config.ModelConfig`) at `rows` rows."""
    C, I, L = config.hidden_size, config.intermediate_size, config.num_layers
    H, Hkv, D = config.num_heads, config.num_kv_heads, config.head_dim
    out = [ProjectionShape("qkv", rows, (H + 2 * Hkv) * D, C, L), ProjectionShape("o", rows, C, H * D, L),
           ProjectionShape("gate_up", rows, 2 * I, C, L), ProjectionShape("down", rows, C, I, L)]
    if lm_head:
        out.append(ProjectionShape("lm_head", rows, config.vocab_size, C, 1))
    return out


def tune(shapes: list[ProjectionShape], bench: KernelBench, budget_s: float,
         log=lambda line: None) -> list[ShapeTiming]:
    """Rank shapes by excess over their floor, then search their configs in that order within the
    budget (`kernels.search.tune`; a shape reached after the budget keeps today's config)."""
    start = time.monotonic()
    problem = {s: Problem(bench.weight_format, s.n, s.k, s.m) for s in shapes}
    baseline = []  # (shape, today's config, its first timing, floor µs)
    for s in shapes:
        cur = bench.current(s)
        first = bench.time(problem[s], cur)
        if first.us is not None:
            baseline.append((s, cur, first, bench.floor_us(s)))
    baseline.sort(key=lambda b: -(b[2].us - b[3]) * b[0].count)
    known: dict[Problem, list[Trial]] = {}
    for s, _, first, _ in baseline:
        known.setdefault(problem[s], [first])  # two shapes of one size are searched once
    settings = SearchSettings(budget_s=budget_s, sm_count=bench.sm_count, out_of_budget=OutOfBudget.SKIP)
    found = {r.problem: r for r in search(list(known), bench.time, settings, known=known, started=start)}
    out = []
    for s, cur, first, floor in baseline:
        result = found[problem[s]]
        best = result.best or first
        best_cfg, best_us, cur_us = best.config, best.us, first.us
        # today's config once more: its first timing can be a transient (on a GPU that has just
        # been idle, several times the next one) and must not pass for a gain of the tuned table
        again = bench.time(problem[s], cur).us
        if again is not None and again < cur_us:
            cur_us = again
            if again <= best_us:
                best_cfg, best_us = cur, again
        tried = len(result.tried) - len(known[problem[s]])
        out.append(ShapeTiming(s, floor, cur.to_dict(), cur_us, best_cfg.to_dict(), best_us, tried))
        log(f"kernel: {s.name} M={s.m} N={s.n} K={s.k}: {cur_us:.1f} us today (floor {floor:.1f}), "
            f"best {best_us:.1f} us over {tried} configs")
    return out


def table_document(device_name: str, fmt: str, existing: dict, timings: list[ShapeTiming]) -> dict:
    """The device's tuned table: `existing` ({(format, m, n, k): LaunchConfig}) plus the improvements."""
    entries: dict = dict(existing)
    for t in timings:
        if t.improved:
            entries[(fmt, m_bucket(t.shape.m), t.shape.n, t.shape.k)] = t.best
    return tuned_document(device_name, entries, written_by="specpilot.loop.agents.kernel")


class GpuKernelBench:
    """Real timings on the loop's GPU, on the target's own weights (W12-encoded if `w12`)."""

    def __init__(self, target, w12: bool, bandwidth_gbps: float):
        from specpilot.kernels.dispatch import device_name
        from specpilot.kernels.launch import sm_count
        from specpilot.kernels.timing import GraphTimer

        self.target = target
        self.weight_format = WeightFormat.W12 if w12 else WeightFormat.DENSE
        self.bandwidth = bandwidth_gbps * 1e9  # bytes moved per second, as the cost model counts it
        self.device_name = device_name(target.device)
        self.sm_count = sm_count(target.device)
        self._weights: dict[tuple[int, int], object] = {}
        self._timer = GraphTimer(lambda p: [self._weight(p.n, p.k)], self._input)

    def _weight(self, n: int, k: int):
        """The target's [n, k] projection weight of the first block (or the lm_head)."""
        import torch

        if (n, k) not in self._weights:
            block = self.target.layers[0]
            modules = (block.self_attn.qkv_proj, block.self_attn.o_proj, block.mlp.gate_up_proj,
                       block.mlp.down_proj, self.target.lm_head)
            module = next(m for m in modules if tuple(m.weight.shape) == (n, k))
            w = module.weight.detach().to(torch.bfloat16)
            if self.weight_format is WeightFormat.W12:
                from specpilot.w12 import encode

                w = encode(w)
            self._weights[n, k] = w
        return self._weights[n, k]

    def _input(self, p: Problem):
        import torch

        g = torch.Generator(device="cpu").manual_seed(p.m * 7919 + p.k)
        return torch.randn(p.m, p.k, generator=g).to(self.target.device, torch.bfloat16)  # [M, K]

    def current(self, shape: ProjectionShape) -> LaunchConfig:
        from specpilot.kernels.configs import choose_config

        return choose_config(self.weight_format, shape.m, shape.n, shape.k, self.device_name)

    def floor_us(self, shape: ProjectionShape) -> float:
        weight_bytes = shape.n * shape.k * (1.5 if self.weight_format is WeightFormat.W12 else 2.0)
        act_bytes = 2 * shape.m * (shape.k + shape.n)
        return (weight_bytes + act_bytes) / self.bandwidth * 1e6

    def time(self, problem: Problem, config: LaunchConfig) -> Trial:
        return self._timer(problem, config)


@register("kernel")
class KernelAgent(Proposer):
    def status(self, setup: LoopSetup) -> AgentStatus:
        if setup.device != "cuda":
            return AgentStatus(False, f"it tunes Triton GPU kernels and candidates here run on {setup.device}")
        if importlib.util.find_spec("triton") is None:
            return AgentStatus(False, "Triton is not installed (pip install 'specpilot[triton]')")
        if setup.checkout is None:
            return AgentStatus(False, "tuned tables ship inside the package: it needs a git checkout for worktrees")
        return AgentStatus(True, f"tunes projection launch configs for {setup.device_name}")

    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        session = ctx.models
        if session is None or ctx.setup.checkout is None:
            return []
        inc = ctx.incumbent.candidate
        bench = GpuKernelBench(session.target, inc.system.w12, ctx.cost.profile.bandwidth_gbps)
        return self.propose_with(ctx, bench)

    def propose_with(self, ctx: ProposerContext, bench) -> list[Proposal]:
        """The proposal from a given bench (the GPU one, or a simulated one in tests)."""
        from specpilot.kernels.configs import device_slug, tuned_table

        inc = ctx.incumbent.candidate
        target_config = ctx.models.target.config
        rows = ctx.cost.profile.batch * ctx.cost.profile.tree_nodes
        shapes = projection_shapes(target_config, rows, inc.system.kernel_lm_head)
        timings = tune(shapes, bench, self.options.kernel_budget_s, ctx.log)
        better = [t for t in timings if t.improved]
        saved_us = sum(t.saving_us for t in better)
        if not better or saved_us * 1e-3 < 0.005 * ctx.cost.verify_ms:
            ctx.log(f"kernel: no launch config beats today's choice by {MIN_SPEEDUP - 1:.0%} where it matters")
            return []
        slug = device_slug(bench.device_name)
        document = table_document(bench.device_name, bench.weight_format.value, tuned_table(slug), timings)
        path = ctx.setup.scratch / f"kernel-{ctx.round_label.replace('/', '-')}"
        try:
            wt = ctx.setup.checkout.create(path)
            wt.apply(inc.patch or "")
            table = wt.path / TABLE_DIR / f"{slug}.json"
            table.parent.mkdir(parents=True, exist_ok=True)
            table.write_text(json.dumps(document, indent=1) + "\n")
            patch = wt.diff()
        except WorktreeError as err:
            ctx.log(f"kernel: cannot write the table into a worktree: {err}")
            return []
        system = inc.system.with_changes(kernel=Kernel.TRITON, name=f"kernel:tuned-{ctx.round_label}")
        shapes_text = ", ".join(f"{t.shape.name} {t.current_us:.0f}->{t.best_us:.0f} us" for t in better[:4])
        why = (f"tuned launch configs for {len(better)} projection shape(s) at M={rows} ({shapes_text}): "
               f"{saved_us:.0f} us less per verify forward of {ctx.cost.verify_ms * 1e3:.0f} us")
        return [Proposal(self.name, Candidate(system, patch, str(wt.path)), why, GapKind.VERIFY_KERNELS, None,
                         {"timings": [t.to_dict() for t in timings], "table": f"{TABLE_DIR}/{slug}.json"})]
