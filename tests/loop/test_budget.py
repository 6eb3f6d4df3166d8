"""The budget and the estimates a run spends it by."""

import time
from dataclasses import replace

import pytest
from loop_fixtures import CONFIG, DEPLOYMENT, STOCK, cost_table, evaluation, fingerprint, run_context

from specpilot.config import Regime
from specpilot.control.controller import Costs
from specpilot.loop.budget import Budget, evaluation_seconds, final_seconds, fitting_candidates, round_seconds
from specpilot.loop.final import bench_config
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
