"""The knob agent: memory seeds first, predicted moves by the cost model, exploratory moves by gap."""

import math

import pytest
from loop_fixtures import CONFIG, DEPLOYMENT, SLOW_SWITCH, STOCK, context, cost_table, evaluation, fingerprint

from specpilot.config import AttentionKernel, DrafterKind, Kernel
from specpilot.control.rule import Outcome
from specpilot.loop.agents.knob import GPU_ONLY, KnobAgent, interleave
from specpilot.loop.recall import Recall
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory


def proposed_after(tmp_path, timed, gain: float) -> tuple[list, list[str]]:
    """The proposals on a new incumbent (a wider tree) once `timed` (stock with one change) was
    timed at `gain` against stock and rejected, and the agent's log lines."""
    here = fingerprint("fx")
    with Memory(tmp_path / f"m-{timed.name}{gain}.sqlite") as memory:
        memory.record_evaluation(here, evaluation(timed, gain=gain, verdict=Outcome.REJECT), CONFIG)
        recall = Recall.snapshot(memory, here)
    lines: list[str] = []
    wide = Incumbent(Candidate(STOCK.with_changes(name="wide", tree_budget=24, topk=8)), 1, 0.1)
    return KnobAgent().propose(context(incumbent=wide, recall=recall, log=lines.append, limit=60)), lines


def test_interleave_takes_every_third_from_the_second_list():
    assert interleave([1, 2, 3, 4], ["a", "b"], 3) == [1, 2, "a", 3, 4, "b"]
    assert interleave([], ["a"], 3) == ["a"] and interleave([1], [], 3) == [1]


def test_on_gpu_predicted_tree_moves_come_first_best_predicted_first():
    ctx = context()
    out = KnobAgent().propose(ctx)
    predicted = [p for p in out if p.predicted_ms_per_token is not None]
    assert predicted and [p.predicted_ms_per_token for p in predicted] == sorted(p.predicted_ms_per_token
                                                                              for p in predicted)
    assert all(p.predicted_ms_per_token < ctx.cost.ms_per_token for p in predicted)
    assert out[0] is predicted[0] and out[0].candidate.system.tree_budget > 7  # memory bound: a wider tree
    assert out[2].predicted_ms_per_token is None  # every third: an exploratory move
    explored = {k for p in out if p.predicted_ms_per_token is None for k in p.candidate.changes_from(ctx.stock)}
    assert {"kernel", "attention"} <= explored
    assert any(p.candidate.system.w12 for p in predicted)  # priced by the format floors
    assert len({p.hash for p in out}) == len(out) and ctx.incumbent.candidate.hash not in {p.hash for p in out}


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_of_tree_shapes_predicted_alike_only_the_one_drafting_fewest_rows_is_proposed(device):
    """The fixture's table predicts depth 3 with 8 nodes alike at topk 2, 4 and 8 (the same best
    nodes fill the budget): one candidate, topk 2, not three."""
    from specpilot.loop.acceptance import TreeShape

    ctx = context(device=device)
    alike = [TreeShape(3, k, 8) for k in (2, 4, 8)]
    assert len({ctx.cost.predict_ms_per_token(s) for s in alike}) == 1
    shapes = [p.details["shape"] for p in KnobAgent().propose(ctx) if p.details.get("shape")]
    times = [ctx.cost.predict_ms_per_token(TreeShape(**s)) for s in shapes]
    assert shapes and all(not math.isclose(a, b, rel_tol=1e-9) for i, a in enumerate(times) for b in times[:i])
    assert {"depth": 3, "topk": 2, "budget": 8} in shapes
    assert not {(s["topk"], s["budget"]) for s in shapes if s["depth"] == 3} & {(4, 8), (8, 8)}


def test_on_gpu_w12_is_a_predicted_move_priced_by_the_format_floors():
    """The verify forward at today's distance from its floor with 12.01 bits a weight: a predicted
    move, ranked with the shapes, not one exploratory move among a dozen; none where the incumbent
    runs W12 already, and where the verify forward is bound by compute it stays exploratory."""
    from loop_fixtures import gpu_profile

    from specpilot.config import Kernel
    from specpilot.loop.acceptance import TreeShape
    from specpilot.loop.cost_model import analyze

    ctx = context()
    out = KnobAgent().propose(ctx)
    (w12,) = [p for p in out if p.candidate.system.w12]
    assert w12.candidate.changes_from(ctx.incumbent.candidate) == {"kernel": ["cublas", "triton"], "w12": [False, True]}
    assert w12.predicted_ms_per_token == ctx.cost.predict_format_ms_per_token("w12") < ctx.cost.ms_per_token
    assert w12.gap.value == "verify-kernels" and "verify floor 1.691 -> 1.255 ms" in w12.rationale
    assert out.index(w12) < 6  # ranked among the predicted moves, ahead of most exploratory ones
    on_w12 = STOCK.with_changes(name="w12", kernel=Kernel.TRITON, w12=True)
    assert not [p for p in KnobAgent().propose(context(incumbent=Incumbent(Candidate(on_w12)))) if "w12" in
                p.candidate.changes_from(Candidate(on_w12))]
    compute_bound = analyze(gpu_profile(matmul_tflops=20.0), TreeShape.of(STOCK), STOCK.name, 4096)
    (explored,) = [p for p in KnobAgent().propose(context(cost=compute_bound, limit=60)) if p.candidate.system.w12]
    assert explored.predicted_ms_per_token is None


def test_w12_timed_without_a_gain_on_an_earlier_incumbent_is_not_priced_again(tmp_path):
    """The floors' estimate held no gain there: W12 goes back among the exploratory moves (where a
    loss under 10% is still asked again) instead of leading every later round."""
    from specpilot.config import Kernel

    w12 = STOCK.with_changes(name="w12", kernel=Kernel.TRITON, w12=True)

    def w12_moves(gain: float) -> tuple[list, list[str]]:
        out, lines = proposed_after(tmp_path, w12, gain)
        return [p for p in out if p.candidate.system.w12], lines

    (explored,), lines = w12_moves(-0.02)
    assert explored.predicted_ms_per_token is None
    assert any("not pricing kernel cublas->triton, w12 false->true by the format floors again: -2.0%" in line
               for line in lines)
    (priced,), lines = w12_moves(0.03)  # it gained there: still priced
    assert priced.predicted_ms_per_token is not None and not lines


def test_w12_is_not_priced_by_the_floors_where_verification_runs_more_rows_than_its_kernels_take():
    """Above RULE_MAX_M verify rows W12 runs cuBLAS on a decoded copy: the format floors promise no
    gain there, so W12 is left to the exploratory moves and the log says why."""
    from specpilot.kernels.configs import RULE_MAX_M

    wide = STOCK.with_changes(name="wide", depth=7, topk=8, tree_budget=128)
    lines: list[str] = []
    cost = cost_table(wide, tree_nodes=129)
    out = KnobAgent().propose(context(cost=cost, incumbent=Incumbent(Candidate(wide)), log=lines.append, limit=60))
    assert [p.predicted_ms_per_token for p in out if p.candidate.system.w12] == [None]
    assert any("verification runs 129 rows" in line for line in lines) and 129 > RULE_MAX_M


def test_on_cpu_knobs_without_effect_there_are_never_proposed():
    out = KnobAgent().propose(context(device="cpu"))
    assert out
    for p in out:
        changed = set(p.candidate.changes_from(Candidate(STOCK)))
        assert not changed <= GPU_ONLY and p.candidate.system.kernel.value == "cublas"


def test_on_an_fp8_target_neither_w12_nor_the_triton_projection_kernels_are_proposed(tmp_path):
    """An FP8 target's projections run the FP8 kernels: W12 (BF16 weights, losslessly) has nothing
    to encode and `kernel = "triton"` reaches only the BF16 lm_head, so the Triton kernels come only
    with it; not priced by the W12 floors, not seeded from a BF16 deployment; the log says why once.
    The BF16 target gets both moves."""
    from dataclasses import replace

    def kernel_moves(deployment, recall=None):
        lines: list[str] = []
        out = KnobAgent().propose(context(deployment=deployment, recall=recall, log=lines.append, limit=60))
        return [p.candidate.system for p in out if p.candidate.system.w12 or p.candidate.system.kernel is
                Kernel.TRITON], lines

    bf16, lines = kernel_moves(DEPLOYMENT)
    assert any(s.w12 for s in bf16) and any(not s.w12 and not s.kernel_lm_head for s in bf16)
    assert not any("FP8" in line for line in lines)
    fp8 = replace(DEPLOYMENT, target_format="fp8-block")
    seeded = fingerprint("fx-batch", batch=8)  # W12 validated on a similar BF16 deployment: no seed here
    with Memory(tmp_path / "m.sqlite") as memory:
        w12 = STOCK.with_changes(name="w12", kernel=Kernel.TRITON, w12=True)
        memory.record_evaluation(seeded, evaluation(w12, gain=0.2, verdict=Outcome.PROMOTE), CONFIG)
        recall = Recall.snapshot(memory, fingerprint("fx"))
    assert any(r.candidate.knobs["w12"] for _, r in recall.similar)
    systems, lines = kernel_moves(fp8, recall)
    assert systems and all(not s.w12 and s.kernel_lm_head for s in systems)  # the lm_head move alone
    said = ("knob: no W12 or Triton projection moves: the target is FP8, its projections run the FP8 kernels (W12 "
            "encodes BF16 weights); the Triton kernels only with the BF16 lm_head")
    assert [line for line in lines if "FP8" in line] == [said]


def test_memory_seeds_from_similar_deployments_come_first(tmp_path):
    with Memory(tmp_path / "m.sqlite") as memory:
        elsewhere = fingerprint("fx-batch", batch=8)
        wide = STOCK.with_changes(name="wide", tree_budget=24, topk=8)
        memory.record_evaluation(elsewhere, evaluation(wide, gain=0.3), CONFIG)
        slower = STOCK.with_changes(name="rejected", depth=2)
        memory.record_evaluation(elsewhere, evaluation(slower, gain=-0.1, verdict=Outcome.REJECT), CONFIG)
        here = fingerprint("fx")
        recall = Recall.snapshot(memory, here)
    out = KnobAgent().propose(context(recall=recall))
    first = out[0]
    assert (first.candidate.system.tree_budget, first.candidate.system.topk) == (24, 8)
    assert "validated on fx-batch" in first.rationale and first.details["source_entry"] == 1
    assert sum("validated on" in p.rationale for p in out) == 1  # the rejected one is no seed


def test_from_ar_it_proposes_drafting_again_with_shapes_measured_earlier_in_the_run():
    ar = STOCK.with_changes(name="ar", drafter=DrafterKind.NONE)
    ar_cost = cost_table(ar, accept_at_depth=(), tree_nodes=1, draft_ms=0.0, draft_forwards=0, drafter_bytes=0,
                         tokens_per_round=1.0, round_ms=6.0)
    ctx = context(ar_cost, Incumbent(Candidate(ar), 1, 0.1), history=[(STOCK, cost_table())])
    out = KnobAgent().propose(ctx)
    reentry = [p for p in out if p.predicted_ms_per_token is not None]
    assert reentry and all(p.candidate.system.drafter is DrafterKind.MODEL for p in reentry)
    assert all(p.predicted_ms_per_token < 6.0 for p in reentry) and "drafting again" in reentry[0].rationale


def test_knob_moves_keep_the_incumbents_patch_and_fix_the_draft_window():
    patched = Candidate(STOCK.with_changes(name="patched", draft_window=6), "diff --git a/x b/x\n", "/tmp/wt")
    # acceptance that stays high at depth 5, so deeper trees are among the predicted moves
    cost = cost_table(patched.system, accept_at_depth=(0.9, 0.8, 0.7, 0.6, 0.5), tokens_per_round=4.5)
    out = KnobAgent().propose(context(cost, Incumbent(patched, 3, 0.05)))
    assert all(p.candidate.patch == patched.patch and p.candidate.workdir == "/tmp/wt" for p in out)
    deeper = [p for p in out if p.candidate.system.depth >= 6]
    assert deeper and all(p.candidate.system.draft_window == 0 for p in deeper)


def test_adaptive_depth_tiers_deeper_than_the_draft_window_reset_it():
    """A tier of 7 drafts past a window of 6 as depth 7 would: the draft model refuses it, and
    `System` does too, so the move resets the window as a deeper tree does."""
    windowed = Incumbent(Candidate(STOCK.with_changes(name="windowed", draft_window=6)))
    out = KnobAgent().propose(context(incumbent=windowed, device="cpu", limit=60))
    (tiers,) = [p for p in out if p.candidate.system.adaptive_depth]
    assert tiers.candidate.system.adaptive_depth == (3, 7) and tiers.candidate.system.draft_window == 0


def test_moves_the_memory_judged_do_not_use_up_the_list():
    """Round after round the judged moves are dropped by the loop; the agent still hands over `cap`
    new ones, so the search reaches moves past the first list (the W12 move among them)."""
    from types import SimpleNamespace

    first = KnobAgent().propose(context(limit=1))
    assert len(first) == 12
    judged = tuple(SimpleNamespace(candidate=SimpleNamespace(hash=p.hash, patch=None, diff={}), verdict=Outcome.REJECT,
                                   reasons=(), contended=False) for p in first)  # settled verdicts
    later = KnobAgent().propose(context(limit=1, recall=Recall("fx", judged, ())))
    new = [p for p in later if p.hash not in {q.hash for q in first}]
    assert len(new) == 12 and later[:12] == first  # the judged ones are still listed, first


def test_ar_is_timed_when_it_measures_within_ten_percent_of_the_incumbent():
    """Where drafting barely pays, AR is worth a slot whatever the model predicts; where it clearly
    pays (AR well slower), no exploratory AR move."""
    from dataclasses import replace

    from specpilot.loop.agents.knob import AR_CLOSE

    cost = cost_table()
    close = replace(cost, ar_ms_per_token=cost.ms_per_token * (AR_CLOSE - 0.02))
    far = replace(cost, ar_ms_per_token=cost.ms_per_token * (AR_CLOSE + 0.5))

    def ar_moves(table):
        return [p for p in KnobAgent().propose(context(cost=table, device="cpu"))
                if p.candidate.system.drafter is DrafterKind.NONE]

    assert ar_moves(close) and not ar_moves(far)
    # an incumbent serving with every batch mechanism: AR is still one move away, those knobs reset
    mechanisms = STOCK.with_changes(name="m", segment_tokens=8, shared_budget=4, row_depth_margin=1)
    ar = [p for p in KnobAgent().propose(context(cost=close, incumbent=Incumbent(Candidate(mechanisms)),
                                                 device="cpu"))
          if p.candidate.system.drafter is DrafterKind.NONE]
    assert [p.candidate.system for p in ar] == [mechanisms.plain_ar(ar[0].candidate.system.name)]


def test_drafter_switches_follow_what_the_deployment_loads():
    from specpilot.config import load_deployment
    from specpilot.loop.agents.knob import drafter_kinds

    def drafters(deployment, incumbent):
        ctx = context(deployment=deployment, incumbent=Incumbent(Candidate(incumbent)), device="cpu")
        return {p.candidate.system.drafter for p in KnobAgent().propose(ctx)}, KnobAgent().propose(ctx)

    plain, _ = drafters(context().deployment, STOCK)
    assert DrafterKind.DFLASH not in plain and DrafterKind.EAGLE3 not in plain  # fixture: draft model only
    dep = load_deployment("fixture-dflash")
    assert drafter_kinds(dep) >= {DrafterKind.MODEL, DrafterKind.DFLASH, DrafterKind.EAGLE3}
    kinds, out = drafters(dep, dep.stock)  # incumbent: the DFlash chain
    assert {DrafterKind.MODEL, DrafterKind.EAGLE3} <= kinds
    trees = {(p.candidate.system.tree_construction.value, p.candidate.system.tree_budget) for p in out
             if p.candidate.system.drafter is DrafterKind.DFLASH}
    assert ("best_first", 32) in trees and ("spine_first", 32) in trees
    for p in out:  # depth and topk mean nothing to a DFlash block: never moved on their own
        s = p.candidate.system
        assert s.drafter is not DrafterKind.DFLASH or (s.depth, s.topk) == (dep.stock.depth, dep.stock.topk)


def test_batch_mechanisms_are_proposed_for_batched_regimes_only():
    from dataclasses import replace

    from specpilot.config import Regime

    def changed(regime):
        dep = replace(context().deployment, regime=regime)
        out = KnobAgent().propose(context(deployment=dep, device="cpu"))
        return [{k: new for k, (_, new) in p.candidate.changes_from(Candidate(STOCK)).items()} for p in out]

    assert not any({"shared_budget", "row_depth_margin", "segment_tokens"} & set(c) for c in changed(Regime()))
    static = changed(Regime(batch=8))
    assert {"tree_budget": 16, "shared_budget": 7} in [{k: c[k] for k in c if k in ("tree_budget", "shared_budget")}
                                                       for c in static]
    assert any("row_depth_margin" in c for c in static) and not any("segment_tokens" in c for c in static)
    served = changed(Regime(batch=8, continuous=True))
    assert any(c.get("segment_tokens") == 8 for c in served)


def test_a_drafter_measured_faster_switched_in_is_a_predicted_move_ranked_by_its_measurement():
    """The cost table carries each loaded drafter's measured ms/token at the incumbent's knobs: one
    measured faster is proposed among the predicted moves, at full trust; one measured a little
    slower only as exploration; one measured well slower not at all."""
    from dataclasses import replace

    from specpilot.config import load_deployment

    dep = load_deployment("fixture-dflash")  # loads the draft model, EAGLE-3 and DFlash
    stock = dep.stock.with_changes(name="model", drafter=DrafterKind.MODEL, depth=5, topk=4, tree_budget=7)
    base = cost_table(stock)

    def propose(switches):
        table = replace(base, switch_ms_per_token=switches)
        return KnobAgent().propose(context(table, Incumbent(Candidate(stock)), deployment=dep, limit=10))

    fast = propose({"eagle3": base.ms_per_token * 0.3, "dflash": base.ms_per_token * 1.5})
    assert fast[0].candidate.system.drafter is DrafterKind.EAGLE3  # beats every modelled tree move
    assert fast[0].predicted_ms_per_token == base.ms_per_token * 0.3 and "measured" in fast[0].rationale
    assert not any(p.candidate.system.drafter is DrafterKind.DFLASH for p in fast)  # 1.5x slower: answered
    close = propose({"eagle3": base.ms_per_token * 1.05})
    eagle = [p for p in close if p.candidate.system.drafter is DrafterKind.EAGLE3]
    assert eagle and all(p.predicted_ms_per_token is None for p in eagle)  # still explored, not predicted
    assert any(p.candidate.system.drafter is DrafterKind.DFLASH for p in close)  # not measured: explored


def test_under_continuous_batching_a_switch_measured_faster_is_proposed_with_segment_admission():
    """On the H200 at concurrency 32 the measured EAGLE-3 switch (5% faster on static batches) took
    the round's slot without segment admission, ahead of the served switch: served, the predicted
    switch carries it; the plain switch is still explored."""
    from dataclasses import replace

    from specpilot.config import Regime, load_deployment

    dep = load_deployment("fixture-dflash")
    stock = dep.stock.with_changes(name="model", drafter=DrafterKind.MODEL, depth=5, topk=4, tree_budget=7)
    base = cost_table(stock)
    table = replace(base, switch_ms_per_token={"eagle3": base.ms_per_token * 0.3})

    def propose(regime):
        return KnobAgent().propose(context(table, Incumbent(Candidate(stock)),
                                           deployment=replace(dep, regime=regime), limit=40))

    served = propose(Regime(batch=32, continuous=True))
    first = served[0]
    assert first.predicted_ms_per_token == base.ms_per_token * 0.3
    assert (first.candidate.system.drafter, first.candidate.system.segment_tokens) == (DrafterKind.EAGLE3, 8)
    assert "with segment admission" in first.rationale
    assert any(p.candidate.system.drafter is DrafterKind.EAGLE3 and not p.candidate.system.segment_tokens
               for p in served)
    static = propose(Regime(batch=32))
    assert static[0].candidate.system.drafter is DrafterKind.EAGLE3 and not static[0].candidate.system.segment_tokens


def test_under_continuous_batching_a_drafter_switch_with_segment_admission_is_explored_first():
    """The static-batch table prices neither prefill nor admission: served, the switch comes with
    segment admission, ahead of the gap order; a static batch keeps the plain switch in gap order."""
    from dataclasses import replace

    from specpilot.config import Regime, load_deployment

    dep = load_deployment("fixture-dflash")  # loads the draft model, EAGLE-3 and DFlash
    stock = dep.stock.with_changes(name="model", drafter=DrafterKind.MODEL, depth=5, topk=4, tree_budget=16)
    base = cost_table(stock)
    table = replace(base, switch_ms_per_token={"eagle3": base.ms_per_token * 1.06})  # a little slower, static

    def explored(regime):
        d = replace(dep, regime=regime)
        out = KnobAgent().propose(context(table, Incumbent(Candidate(stock)), deployment=d, limit=40))
        return [p for p in out if p.predicted_ms_per_token is None]

    served = explored(Regime(batch=8, continuous=True))
    s = served[0].candidate.system
    assert (s.drafter, s.segment_tokens, s.tree_budget) == (DrafterKind.EAGLE3, 16, 16)
    assert any(p.candidate.system.drafter is DrafterKind.EAGLE3 and not p.candidate.system.segment_tokens
               for p in served)  # the plain switch stays, in gap order
    static = explored(Regime(batch=8))
    assert not any(p.candidate.system.segment_tokens for p in static)
    sampled = explored(Regime(batch=8, continuous=True, temperature=0.7))  # sampled rounds carry no segments
    assert sampled and not any(p.candidate.system.segment_tokens for p in sampled)
    segmented = stock.with_changes(segment_tokens=7)
    out = KnobAgent().propose(context(table, Incumbent(Candidate(segmented)),
                                      deployment=replace(dep, regime=Regime(batch=8, continuous=True)), limit=40))
    assert all(p.candidate.system.segment_tokens == 7 for p in out if p.candidate.system.drafter is DrafterKind.EAGLE3)


def test_on_gpu_it_proposes_compiling_the_proposal_and_the_verification_once():
    out = KnobAgent().propose(context())
    by_change = {tuple(sorted(p.candidate.changes_from(Candidate(STOCK)))): p for p in out}
    assert by_change[("draft_compile",)].gap.value == "draft-kernels"
    assert by_change[("verify_compile",)].gap.value == "verify-kernels"
    compiled = Incumbent(Candidate(STOCK.with_changes(name="c", draft_compile=True, verify_compile=True)), 1, 0.1)
    again = KnobAgent().propose(context(incumbent=compiled, limit=40))
    changed = [set(p.candidate.changes_from(compiled.candidate)) for p in again]
    assert again and not any({"draft_compile", "verify_compile"} & c for c in changed)
    assert {"kernel"} in changed and {"kernel", "w12"} in changed  # the Triton kernels inside the compiled verification
    ar = Incumbent(Candidate(STOCK.with_changes(name="ar", drafter=DrafterKind.NONE)), 1, 0.1)
    ar_compiled = [p for p in KnobAgent().propose(context(incumbent=ar, limit=40))
                   if p.candidate.changes_from(ar.candidate) == {"verify_compile": [False, True]}]
    assert len(ar_compiled) == 1 and "the AR step" in ar_compiled[0].rationale



def test_on_gpu_it_proposes_split_attention_once_under_the_gap_of_the_forwards_it_speeds_most():
    """Drafting: the draft steps (a frontier of topk queries) gain most; plain AR: its one forward."""
    out = KnobAgent().propose(context(limit=40))
    split = [p for p in out if p.candidate.changes_from(Candidate(STOCK)) == {"attention": ["sdpa", "split_kv"]}]
    assert len(split) == 1 and split[0].gap.value == "draft-kernels"
    ar = Incumbent(Candidate(STOCK.with_changes(name="ar", drafter=DrafterKind.NONE)), 1, 0.1)
    split_ar = [p for p in KnobAgent().propose(context(incumbent=ar, limit=40))
                if set(p.candidate.changes_from(ar.candidate)) == {"attention"}]
    assert len(split_ar) == 1 and split_ar[0].gap.value == "verify-kernels"
    done = Incumbent(Candidate(STOCK.with_changes(name="s", attention=AttentionKernel.SPLIT_KV)), 1, 0.1)
    again = KnobAgent().propose(context(incumbent=done, limit=40))
    assert again and all(p.candidate.system.attention is AttentionKernel.SPLIT_KV for p in again)


def test_on_gpu_it_proposes_compiling_a_dflash_proposal():
    from specpilot.config import load_deployment

    dep = load_deployment("fixture-dflash")
    inc = Incumbent(Candidate(dep.stock.with_changes(name="d", drafter=DrafterKind.DFLASH, tree_budget=16)), 1, 0.1)
    out = KnobAgent().propose(context(incumbent=inc, deployment=dep, limit=40))
    assert any(set(p.candidate.changes_from(inc.candidate)) == {"draft_compile"} for p in out)

def test_on_gpu_it_proposes_compiling_the_verification_over_the_triton_kernels():
    for knobs in ({"kernel": Kernel.TRITON}, {"kernel": Kernel.TRITON, "w12": True}):
        triton = Incumbent(Candidate(STOCK.with_changes(name="t", **knobs)), 1, 0.1)
        out = KnobAgent().propose(context(incumbent=triton, limit=40))
        compiled = [p for p in out if set(p.candidate.changes_from(triton.candidate)) == {"verify_compile"}]
        assert len(compiled) == 1 and compiled[0].gap.value == "verify-kernels", knobs
        assert compiled[0].candidate.system.kernel is Kernel.TRITON


def test_an_exploratory_change_that_lost_clearly_on_an_earlier_incumbent_is_not_proposed_again(tmp_path):
    ngram = STOCK.with_changes(name="ngram", drafter=DrafterKind.NGRAM)

    def shown_after(loss: float) -> tuple[bool, list[str]]:
        out, lines = proposed_after(tmp_path, ngram, loss)
        return any(p.candidate.system.drafter is DrafterKind.NGRAM for p in out), lines

    shown, lines = shown_after(-0.25)
    assert not shown and any("not proposing drafter model->ngram again: -25.0%" in line for line in lines)
    shown, lines = shown_after(-0.05)  # within the noise of a new incumbent: asked again
    assert shown and not lines


def test_a_switch_measured_slower_at_this_shape_is_proposed_at_the_shape_its_own_table_predicts_best():
    from dataclasses import replace

    from specpilot.loop.cost_model import MAX_DEPTH, tree_shapes

    cost = replace(cost_table(), switch_ms_per_token={"eagle3": SLOW_SWITCH["ms_per_token"]},
                   switch_rounds={"eagle3": SLOW_SWITCH})
    out = KnobAgent().propose(context(cost))
    switches = [p for p in out if p.candidate.system.drafter is DrafterKind.EAGLE3 and p.predicted_ms_per_token]
    table = cost.switched("eagle3")
    best = min(tree_shapes(MAX_DEPTH), key=table.predict_ms_per_token)
    assert len(switches) == 1 and switches[0].details["shape"] == {"depth": best.depth, "topk": best.topk,
                                                                   "budget": best.budget}
    assert switches[0].predicted_ms_per_token == pytest.approx(table.predict_ms_per_token(best))
    assert "switched in at depth 5, topk 4, 7 nodes: 3.896 measured" in switches[0].rationale
    fast_here = replace(cost, switch_rounds={})  # not measured in full: only the measured switch, as before
    assert not [p for p in KnobAgent().propose(context(fast_here))
                if p.candidate.system.drafter is DrafterKind.EAGLE3 and p.predicted_ms_per_token]


def test_on_gpu_it_proposes_pdl_once_where_triton_kernels_run():
    """pdl launches our kernels and inductor's early: proposed under verify-kernels on an incumbent
    that runs some (compiled rounds, Triton projections, split attention), never on one that runs
    only cuBLAS and cuDNN, and not again once on."""
    def pdl_moves(system):
        inc = Incumbent(Candidate(system), 1, 0.1)
        return [p for p in KnobAgent().propose(context(incumbent=inc, limit=60))
                if p.candidate.changes_from(inc.candidate) == {"pdl": [False, True]}]

    assert not pdl_moves(STOCK)  # the stock fixture: cuBLAS, SDPA, eager
    for knobs in ({"verify_compile": True}, {"kernel": Kernel.TRITON}, {"attention": AttentionKernel.SPLIT_KV},
                  {"draft_kernel": Kernel.TRITON}, {"rope_store": True}):
        moves = pdl_moves(STOCK.with_changes(name="k", **knobs))
        assert len(moves) == 1 and moves[0].gap.value == "verify-kernels", knobs
    assert not pdl_moves(STOCK.with_changes(name="on", verify_compile=True, pdl=True))
    # the drafter's kernels launch only while a drafter with a model of its own drafts
    assert len(pdl_moves(STOCK.with_changes(name="e", drafter=DrafterKind.EAGLE3, draft_kernel=Kernel.TRITON))) == 1
    assert not pdl_moves(STOCK.with_changes(name="n", drafter=DrafterKind.NGRAM, draft_kernel=Kernel.TRITON))


def test_on_gpu_it_proposes_the_drafters_kernels_while_a_drafter_with_a_model_drafts():
    def draft_kernel_moves(system, device="cuda"):  # to the table kernels ("fused": the next test)
        inc = Incumbent(Candidate(system), 1, 0.1)
        return [p for p in KnobAgent().propose(context(incumbent=inc, limit=60, device=device))
                if set(p.candidate.changes_from(inc.candidate)) == {"draft_kernel"}
                and p.candidate.system.draft_kernel is Kernel.TRITON]

    (move,) = draft_kernel_moves(STOCK)
    assert move.candidate.changes_from(Candidate(STOCK)) == {"draft_kernel": ["cublas", "triton"]}
    assert move.gap.value == "draft-kernels" and move.predicted_ms_per_token is None
    assert not draft_kernel_moves(STOCK, device="cpu")
    for kind in (DrafterKind.EAGLE3, DrafterKind.DFLASH):  # their heads have projections of their own
        (move,) = draft_kernel_moves(STOCK.with_changes(name="f", drafter=kind))
        assert move.candidate.system.drafter is kind
    assert not draft_kernel_moves(STOCK.with_changes(name="n", drafter=DrafterKind.NGRAM))
    assert not draft_kernel_moves(STOCK.with_changes(name="on", draft_kernel=Kernel.TRITON))


def test_on_gpu_it_proposes_the_fused_draft_layers_while_the_draft_model_drafts():
    """draft_kernel = "fused" (the draft model's decoder layers in four fused kernels) beside the
    table kernels' move, from cuBLAS or the table kernels, for the draft model only, never on CPU,
    and outside the launch-level bundle (which keeps draft_kernel = "triton")."""
    def fused_moves(system, device="cuda"):
        inc = Incumbent(Candidate(system), 1, 0.1)
        return [p for p in KnobAgent().propose(context(incumbent=inc, limit=80, device=device))
                if p.candidate.system.draft_kernel is Kernel.FUSED]

    (move,) = fused_moves(STOCK)
    assert move.candidate.changes_from(Candidate(STOCK)) == {"draft_kernel": ["cublas", "fused"]}
    assert move.gap.value == "draft-kernels" and move.predicted_ms_per_token is None and "fused" in move.rationale
    (move,) = fused_moves(STOCK.with_changes(name="t", draft_kernel=Kernel.TRITON))
    assert move.candidate.changes_from(Candidate(STOCK.with_changes(name="t", draft_kernel=Kernel.TRITON))) == {
        "draft_kernel": ["triton", "fused"]}
    assert not fused_moves(STOCK, device="cpu")
    for kind in (DrafterKind.EAGLE3, DrafterKind.DFLASH, DrafterKind.NGRAM):
        assert not fused_moves(STOCK.with_changes(name="f", drafter=kind))
    assert not [p for p in fused_moves(STOCK.with_changes(name="on", draft_kernel=Kernel.FUSED))
                if "draft_kernel" in p.candidate.changes_from(Candidate(STOCK.with_changes(name="on",
                                                                                           draft_kernel=Kernel.FUSED)))]


def test_on_gpu_the_launch_level_moves_are_also_proposed_together_ahead_of_them():
    """Compiled rounds, split-KV attention, the drafter's kernels and PDL: each alone, and all of
    them as one move before them (PDL, which alone gains less than the threshold, rides along);
    none together where one is left, nor on CPU."""
    launch = {"draft_compile", "verify_compile", "attention", "rope_store", "draft_kernel", "pdl"}
    out = KnobAgent().propose(context(limit=80))
    changes = [set(p.candidate.changes_from(Candidate(STOCK))) for p in out]
    (bundle,) = [p for p, c in zip(out, changes) if c == launch]
    assert bundle.gap.value == "draft-kernels" and "together" in bundle.rationale
    assert bundle.candidate.system.pdl and bundle.candidate.system.attention is AttentionKernel.SPLIT_KV
    assert changes.index(launch) < changes.index({"draft_compile"})
    assert {"verify_compile"} in changes and {"attention"} in changes and {"draft_kernel"} in changes
    (store,) = [p for p, c in zip(out, changes) if c == {"rope_store"}]
    assert store.gap.value == "verify-kernels" and "RoPE" in store.rationale
    compiled = STOCK.with_changes(name="c", draft_compile=True, verify_compile=True)
    inc = Incumbent(Candidate(compiled), 1, 0.1)
    rest = [set(p.candidate.changes_from(inc.candidate)) for p in KnobAgent().propose(context(incumbent=inc, limit=80))]
    assert {"attention", "rope_store", "draft_kernel", "pdl"} in rest  # the compiled rounds launch inductor's kernels: PDL alone too
    one_left = STOCK.with_changes(name="o", draft_compile=True, verify_compile=True, attention=AttentionKernel.SPLIT_KV,
                                  rope_store=True, pdl=True)
    inc = Incumbent(Candidate(one_left), 1, 0.1)
    rest = [set(p.candidate.changes_from(inc.candidate)) for p in KnobAgent().propose(context(incumbent=inc, limit=80))]
    assert {"draft_kernel"} in rest and not any(len(c) > 1 and "draft_kernel" in c for c in rest)
    assert not any(c >= {"draft_compile", "verify_compile"} for c in
                   (set(p.candidate.changes_from(Candidate(STOCK))) for p in KnobAgent().propose(context(device="cpu", limit=80))))


def test_every_move_for_an_ngram_incumbent_decodes_on_the_engine():
    """No move the engine refuses: each proposal for an n-gram incumbent (tree shapes, plain AR,
    adaptive depth tiers, which once crashed the n-gram drafter on the first tier switch) builds
    and decodes on the fixture. `System` validates every candidate an agent builds; this checks
    that what it accepts the engine runs."""
    import torch

    from specpilot.config import Deployment, System
    from specpilot.engine.session import Session

    dep = Deployment(name="fx-ngram", target="fixture", drafter="ngram",
                     stock=System(drafter=DrafterKind.NGRAM, depth=4, topk=1, tree_budget=4))
    inc = Incumbent(Candidate(dep.stock.with_changes(name="ngram")))
    out = KnobAgent().propose(context(incumbent=inc, device="cpu", deployment=dep, limit=60))
    assert any(p.candidate.system.adaptive_depth for p in out)
    session = Session.load(dep, "cpu", torch.float32)
    prompt = session.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n")
    for p in out:
        result = session.generator(p.candidate.system).generate([prompt], 24, stop_at_eos=False)
        assert len(result.outputs[0]) == 24, p.candidate.name


def test_on_gpu_two_level_verification_is_explored_where_a_view_can_draft():
    def tlv(out, inc=Candidate(STOCK)):
        return sorted(p.candidate.system.tlv_chain for p in out
                      if set(p.candidate.changes_from(inc)) == {"tlv_chain"})

    assert tlv(KnobAgent().propose(context(limit=80))) == [2, 4]
    assert tlv(KnobAgent().propose(context(device="cpu", limit=80))) == []
    hybrid = cost_table(state_bytes_per_row=1 << 20)
    assert tlv(KnobAgent().propose(context(cost=hybrid, limit=80))) == []
    on = Incumbent(Candidate(STOCK.with_changes(name="t", tlv_chain=2)), 1, 0.1)
    assert tlv(KnobAgent().propose(context(incumbent=on, limit=80)), on.candidate) == []


def test_two_level_chains_are_proposed_only_where_priced_faster_once_the_agreement_is_measured():
    from dataclasses import replace

    def tlv(cost):
        return [p for p in KnobAgent().propose(context(cost=cost, limit=80))
                if set(p.candidate.changes_from(Candidate(STOCK))) == {"tlv_chain"}]

    weak = cost_table(accept_at_depth=(0.4, 0.15, 0.05, 0.01, 0.0), tokens_per_round=1.6)  # a poor drafter
    agreeing = tlv(replace(weak, view_agreement=0.98))
    assert agreeing and all("priced" in p.rationale for p in agreeing)
    assert tlv(replace(weak, view_agreement=0.0)) == []
    assert tlv(replace(cost_table(), view_agreement=0.98)) == []  # stock's drafter: the view costs more than it adds
