"""The kernel agent: tunes the projections of the deployment's own shapes, furthest from their floor.

GPU only. Each round it takes the projections the incumbent runs, at the row counts it runs them
(`engine.round_shapes.deployment_shapes`), less those searched before (below), and tunes them on
the deployment's own weights (W12-encoded when the incumbent runs W12) while `kernel_budget_s`
lasts (`kernels.shape_tuning.tune`: today's choice against its byte floor, the config search and
the cuBLAS fallbacks, largest excess first). Then it

1. records each shape searched in full (every config and fallback timed) that nothing beat, with
   the choice it ran, in the user cache (`user_cache.searched_path`: per GPU and versions); later
   rounds and runs skip a recorded shape while it runs that choice, so a round on shapes already
   searched costs no search;
2. keeps the choices at least `MIN_SPEEDUP` faster than today's and writes them, over the
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

On an FP8 target (`ProposerContext.fp8_target`) the target's block projections are left out (the
FP8 kernels run them, `kernels.fp8_dispatch`): it tunes the drafter's shapes, and the BF16 lm_head
where the incumbent routes it through the kernels.

On CPU (or without Triton) it is off, and says so once. The timings sit behind a small interface
(`kernels.shape_tuning.KernelBench`), so the selection and the table are tested on CPU with a
simulated bench.

Owns: which shapes to search, keeping improvements, writing and promoting the candidate's table.
Does not own the shapes a round runs (`engine.round_shapes`), timing and ranking them
(`kernels.shape_tuning`), the search, the kernels, their configs' meaning or the cache's layout
(`specpilot.kernels`), or judging the candidate (guard, controller).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from functools import partial
from pathlib import Path

from specpilot.config import DRAFTER_MODELS, DrafterKind, Kernel, System
from specpilot.engine.round_shapes import deployment_shapes, is_drafter_shape, projection_weight
from specpilot.kernels import user_cache
from specpilot.kernels.configs import WeightFormat, device_slug, entry_choice, m_bucket
from specpilot.kernels.shape_tuning import (
    MIN_SPEEDUP,
    GpuKernelBench,
    ProjectionShape,
    ShapeTiming,
    choice_dict,
    choice_of,
    table_document,
    tune,
)
from specpilot.loop.agents.base import AgentStatus, LoopSetup, Proposal, Proposer, ProposerContext, register
from specpilot.loop.cost_model import GapKind
from specpilot.loop.systems import Candidate


def shape_key(fmt: str, shape: ProjectionShape) -> tuple[str, int, int, int]:
    """The table key a shape's choice is stored under: (format, M bucket, N, K)."""
    return (fmt, m_bucket(shape.m), shape.n, shape.k)


def fp8_projection(shape: ProjectionShape) -> bool:
    """A block projection of the target (not the drafter's, not the lm_head): on an FP8 target an
    `FP8Linear`, which the FP8 kernels run and the projection kernels never do."""
    return not is_drafter_shape(shape) and not shape.name.startswith("lm_head")


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
        models = [m for m in (session.target, own_drafter(session, system.drafter)) if m is not None]

        def cublas(shape: ProjectionShape) -> bool:
            """The shape's model runs cuBLAS today (the target's `kernel`, the drafter's `draft_kernel`)."""
            return (system.draft_kernel if is_drafter_shape(shape) else system.kernel) is Kernel.CUBLAS

        bench = GpuKernelBench(partial(projection_weight, models), session.target.device, system.w12,
                               ctx.cost.profile.bandwidth_gbps, system.kernel_table, cublas)
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
        # bench of the target's W12 planes times no BF16 drafter shape), and not in the draft model's
        # fused layers (draft_kernel = "fused": no table kernel runs them)
        drafts = (drafter is not None and bench.weight_format is WeightFormat.DENSE
                  and inc.system.draft_kernel is not Kernel.FUSED)
        shapes = deployment_shapes(ctx.models.target.config, drafter, inc.system, profile.batch,
                                   profile.tree_nodes, profile.draft_forwards, drafts)
        if ctx.fp8_target:
            shapes = [s for s in shapes if not fp8_projection(s)]
            ctx.log("kernel: the target is FP8: its projections run the FP8 kernels, not these; only the "
                    "drafter's shapes and a BF16 lm_head are tuned")
            if not shapes:
                return []
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
        document = table_document(bench.device_name, fmt, {**kept, **own_entries(inc.system, slug)}, timings, every,
                                  written_by=__name__)
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
