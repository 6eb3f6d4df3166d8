"""The knob agent: searches the engine's settings, guided by the cost model and the memory.

A deterministic, gap-directed local search around the incumbent (no optimiser dependency: the
candidates are few and each costs a paired timing, so the search spends its effort on ranking).
Each round it proposes, best first:

1. *Memory seeds*: changes validated (promoted) on similar deployments, most similar first
   (`Memory.similar_validated`), applied to the incumbent — knowledge transfers before search.
2. *Predicted moves*, ranked by the cost model's estimated ms/token (`CostTable.
   predict_ms_per_token`, measured costs + the fitted acceptance model): tree shapes within two
   steps of the incumbent's (depth +-2, topk one step in 1/2/4/8, node budget two steps on its
   ladder), the model's best shape anywhere, the ceiling's shape, plain AR decoding when it was
   measured faster than drafting, W12 weights on a GPU priced by the cost table's format floors
   (`CostTable.predict_format_ms_per_token`), and each other loaded drafter measured faster
   switched in (`CostTable.switch_ms_per_token`). Only moves predicted faster than the
   measurement are kept, and of shapes predicted alike only the one that drafts the fewest rows
   (`distinct_shapes`); savings the models extrapolate (shapes, formats) are ranked at
   `MODEL_TRUST` of their size against measured ones (AR, drafter switches). Each other drafter
   measured switched in also gets the shape its own table predicts best (`CostTable.switched`).
   From AR, the shapes the last speculative system's table predicts faster.
3. *Exploratory moves*, which the model cannot price, ordered by the size of the gap they target:
   the other drafters (draft model <-> n-gram, and each feature-conditioned drafter the deployment
   loads: EAGLE-3, DFlash, unless measured more than 10% slower switched in), DFlash tree
   constructions and budgets, adaptive depth tiers, the batch mechanisms for a batched regime
   (shared node budget, per-request depth, segment admission), and on GPU CUDA graphs, the
   proposal and the verification compiled (`draft_compile`, `verify_compile`), the draft model on
   the Triton kernels (`draft_kernel`), each attention layer's q/k norm, RoPE and cache write in one
   kernel (`rope_store`), these launch-level moves together (`launch_bundle`: some gain
   less alone than the promotion threshold), the draft model's fused decoder layers (`draft_kernel =
   "fused"`, beside the bundle, which keeps the table kernels), fewer host syncs (`sync_every`), Triton kernels, W12
   weights (where the format floors do not price them), the Triton lm_head, two-level verification
   (`tlv_chain`: an FP8 view's chain beside the tree; not on recurrent or FP8 targets). Under continuous
   batching without segment admission, each drafter switch is also proposed with segment
   admission, ahead of the gap order (`segment_admission`).
Predicted and exploratory moves are interleaved 2:1 so a round times at least one of each when
both exist. Knobs that change nothing on the device are never proposed (on CPU: CUDA graphs,
sync_every, kernel choices and W12), nor, on an FP8 target (`ProposerContext.fp8_target`), W12 or
the Triton kernels without the lm_head: its projections run the FP8 kernels, and the Triton kernels
are explored with its BF16 lm_head instead (`fp8_applies`). A knob move on a patched incumbent
keeps its patch.

The loop drops proposals the memory has already judged, so the search moves outward round by
round as the neighbourhood is used up, and re-centres whenever a move is promoted. An exploratory
change last timed 10% or more slower on an earlier incumbent (e.g. n-gram drafting) is not
proposed again on the next one.

Owns: the move sets, their ranking and their rationale. Does not own predictions (cost model).
"""

from __future__ import annotations

import math
from dataclasses import asdict

from specpilot.config import DRAFTER_MODELS, TLV_DRAFTERS, AttentionKernel, DrafterKind, Kernel, System
from specpilot.errors import ConfigError
from specpilot.kernels.configs import RULE_MAX_M
from specpilot.loop.acceptance import TreeShape
from specpilot.loop.agents.base import Proposal, Proposer, ProposerContext, register
from specpilot.loop.cost_model import BUDGETS, MAX_DEPTH, TOPKS, GapKind, tree_shapes
from specpilot.loop.recall import change_key
from specpilot.loop.systems import DRAFTER_SWITCHES, Candidate, describe, short_name

GPU_ONLY = frozenset({"cuda_graphs", "sync_every", "kernel", "w12", "kernel_lm_head", "kernel_table", "draft_compile",
                      "verify_compile", "attention", "pdl", "draft_kernel", "rope_store"})


def triton_launches(system: System) -> bool:
    """Whether `system` runs Triton kernels that `pdl` could launch early: ours (projections,
    split-KV attention, rope_store) or inductor's (a compiled proposal or verification)."""
    return (system.kernel is Kernel.TRITON or system.attention is AttentionKernel.SPLIT_KV or system.rope_store
            or (system.draft_kernel is Kernel.TRITON and system.drafter in DRAFTER_MODELS)
            or (system.draft_kernel is Kernel.FUSED and system.drafter is DrafterKind.MODEL)
            or system.draft_compile or system.verify_compile)


MIN_PREDICTED_SAVING = 0.005  # a predicted move must be at least 0.5% faster than the measurement
# Savings the acceptance model extrapolates count at this share of their size when ranked against
# measured ones (AR is measured each round): on the fixture, shape moves predicted ~20% faster
# were measured ~9% faster.
MODEL_TRUST = 0.5
EXPLORE_EVERY = 3  # every third proposal is an exploratory one (when there are both kinds)
AR_CLOSE = 1.10  # AR (or a drafter switch) measured within 10% of the incumbent: worth timing directly;
# a drafter switch measured further behind is not explored
ANSWERED_LOSS = 0.10  # an exploratory change last timed this much slower on an earlier incumbent is not repeated


def ar_changes(inc: System) -> dict:
    """The knob changes that make `inc` plain AR (`System.plain_ar`): drafting off, and the knobs
    only speculation reads (segment admission among them, which AR cannot take) back at their defaults."""
    return {knob: new for knob, (_, new) in inc.plain_ar().diff(inc).items()}


def fp8_applies(changes: dict, base: dict) -> bool:
    """Whether knob `changes` to a system with knobs `base` change anything on an FP8 target: not
    W12 (a lossless format of BF16 weights: nothing to encode), and not the Triton projection
    kernels without the lm_head (the FP8 projections keep the FP8 kernels; the BF16 lm_head is all
    `kernel = "triton"` reaches there)."""
    if changes.get("w12"):
        return False
    return changes.get("kernel") != Kernel.TRITON.value or {**base, **changes}["kernel_lm_head"]


def _step(ladder: tuple[int, ...], value: int, steps: int) -> set[int]:
    """Values within `steps` places of `value` on a sorted ladder (value itself included)."""
    points = sorted(set(ladder) | {value})
    i = points.index(value)
    return set(points[max(0, i - steps): i + steps + 1])


@register("knob")
class KnobAgent(Proposer):
    def propose(self, ctx: ProposerContext) -> list[Proposal]:
        inc = ctx.incumbent.candidate
        if ctx.on_gpu and ctx.fp8_target:
            ctx.log("knob: no W12 or Triton projection moves: the target is FP8, its projections run the FP8 "
                    "kernels (W12 encodes BF16 weights); the Triton kernels only with the BF16 lm_head")
        seeds = self._memory_seeds(ctx)
        predicted = self._predicted(ctx)
        priced = {p.hash for p in predicted}
        explore = [p for p in self._exploratory(ctx) if p.hash not in priced]  # e.g. W12, when priced
        ordered = seeds + interleave(predicted, explore, EXPLORE_EVERY)
        # The cap counts only proposals the memory has not judged: the loop drops judged ones (and
        # says so); a cap applied before that would keep proposing the same first few moves and
        # never reach those further down the list.
        out, seen, fresh, cap = [], {inc.hash}, 0, max(6 * ctx.limit, 12)
        for p in ordered:
            if p.hash in seen:
                continue
            seen.add(p.hash)
            if ctx.recall.verdict(p.hash) is None:
                if fresh == cap:
                    continue
                fresh += 1
            out.append(p)
        return out

    # ---- building candidates ------------------------------------------------------------------
    def _candidate(self, ctx: ProposerContext, changes: dict) -> Candidate | None:
        """The incumbent with `changes` (plain JSON knob values), or None if invalid or pointless here."""
        inc = ctx.incumbent.candidate
        base = inc.system.knobs()
        changes = {k: v for k, v in changes.items() if k in base and base[k] != v}
        if not changes:
            return None
        if not ctx.on_gpu and (set(changes) <= GPU_ONLY or changes.get("kernel") == Kernel.TRITON.value):
            return None
        if ctx.fp8_target and not fp8_applies(changes, base):
            return None
        deepest = max((changes.get("depth", base["depth"]), *changes.get("adaptive_depth", base["adaptive_depth"])))
        if base["draft_window"] and base["draft_window"] < deepest + 1:  # a deeper tree: the window follows it
            changes["draft_window"] = 0
        try:
            system = System.from_dict({**base, **changes}, name="candidate")
        except ConfigError:
            return None
        name = short_name(self.name, {k: [base[k], v] for k, v in changes.items()})
        return Candidate(system.with_changes(name=name), inc.patch, inc.workdir)

    def _proposal(self, ctx, changes, gap, rationale, predicted=None, **details) -> Proposal | None:
        cand = self._candidate(ctx, changes)
        if cand is None:
            return None
        return Proposal(self.name, cand, rationale, gap, predicted, details)

    # ---- 1. memory seeds --------------------------------------------------------------------------
    def _memory_seeds(self, ctx: ProposerContext) -> list[Proposal]:
        out = []
        for similarity, record in ctx.recall.similar:
            if record.candidate.patch or not record.candidate.diff:
                continue  # code changes are the integration agent's; an empty diff says nothing
            changes = {k: new for k, (_, new) in record.candidate.diff.items()}
            gain = f"{record.gain:+.1%}" if record.gain is not None else "n/a"
            why = (f"validated on {record.deployment_name} (similarity {similarity:.2f}, entry {record.id}): "
                   f"{describe(record.candidate.diff)}, gain {gain}")
            p = self._proposal(ctx, changes, None, why, None, source_entry=record.id, similarity=similarity)
            if p is not None:
                out.append(p)
        return out

    # ---- 2. predicted moves -----------------------------------------------------------------------
    def _predicted(self, ctx: ProposerContext) -> list[Proposal]:
        cost, inc = ctx.cost, ctx.incumbent.candidate.system
        measured = cost.ms_per_token
        moves: list[tuple[float, Proposal]] = []

        def consider(shape: TreeShape | None, changes: dict, why: str) -> None:
            t = cost.predict_ms_per_token(shape)
            if math.isfinite(t) and t < measured * (1 - MIN_PREDICTED_SAVING):
                gap = self._gap_of(ctx, shape)
                modelled = shape is not None or cost.ar_ms_per_token is None
                text = (f"{why}: {'predicted' if modelled else 'measured'} {t:.3f} ms/token vs {measured:.3f} "
                        f"measured ({1 - t / measured:.0%} less)")
                p = self._proposal(ctx, changes, gap, text, t, shape=asdict(shape) if shape else None)
                if p is not None:
                    moves.append((rank_key(measured, t, modelled), p))

        shaped = inc.drafter not in (DrafterKind.NONE, DrafterKind.DFLASH)  # DFlash has no depth/topk shape
        if shaped and cost.shape is not None and cost.acceptance is not None:
            here = cost.shape
            shapes = {TreeShape(d, k, b)
                      for d in range(max(1, here.depth - 2), min(MAX_DEPTH, here.depth + 2) + 1)
                      for k in _step(TOPKS, here.topk, 1)
                      for b in _step(BUDGETS, here.budget, 2)}
            best = min(tree_shapes(MAX_DEPTH), key=cost.predict_ms_per_token)
            shapes |= {best} | ({cost.ceiling_shape} if cost.ceiling_shape else set())
            for s in distinct_shapes(cost, [s for s in shapes if s != here and s.budget <= s.num_candidates]):
                consider(s, {"depth": s.depth, "topk": s.topk, "tree_budget": s.budget},
                         f"tree {here.label()} -> {s.label()}")
            consider(None, ar_changes(inc), "plain AR decoding (drafting does not pay here)")
        elif inc.drafter is DrafterKind.NONE:
            self._reenter(ctx, moves)
        if shaped and cost.shape is not None:
            self._switched_shapes(ctx, moves)
        if ctx.on_gpu and not inc.w12 and not ctx.fp8_target:  # no W12 floor to ask for an FP8 target
            self._format_move(ctx, moves)
        served = segment_admission(ctx.deployment.regime, inc)
        for kind, t in sorted(cost.switch_ms_per_token.items()):  # measured: ranked at full trust, like AR
            if kind in SWITCHES_BY_NAME and math.isfinite(t) and t < measured * (1 - MIN_PREDICTED_SAVING):
                gap, changes, why = SWITCHES_BY_NAME[kind]
                if served:  # timed as it would serve (see `segment_admission`); the plain switch is explored
                    changes = {**changes, **served}
                    why = f"{why}, with segment admission ({SERVED_WHY}); the switch alone"
                p = self._proposal(ctx, changes, gap, f"{why}: measured {t:.3f} ms/token vs {measured:.3f} "
                                   f"({1 - t / measured:.0%} less)", t)
                if p is not None:
                    moves.append((rank_key(measured, t, False), p))
        moves.sort(key=lambda m: (m[0], m[1].candidate.name))
        return [p for _, p in moves]

    def _format_move(self, ctx: ProposerContext, moves: list) -> None:
        """W12 weights, priced by the cost table's format floors (`CostTable.predict_format_ms_per_token`:
        the verify forward at today's distance from its floor, with 12.01 bits per weight); not once
        the same change was last timed without a gain on an earlier incumbent (the kernels did not
        keep that distance), where the exploratory moves may still time it again. Not where
        verification runs more than RULE_MAX_M rows: there W12 takes cuBLAS on a decoded copy
        (BF16's bytes) unless a tuned table chose its kernels, so the floors promise nothing."""
        cost, inc = ctx.cost, ctx.incumbent.candidate.system
        rows = cost.profile.tree_nodes * cost.profile.batch
        if rows > RULE_MAX_M:
            ctx.log(f"knob: W12 not priced by the format floors: verification runs {rows} rows, where W12 "
                    f"takes cuBLAS on a decoded copy (BF16's bytes) unless a tuned table chose its kernels")
            return
        t, measured = cost.predict_format_ms_per_token("w12"), cost.ms_per_token
        if not (math.isfinite(t) and t < measured * (1 - MIN_PREDICTED_SAVING)):
            return  # e.g. a verify forward bound by compute: fewer bytes do not shorten it
        triton = inc.kernel is Kernel.TRITON
        changes = {"w12": True} if triton else {"kernel": Kernel.TRITON.value, "w12": True}
        timed = ctx.recall.slower_changes(0.0).get(change_key(changes))
        if timed is not None:  # the floors' estimate held no gain there: left to the exploratory moves
            ctx.log(f"knob: not pricing {describe(timed.candidate.diff)} by the format floors again: "
                    f"{timed.gain:+.1%} on an earlier incumbent (entry {timed.id})")
            return
        floor = cost.format_floor("w12").verify_floor_ms
        why = (f"W12 weights (12.01 bits, lossless){'' if triton else ' under the Triton kernels'}: verify floor "
               f"{cost.verify_floor:.3f} -> {floor:.3f} ms; predicted {t:.3f} ms/token vs {measured:.3f} measured "
               f"({1 - t / measured:.0%} less) at today's distance from the floor")
        p = self._proposal(ctx, changes, GapKind.VERIFY_KERNELS, why, t, format="w12")
        if p is not None:
            moves.append((rank_key(measured, t, True), p))

    def _switched_shapes(self, ctx: ProposerContext, moves: list) -> None:
        """Each other drafter measured switched in at the incumbent's shape, at the tree shape its
        own table (`CostTable.switched`: its measured draft time and acceptance, that drafter's rank
        decay) predicts best, when that is faster than the incumbent: a switch measured slower at a
        shape that suits the incumbent's drafter may pay at one that suits its own."""
        measured = ctx.cost.ms_per_token
        for kind in sorted(ctx.cost.switch_rounds):
            table = ctx.cost.switched(kind)
            if table is None or table.acceptance is None or kind not in SWITCHES_BY_NAME:
                continue
            best = min(tree_shapes(MAX_DEPTH), key=table.predict_ms_per_token)
            t = table.predict_ms_per_token(best)
            if best == table.shape or not math.isfinite(t) or t >= measured * (1 - MIN_PREDICTED_SAVING):
                continue
            gap, changes, why = SWITCHES_BY_NAME[kind]
            changes = {**changes, "depth": best.depth, "topk": best.topk, "tree_budget": best.budget}
            text = (f"{why}, tree {table.shape.label()} -> {best.label()}: predicted {t:.3f} ms/token vs "
                    f"{measured:.3f} measured ({1 - t / measured:.0%} less; switched in at "
                    f"{table.shape.label()}: {table.ms_per_token:.3f} measured)")
            p = self._proposal(ctx, changes, gap, text, t, shape=asdict(best))
            if p is not None:
                moves.append((rank_key(measured, t, True), p))

    def _reenter(self, ctx: ProposerContext, moves: list) -> None:
        """From AR, back to drafting: shapes that the last speculative system measured in this run
        predicts faster than the AR measured now (its costs, its fitted acceptance)."""
        prior = next(((s, c) for s, c in reversed(ctx.history) if c.acceptance is not None and c.shape), None)
        if prior is None:
            return
        system, table = prior
        measured = ctx.cost.ms_per_token
        for s in tree_shapes(MAX_DEPTH):
            t = table.predict_ms_per_token(s)
            if math.isfinite(t) and t < measured * (1 - MIN_PREDICTED_SAVING):
                why = (f"drafting again with {s.label()} ({system.drafter.value} drafter, costs measured on "
                       f"{system.name!r}): predicted {t:.3f} ms/token vs AR {measured:.3f}")
                changes = {"drafter": system.drafter.value, "depth": s.depth, "topk": s.topk, "tree_budget": s.budget}
                p = self._proposal(ctx, changes, GapKind.ACCEPTANCE, why, t, shape=asdict(s))
                if p is not None:
                    moves.append((rank_key(measured, t, True), p))

    @staticmethod
    def _gap_of(ctx: ProposerContext, shape: TreeShape | None) -> GapKind:
        """The gap a shape move mostly closes: acceptance if it commits more per round, else the
        forward (draft or verify) whose time it cuts most."""
        cost = ctx.cost
        if shape is None:
            return GapKind.DRAFT_KERNELS
        if cost.tokens_per_round_for(shape) > cost.tokens_per_round:
            return GapKind.ACCEPTANCE
        draft_cut = cost.draft_forward_ms * (cost.shape.depth - shape.depth)
        verify_cut = cost.verify_ms - cost.verify_ms_at(shape.nodes)
        return GapKind.DRAFT_KERNELS if draft_cut >= verify_cut else GapKind.VERIFY_KERNELS

    # ---- 3. exploratory moves ----------------------------------------------------------------------
    def _exploratory(self, ctx: ProposerContext) -> list[Proposal]:
        inc = ctx.incumbent.candidate.system
        kinds = drafter_kinds(ctx.deployment)
        first: list[tuple[GapKind, dict, str]] = []  # ahead of the gap order (`segment_admission`)
        moves: list[tuple[GapKind, dict, str]] = []
        ar, measured = ctx.cost.ar_ms_per_token, ctx.cost.ms_per_token
        if inc.drafter is not DrafterKind.NONE and ar is not None and ar <= AR_CLOSE * measured:
            # the prediction's error is larger than this difference: time AR rather than trust the model
            moves.append((GapKind.DRAFT_KERNELS, ar_changes(inc),
                          f"plain AR decoding: measured {ar:.3f} ms/token, within {AR_CLOSE - 1:.0%} of the "
                          f"incumbent's {measured:.3f}"))
        if ctx.on_gpu:  # the same drafter and target in fewer kernels, before other drafters
            launch: list[tuple[GapKind, dict, str]] = []
            if inc.drafter in DRAFTER_MODELS and not inc.draft_compile:
                launch.append((GapKind.DRAFT_KERNELS, {"draft_compile": True},
                               "the draft proposal compiled whole with static shapes: a launch-bound drafter's "
                               "dozens of small kernels per level fused into a few"))
            if not inc.verify_compile:
                step = ("verification (target forward, acceptance, commit)" if inc.drafter is not DrafterKind.NONE
                        else "the AR step (target forward, argmax, commit)")
                launch.append((GapKind.VERIFY_KERNELS, {"verify_compile": True},
                               f"{step} compiled with static shapes: the work between the projections fused"))
            if inc.attention is AttentionKernel.SDPA:  # every cached forward, the drafter's steps above all
                gap = GapKind.DRAFT_KERNELS if inc.drafter in DRAFTER_MODELS else GapKind.VERIFY_KERNELS
                launch.append((gap, {"attention": AttentionKernel.SPLIT_KV.value},
                               "split-KV attention: a call with few queries (a drafter's frontier, the tree, a decode "
                               "step) cut along the cache into enough programs to fill the GPU, where torch's fused "
                               "kernels run a few dozen programs that each walk the whole cache"))
            if not inc.rope_store:
                launch.append((GapKind.VERIFY_KERNELS, {"rope_store": True},
                               "each dense attention layer's q/k norm, RoPE and K/V cache write in one Triton "
                               "kernel: about five launches per layer and four per forward cut to one per layer"))
            if inc.drafter in DRAFTER_MODELS and inc.draft_kernel is Kernel.CUBLAS:
                launch.append((GapKind.DRAFT_KERNELS, {"draft_kernel": Kernel.TRITON.value},
                               "the drafter's own projections and lm_head through the Triton kernels: its few rows "
                               "(topk per level, or a DFlash block) on the GEMV path, launched like the target's"))
            if not inc.pdl and triton_launches(inc):
                launch.append((GapKind.VERIFY_KERNELS, {"pdl": True},
                               "programmatic dependent launch: each of our Triton kernels and inductor's starts "
                               "while the one before it finishes, streaming its first weights, instead of after "
                               "a launch gap"))
            moves += launch_bundle(inc, launch) + launch
            if inc.drafter is DrafterKind.MODEL and inc.draft_kernel is not Kernel.FUSED:
                moves.append((GapKind.DRAFT_KERNELS, {"draft_kernel": Kernel.FUSED.value},
                              ("the draft model's decoder layers in four fused kernels each (norm + qkv + RoPE + "
                               "cache write, o_proj + residual, norm + gate|up + SiLU, down_proj + residual): a "
                               "launch-bound drafter's dozen kernels per layer cut to four plus its attention")))
        if inc.drafter is DrafterKind.MODEL:
            moves.append((GapKind.DRAFT_KERNELS, {"drafter": DrafterKind.NGRAM.value},
                          "prompt lookup instead of the draft model: no draft forwards at all"))
        served = segment_admission(ctx.deployment.regime, inc)
        for kind, (gap, changes, why) in SWITCHES.items():
            switch_ms = ctx.cost.switch_ms_per_token.get(kind.value)
            if switch_ms is not None and switch_ms > AR_CLOSE * measured:
                continue  # measured well slower switched in: the measurement has answered it
            if kind in kinds and kind is not inc.drafter:
                if served:
                    first.append((gap, {**changes, **served}, f"{why}, with segment admission: {SERVED_WHY}"))
                moves.append((gap, changes, why))
        if inc.drafter is DrafterKind.DFLASH:
            for construction, budget in DFLASH_TREES:
                if (inc.tree_construction.value, inc.tree_budget) != (construction, budget):
                    moves.append((GapKind.ACCEPTANCE, {"tree_construction": construction, "tree_budget": budget},
                                  f"DFlash block verified as a {construction} tree of {budget} nodes"))
        if inc.drafter not in (DrafterKind.NONE, DrafterKind.DFLASH) and not inc.adaptive_depth:
            tiers = sorted({max(1, inc.depth - 2), inc.depth + 2} - {inc.depth})
            moves.append((GapKind.ACCEPTANCE, {"adaptive_depth": tiers},
                          f"adaptive depth tiers {tiers} around {inc.depth}: deeper where drafts are accepted"))
        moves += batch_moves(ctx.deployment.regime, inc)
        if ctx.on_gpu:
            if not inc.cuda_graphs:
                moves.append((GapKind.OVERHEAD, {"cuda_graphs": True}, "replay each round as a CUDA graph"))
            for n in (2, 4):
                if inc.sync_every < n:
                    moves.append((GapKind.OVERHEAD, {"sync_every": n},
                                  f"check for EOS every {n} rounds, not every round"))
            if inc.kernel is Kernel.CUBLAS and ctx.fp8_target:
                moves.append((GapKind.VERIFY_KERNELS, {"kernel": Kernel.TRITON.value, "kernel_lm_head": True},
                              ("the target's BF16 lm_head through the Triton kernels (its FP8 projections keep "
                               "the FP8 kernels)")))
            elif inc.kernel is Kernel.CUBLAS:
                moves.append((GapKind.VERIFY_KERNELS, {"kernel": Kernel.TRITON.value},
                              "Triton projection kernels for the target's verify forward"))
                moves.append((GapKind.VERIFY_KERNELS, {"kernel": Kernel.TRITON.value, "w12": True},
                              "W12 weights (12 bits, lossless) under the Triton kernels: 25% fewer bytes"))
            elif not inc.w12:
                moves.append((GapKind.VERIFY_KERNELS, {"w12": True}, "W12 weights: 25% fewer bytes per forward"))
            if inc.kernel is Kernel.TRITON and not inc.kernel_lm_head:
                moves.append((GapKind.VERIFY_KERNELS, {"kernel_lm_head": True}, "the lm_head through the same kernels"))
            moves += tlv_moves(ctx.cost, inc)
        rank = {kind: i for i, kind in enumerate(ctx.gaps)}
        moves.sort(key=lambda m: rank.get(m[0], len(rank)))
        out = [self._proposal(ctx, changes, gap, why) for gap, changes, why in first + moves]
        return self._not_answered(ctx, [p for p in out if p is not None])

    @staticmethod
    def _not_answered(ctx: ProposerContext, proposals: list[Proposal]) -> list[Proposal]:
        """Drop the moves whose change was last measured `ANSWERED_LOSS` or more slower on an earlier
        incumbent of this deployment: a drafter switch or a kernel choice that lost that much is not
        timed again on every new incumbent."""
        slower = ctx.recall.slower_changes(ANSWERED_LOSS)
        kept = []
        for p in proposals:
            diff = p.candidate.changes_from(ctx.incumbent.candidate)
            record = slower.get(change_key({k: new for k, (_, new) in diff.items()}))
            if record is None:
                kept.append(p)
            else:
                ctx.log(f"knob: not proposing {describe(diff)} again: {record.gain:+.1%} on an earlier incumbent "
                        f"(entry {record.id}, {record.round})")
        return kept


TLV_CHAINS = (2, 4)  # two-level chains explored


def tlv_moves(cost, inc: System) -> list[tuple[GapKind, dict, str]]:
    """Two-level verification (`engine.drafters.two_level`) on a GPU: an FP8 view of the target
    drafts a chain beside the incumbent's tree. Not for recurrent targets (the view cannot catch up
    on a recurrent state) nor FP8 ones (a view would read as many bytes), nor with depth tiers.
    Where the view's agreement was measured (`CostTable.view_agreement`), only the chains the cost
    model prices faster than the measurement (`predict_tlv_ms_per_token`), with that price."""
    p = cost.profile
    if (inc.tlv_chain or inc.drafter not in TLV_DRAFTERS or inc.adaptive_depth or p.state_bytes_per_row
            or p.target_bytes < 1.5 * p.target_params):
        return []
    out = []
    for c in TLV_CHAINS:
        why = (f"two-level verification: an FP8 view of the target drafts a greedy chain of {c} beside the tree, "
               "checked in the same verify forward")
        predicted = cost.predict_tlv_ms_per_token(c)
        if cost.view_agreement is None or math.isnan(predicted):
            out.append((GapKind.ACCEPTANCE, {"tlv_chain": c}, why))
        elif predicted < cost.ms_per_token:
            out.append((GapKind.ACCEPTANCE, {"tlv_chain": c},
                        f"{why}; the view agrees with the target on {cost.view_agreement:.0%} of tokens: priced "
                        f"{predicted:.3f} ms/token against {cost.ms_per_token:.3f} measured"))
    return out


def launch_bundle(inc: System, launch: list[tuple[GapKind, dict, str]]) -> list[tuple[GapKind, dict, str]]:
    """The launch-level moves (compiled rounds, split-KV attention, rope_store, the drafter's kernels, PDL)
    together, as one more move ahead of them where two or more apply, with PDL wherever the bundle
    runs Triton kernels: alone, some gain less than the promotion threshold (PDL a few tenths of
    a percent) and could never be promoted, where together they clear it; and one timing answers
    what several rounds would. Under the gap of its first move."""
    if len(launch) < 2:
        return []
    together = {k: v for _, changes, _ in launch for k, v in changes.items()}
    if not inc.pdl and triton_launches(inc.with_knobs(together, inc.name)):
        together["pdl"] = True
    names = ", ".join(together)
    return [(launch[0][0], together, f"the launch-level moves together ({names}): each alone may gain less than "
                                     "the promotion threshold, together they add up in one timing")]


def batch_moves(regime, inc: System) -> list[tuple[GapKind, dict, str]]:
    """The batch mechanisms (engine/serving.py, drafters/best_first.py, engine/segments.py), for a
    regime of several requests: the same node count over the batch split by path score, per-request
    depth, and (under continuous batching) prompts prefilled inside the rounds."""
    if regime.batch < 2 or inc.drafter not in (DrafterKind.MODEL, DrafterKind.EAGLE3, DrafterKind.DFLASH):
        return []
    out = []
    if not inc.shared_budget and inc.tree_budget < 256:
        wide = min(256, 2 * inc.tree_budget + 2)
        out.append((GapKind.VERIFY_KERNELS, {"tree_budget": wide, "shared_budget": inc.tree_budget},
                    f"{inc.tree_budget} nodes per request on average, split across the batch by path score "
                    f"(up to {wide} for a confident request); verification projects only those"))
    if not inc.row_depth_margin:
        out.append((GapKind.ACCEPTANCE, {"row_depth_margin": 1},
                    "per-request depth: each request drafts one level past what its recent rounds accepted"))
    if regime.continuous and inc.attention_span >= 128:  # halved, still a multiple of 64
        finer = inc.attention_span // 2
        out.append((GapKind.VERIFY_KERNELS, {"attention_span": finer},
                    f"attention over the cache in steps of {finer} slots, not {inc.attention_span}: fewer "
                    "slots read past the longest row (one captured graph per step)"))
    segment = segment_admission(regime, inc)
    if segment:
        out.append((GapKind.OVERHEAD, segment,
                    "segment admission: a new request's prompt rides in the verify rows instead of a prefill "
                    "that stalls every running request"))
    return out


SERVED_WHY = ("the profile's static batches price neither a drafter's prefill nor admission, so under "
              "continuous batching a switch is timed as it would serve")


def segment_admission(regime, inc: System) -> dict:
    """The knobs that turn segment admission on for `inc`: under continuous batching, with it off;
    {} otherwise. Proposed on its own (`batch_moves`) and with each drafter switch: a switch measured
    faster is a predicted move with it, the others come ahead of every other exploratory move. The
    cost table times static batches, so it can price a drafter switch slower than serving with
    segment admission runs it (`scripts/switch_estimates.py` prices the switch, `specpilot bench
    --regime serving` serves it)."""
    if regime.batch < 2 or not regime.continuous or inc.segment_tokens or regime.sampled:
        return {}  # sampled rounds do not carry prompt segments (`engine.round.Rounds.filters` refuses them)
    return {"segment_tokens": max(8, inc.tree_budget)}


# Switching drafter: (gap it targets, knob changes (`loop.systems.DRAFTER_SWITCHES`), rationale).
SWITCHES = {
    DrafterKind.MODEL: (GapKind.ACCEPTANCE, DRAFTER_SWITCHES[DrafterKind.MODEL],
                        "the deployment's draft model instead of the current drafter"),
    DrafterKind.EAGLE3: (GapKind.ACCEPTANCE, DRAFTER_SWITCHES[DrafterKind.EAGLE3],
                         "the deployment's EAGLE-3 head: drafts from the target's own features"),
    DrafterKind.DFLASH: (GapKind.DRAFT_KERNELS, DRAFTER_SWITCHES[DrafterKind.DFLASH],
                         "the deployment's DFlash drafter: one draft forward per round for the whole block"),
}
SWITCHES_BY_NAME = {kind.value: switch for kind, switch in SWITCHES.items()}
DFLASH_TREES = (("best_first", 32), ("best_first", 64), ("spine_first", 32), ("best_first", 16), ("chain", 15))


def drafter_kinds(deployment) -> set[DrafterKind]:
    """The drafters a session of `deployment` can build: what its drafter directory is (draft model,
    DFlash or EAGLE-3), those its `dflash` / `eagle3` fields load beside it, n-gram and none."""
    from specpilot.models.dflash_checkpoint import is_dflash_dir
    from specpilot.models.eagle3_checkpoint import is_eagle3_dir
    from specpilot.models.fixture import resolve_checkpoint

    kinds = {DrafterKind.NGRAM, DrafterKind.NONE}
    if deployment.drafter not in ("ngram", "none"):
        try:
            path = resolve_checkpoint(deployment.drafter, "drafter")
        except Exception:  # noqa: BLE001 - a missing directory fails loudly when the session loads
            path = None
        if path is not None and is_dflash_dir(path):
            kinds.add(DrafterKind.DFLASH)
        elif path is not None and is_eagle3_dir(path):
            kinds.add(DrafterKind.EAGLE3)
        else:
            kinds.add(DrafterKind.MODEL)
    if deployment.dflash:
        kinds.add(DrafterKind.DFLASH)
    if deployment.eagle3:
        kinds.add(DrafterKind.EAGLE3)
    return kinds


def distinct_shapes(cost, shapes) -> list[TreeShape]:
    """`shapes` (sorted) less each one the cost model cannot tell from a cheaper one: shapes that
    predict the same ms/token (the acceptance model fills their node budgets with the same best
    nodes, and a draft level costs the same whatever its topk) keep only the one with the fewest
    draft rows (topk), then nodes, then levels. Timing both would spend a round's candidate slot
    on a move the model ranks no differently from one already timed."""
    kept: list[tuple[TreeShape, float]] = []
    for s in sorted(shapes, key=lambda s: (s.topk, s.budget, s.depth)):
        t = cost.predict_ms_per_token(s)
        if not any(math.isclose(t, u, rel_tol=1e-9) for _, u in kept):
            kept.append((s, t))
    return sorted(s for s, _ in kept)


def rank_key(measured: float, predicted: float, modelled: bool) -> float:
    """The time a move is ranked by: a modelled prediction keeps MODEL_TRUST of its predicted saving."""
    return measured - (MODEL_TRUST if modelled else 1.0) * (measured - predicted)


def interleave(first: list, second: list, every: int) -> list:
    """first[0], first[1], second[0], first[2], first[3], second[1], ... (every-th from `second`)."""
    out, a, b = [], list(first), list(second)
    while a or b:
        take_second = b and (not a or (len(out) + 1) % every == 0)
        out.append(b.pop(0) if take_second else a.pop(0))
    return out
