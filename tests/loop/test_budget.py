"""The budget and the estimates a run spends it by."""

import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from loop_fixtures import CONFIG, DEPLOYMENT, STOCK, cost_table, evaluation, fingerprint, run_context

from specpilot.config import Regime
from specpilot.control.config import Stage
from specpilot.control.controller import Costs
from specpilot.loop.budget import (Budget, CandidateCost, compile_seconds, compiled_opens, compiles, evaluation_seconds,
                                   final_seconds, fitting_candidates, fitting_selection, open_warmup, round_seconds)
from specpilot.loop.config import LoopConfig
from specpilot.loop.final import bench_config, heldout_config
from specpilot.loop.rounds import RoundState
from specpilot.loop.run import final_reserve
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.memory.store import Memory


def test_budget():
    assert Budget(None).fits(1e9)
    b = Budget(10.0)
    assert b.fits(9.0) and not b.fits(11.0) and b.left() <= 10.0
    b.start = time.monotonic() - 20
    assert b.left() < 0 and not b.fits(0.0)


def test_an_evaluation_is_scaled_from_the_noise_measurement_else_taken_from_the_memory(tmp_path):
    costs = Costs(open=5.0, warmup_blocks=1.0, timed_blocks=20.0, total=26.0, blocks=10)  # 2 s per block
    # start-up + warm-up + the gate's prompts (4 prompts = 1 block of 4) + 20 blocks + half of 20 extra
    assert evaluation_seconds(costs, CONFIG, None, "d", "cpu") == pytest.approx(5 + 1 + 2 + 30 * 2)
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as memory:
        assert evaluation_seconds(None, CONFIG, memory, fp.digest, "cuda") == 90.0
        for gain in (0.1, 0.2, 0.3):
            memory.record_evaluation(fp, evaluation(STOCK.with_changes(name=str(gain), depth=3), gain=gain), CONFIG)
        assert evaluation_seconds(None, CONFIG, memory, fp.digest, "cuda") == 3.0  # the stored costs' median


def test_rounds_and_the_final_measurement():
    assert round_seconds([30.0, 50.0], 20.0, 3, 1) == 50.0
    assert round_seconds([], 20.0, 3, 1) == 5.0 + 4 * 20.0 and round_seconds([], 20.0, 3, 3) == 5.0 + 2 * 20.0
    cost = cost_table(STOCK)
    bench = bench_config(DEPLOYMENT, 4, 512)
    tokens = 5 * 4 * 512
    expected = 1.2 * (cost.predict_ms_per_token(None) + 2 * cost.ms_per_token) * tokens / 1e3 + 60.0
    assert final_seconds(cost, bench, 1, "cuda") == pytest.approx(expected)


def test_a_round_that_does_not_fit_whole_times_fewer_candidates():
    """3 candidates on one device: 4 evaluations of 60 s and 40 s of the rest (the longest past round,
    280 s); 2 candidates save one evaluation, 1 saves two; below one candidate's round, none."""
    assert fitting_candidates([280.0], 60.0, 3, 1, 300.0) == 3
    assert fitting_candidates([280.0], 60.0, 3, 1, 279.0) == 2  # 40 + 3 x 60 = 220
    assert fitting_candidates([280.0], 60.0, 3, 1, 219.0) == 1  # 40 + 2 x 60 = 160
    assert fitting_candidates([280.0], 60.0, 3, 1, 159.0) == 0
    assert fitting_candidates([], 60.0, 3, 1, 130.0) == 1  # before any round: 5 s of measurement + 2 x 60
    assert fitting_candidates([280.0], 60.0, 4, 2, 279.0) == 2  # two at a time: 3 evaluations of 4 or of 2
    assert fitting_candidates([100.0], 60.0, 3, 1, 130.0) == 1  # a past round shorter than its evaluations


def test_the_final_serving_run_is_estimated_by_its_units():
    """At concurrency 8 the final measurement serves 5 units of 16 requests (2 per slot): each unit
    within (2 + 1 - 1/8) request lengths, the same 80 requests the batch benchmark would time."""
    cost = cost_table(STOCK)
    per_token = cost.predict_ms_per_token(None) + 2 * cost.ms_per_token
    served = replace(DEPLOYMENT, regime=Regime(batch=8, continuous=True))
    bench = bench_config(served, 5, 512)
    assert (bench.units, bench.unit_size(8), bench.n_prompts, bench.max_new_tokens) == (5, 16, 16, 512)
    expected = 1.2 * per_token * 5 * (3 - 1 / 8) * 512 / 1e3 + 60.0
    assert final_seconds(cost, bench, 8, "cuda") == pytest.approx(expected)
    static = bench_config(replace(DEPLOYMENT, regime=Regime(batch=8)), 5, 512)  # 2 batches of 8 per set
    assert final_seconds(cost, static, 8, "cuda") == pytest.approx(1.2 * per_token * 5 * 2 * 512 / 1e3 + 60.0)


def test_the_final_measurement_in_the_loaded_process_warms_each_system_only():
    """A final system without a patch is benched in the loop's loaded process: three systems' warm-up,
    not a process start-up; one that may carry a patch keeps the start-up."""
    cost = cost_table(STOCK)
    bench = bench_config(DEPLOYMENT, 4, 512)
    tokens_s = 1.2 * (cost.predict_ms_per_token(None) + 2 * cost.ms_per_token) * 5 * 4 * 512 / 1e3
    assert final_seconds(cost, bench, 1, "cuda", own_process=False) == pytest.approx(tokens_s + 3 * 10.0)
    assert final_seconds(cost, bench, 1, "cuda", own_process=True) == pytest.approx(tokens_s + 60.0)


def test_the_held_out_run_adds_its_tokens_and_a_warmup():
    """The final measurement's held-out run (8 held-out prompts by default) is counted like the main
    run: its prompts x tokens at the same ms per token, and a second warm-up; 0 prompts: none."""
    cost = cost_table(STOCK)
    per_token = cost.predict_ms_per_token(None) + 2 * cost.ms_per_token
    bench = bench_config(DEPLOYMENT, 4, 512)
    held = heldout_config(bench, 8)
    assert (held.sets, held.n_prompts, held.max_new_tokens, held.batch) == (("heldout",), 8, 512, 1)
    base = final_seconds(cost, bench, 1, "cuda")
    assert final_seconds(cost, bench, 1, "cuda", heldout=held) == pytest.approx(
        base + 1.2 * per_token * 8 * 512 / 1e3 + 60.0)
    assert final_seconds(cost, bench, 1, "cuda", own_process=False, heldout=held) == pytest.approx(
        final_seconds(cost, bench, 1, "cuda", own_process=False) + 1.2 * per_token * 8 * 512 / 1e3 + 3 * 10.0)
    more = final_seconds(cost, bench, 1, "cuda", heldout=heldout_config(bench, 16))
    assert more > final_seconds(cost, bench, 1, "cuda", heldout=held) > base
    state = RoundState(index=1, done=0, incumbent=Incumbent(Candidate(STOCK)), noise=None)

    def reserve(prompts: int) -> float:
        ctx = run_context(config=LoopConfig(final_heldout_prompts=prompts), deployment=DEPLOYMENT, device="cuda",
                          stock=Candidate(STOCK), agents=(), patches_stored=False)
        return final_reserve(ctx, cost, state)

    assert reserve(0) == pytest.approx(final_seconds(cost, bench_config(DEPLOYMENT, 5, 64), 1, "cuda",
                                                     own_process=False))
    assert reserve(0) < reserve(8) < reserve(16)


def test_the_final_may_carry_a_patch_when_any_source_of_one_is_there():
    from types import SimpleNamespace

    from specpilot.loop.context import holds_patches

    class Memory:
        def __init__(self, patches):
            self.calls, self.patches = 0, patches

        def entries(self):
            self.calls += 1
            return [SimpleNamespace(candidate=SimpleNamespace(patch=p)) for p in self.patches]

    def run(patches=(), agents=("knob",)):
        memory = Memory(patches)
        ctx = run_context(patches_stored=holds_patches(memory), agents=tuple(SimpleNamespace(name=a) for a in agents))
        assert memory.calls == 1  # the memory is read once per run, as it opens
        return ctx

    plain, patched = (SimpleNamespace(candidate=SimpleNamespace(patch=p)) for p in (None, "diff"))
    quiet = run()
    assert not quiet.final_may_patch(plain) and not quiet.final_may_patch(plain)
    assert quiet.final_may_patch(patched)
    assert run(agents=("knob", "coding")).final_may_patch(plain)
    assert run(patches=(None, "diff")).final_may_patch(plain)


def test_the_first_round_counts_the_kernel_agents_tuning_as_proposing():
    """Before any round: proposing (the kernel agent tunes for up to its 60 s) + 5 s + 4 evaluations;
    a smaller round keeps the proposing."""
    assert round_seconds([], 20.0, 3, 1, propose_s=60.0) == 60.0 + 5.0 + 4 * 20.0
    assert round_seconds([50.0], 20.0, 3, 1, propose_s=60.0) == 50.0  # a past round counted its own
    assert fitting_candidates([], 20.0, 3, 1, 125.0, propose_s=60.0) == 2  # 65 + 3 x 20
    assert fitting_candidates([], 20.0, 3, 1, 104.0, propose_s=60.0) == 0  # 65 + 2 x 20 = 105


def test_a_compiled_system_costs_a_compile_warmup_to_open():
    """draft_compile or verify_compile: ~90 s on a GPU before this run saw one, else the longest open
    of a compiled candidate seen less a plain open; a shared worker pays it at a system's first open
    only, an isolated pair at every open."""
    assert compiles({"draft_compile": True}) and compiles({"verify_compile": True, "draft_compile": False})
    assert not compiles({"depth": 3}) and not compiles({"draft_compile": False, "verify_compile": False})
    assert compile_seconds([], "cuda") == 90.0
    assert compile_seconds([97.4, 75.2, 3.0], "cuda") == pytest.approx(97.4 - 6.0)
    assert compile_seconds([4.0], "cuda") == 0.0
    assert open_warmup(True, False, True, 90.0) == (90.0, 0.0)  # shared, first open: screening only
    assert open_warmup(True, True, True, 90.0) == (0.0, 0.0)  # shared, compiled there before
    assert open_warmup(True, True, False, 90.0) == (90.0, 90.0)  # isolated: every open
    assert open_warmup(False, False, False, 90.0) == (0.0, 0.0)
    # the opens seen: a compiled candidate's first (a re-measured winner's screening), never a plain one's
    compiled = STOCK.with_changes(name="c", draft_compile=True, verify_compile=True)
    plain = STOCK.with_changes(name="p", depth=3)

    def timed(system, open_s, stage=Stage.SCREEN):
        e = evaluation(system)
        return replace(e, stage=stage, costs=replace(e.costs, open=open_s))

    winner = replace(timed(compiled, 1.5, Stage.REMEASURE), screening=timed(compiled, 97.4))
    assert compiled_opens([winner, timed(plain, 6.5), timed(compiled, 75.2)]) == [97.4, 75.2]


def test_candidates_are_kept_in_order_while_their_round_and_final_fit():
    """150 s left on one device, the final ~40 s: a plain candidate (20 s to screen, 20 s to re-measure)
    fits; a compiled one (110 s to screen, and a final ~130 s should it win) does not, and the plain one
    after it is still kept; with 80 s only the first plain one fits."""
    plain, dear = CandidateCost(20.0, 20.0, 40.0), CandidateCost(110.0, 20.0, 130.0, 90.0)
    assert fitting_selection(0.0, [plain, dear, plain], 1, 150.0) == [0, 2]  # 20 + 20 + 20 + 40 = 100
    assert fitting_selection(0.0, [dear, plain], 1, 150.0) == [1]
    assert fitting_selection(0.0, [plain, plain], 1, 80.0) == [0]  # 20 + 20 + 40; two would take 100
    assert fitting_selection(30.0, [plain], 1, 100.0) == []  # a cold compiled incumbent's 30 s first
    assert fitting_selection(0.0, [plain, plain, plain], 2, 99.0) == [0, 1]  # one wave of two: 20 + 20 + 40
    assert fitting_selection(0.0, [plain, plain, plain], 2, 100.0) == [0, 1, 2]  # two waves: 100
    # a compile candidate whose comparisons fit (110 + 20 + 40 = 170) but whose final would not (130)
    assert fitting_selection(0.0, [dear], 1, 200.0) == [] and fitting_selection(0.0, [dear], 1, 260.0) == [0]


def test_the_final_measurement_counts_a_compile_warmup_for_each_compiled_system():
    """A knob-only final in the loaded process: the systems' warm-up, plus ~90 s (no compile seen yet)
    when the final system compiles; once a compiled open of 66 s was seen, 60 s."""
    compiled = Incumbent(Candidate(STOCK.with_changes(name="c", verify_compile=True)))
    ctx = run_context(config=LoopConfig(), deployment=DEPLOYMENT, device="cuda", stock=Candidate(STOCK), agents=(),
                      patches_stored=False)
    cost = cost_table(STOCK)
    plain_s = final_seconds(cost, ctx.bench, 1, "cuda", own_process=False, heldout=ctx.heldout_bench)
    assert final_seconds(cost, ctx.bench, 1, "cuda", own_process=False, compile_s=90.0,
                         heldout=ctx.heldout_bench) == plain_s + 90.0
    state = RoundState(index=1, done=0, incumbent=Incumbent(Candidate(STOCK)), noise=None)
    assert final_reserve(ctx, cost, state) == pytest.approx(plain_s)
    assert final_reserve(ctx, cost, replace(state, incumbent=compiled)) == pytest.approx(plain_s + 90.0)
    e = evaluation(compiled.candidate.system)
    seen = SimpleNamespace(evaluated=(SimpleNamespace(evaluation=replace(e, costs=replace(e.costs, open=66.0))),))
    state = replace(state, incumbent=compiled, outcomes=(seen,))
    assert final_reserve(ctx, cost, state) == pytest.approx(plain_s + 60.0)
