"""Tuning projection shapes on a simulated bench (CPU): ranked by their excess over the floor, the
fallbacks timed before the search spends the budget, a log line per shape searched; and the GPU
bench's rotating weight sets."""

from functools import partial
from types import SimpleNamespace

import pytest

from specpilot.engine.round_shapes import projection_shapes
from specpilot.kernels import shape_tuning
from specpilot.kernels.configs import Fallback, KernelPath, LaunchConfig, WeightFormat
from specpilot.kernels.search import Problem
from specpilot.kernels.shape_tuning import GpuKernelBench, table_document, tune
from specpilot.models.random_checkpoint import tiny_config
from tests.kernels.simulated_bench import BROKEN, FAST, SLOW, SimulatedBench, W12Bench

def test_shapes_are_tuned_in_order_of_their_excess_and_only_improvements_enter_the_table():
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    shapes = projection_shapes(config, rows=8, lm_head=False)
    assert [(s.name, s.m, s.n, s.k, s.count) for s in shapes] == [  # 4 heads, 2 kv heads of 16
        ("qkv", 8, 128, 256, 4), ("o", 8, 256, 64, 4), ("gate_up", 8, 2048, 256, 4), ("down", 8, 256, 1024, 4)]
    bench = SimulatedBench()
    timings = tune(shapes, bench, budget_s=60)
    excess = [t.excess_us for t in timings]
    assert excess == sorted(excess, reverse=True)
    assert [t.shape.name for t in timings if t.improved] == ["down"]
    for t in timings:  # the search's configs, each once; today's before and after the search only
        mine = [c for nk, c in bench.timed if nk == (t.shape.n, t.shape.k)]
        assert t.tried == len(mine) - 2 > 2 and mine.count(SLOW) == 2 and len(set(mine)) == len(mine) - 1
        assert mine[0] == mine[-1] == SLOW and BROKEN in mine and FAST in mine
    existing = {("dense", 1, 4096, 4096): SLOW}
    doc = table_document("NVIDIA H200", "dense", existing, timings)
    keys = [(e["format"], e["m"], e["n"], e["k"]) for e in doc["entries"]]
    assert keys == [("dense", 1, 4096, 4096), ("dense", 8, 256, 1024)] and doc["entries"][1]["config"] == FAST.to_dict()
    assert tune(shapes, SimulatedBench(), budget_s=0)[0].tried == 0  # no budget: today's configs only


@pytest.mark.parametrize("w12", [False, True])
def test_the_bench_times_each_shape_over_copies_of_its_weight_beyond_l2(w12):
    """A shape's calls rotate over the model's weight and fresh copies of it, together past
    L2_COVER_BYTES (a single weight would stay in L2 and time faster than a forward reads it);
    each copy gives the model weight's output."""
    import torch

    from specpilot.engine.round_shapes import projection_weight
    from specpilot.kernels import timing
    from specpilot.models.transformer import Transformer

    torch.manual_seed(0)
    target = Transformer(tiny_config(hidden_size=64, intermediate_size=128, num_layers=2)).bfloat16()
    bench = GpuKernelBench(partial(projection_weight, [target]), target.device, w12, 1000.0)
    fmt = WeightFormat.W12 if w12 else WeightFormat.DENSE
    problem = Problem(fmt, 256, 64, 3)
    sets = bench._timer.case(problem)[1]
    assert len(sets) == timing.MAX_SETS  # 64 x 256 is far below L2: as many copies as allowed
    planes = [s.lo if w12 else s for s in sets]
    assert len({t.data_ptr() for t in planes}) == len(sets)
    weight = target.layers[0].mlp.gate_up_proj.weight
    if w12:  # the planes of the weight's encoding, copied (decoding them needs the Triton kernels)
        from specpilot.w12 import encode

        first = encode(weight).planes()
        assert all(torch.equal(s.planes()[k], v) for s in sets for k, v in first.items())
        assert all(not s.derived for s in sets)
    else:
        expected = torch.nn.functional.linear(bench._timer.case(problem)[0], weight)  # [3, 256]
        outputs = [c() for c in bench.calls(problem, Fallback.UNPACK_CUBLAS)]
        assert len(outputs) == len(sets)
        assert all(torch.equal(y.view(torch.int16), expected.view(torch.int16)) for y in outputs)
    assert len(bench.calls(problem, LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128, num_warps=2))) == len(sets)
    assert timing.weight_sets(4096, 4096, 4096 * 4096 * 2) == 6  # 33.6 MB each: 6 past 200 MB
    assert timing.weight_sets(151936, 4096, 151936 * 4096 * 2) == timing.MIN_SETS


def test_w12_above_the_kernels_rows_takes_the_faster_decoded_path():
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    timings = tune(projection_shapes(config, rows=129, lm_head=False) + projection_shapes(config, 8, False),
                   W12Bench(), budget_s=60)
    assert len(timings) == 8 and all(t.improved for t in timings)
    assert {t.best["path"] for t in timings} == {"decoded_cublas"}
    assert all(t.complete for t in timings)  # within the budget: every config and fallback timed
    above = [t for t in timings if t.shape.m == 129]
    assert all(t.current == {"path": "unpack_cublas"} and t.tried == 0 for t in above)  # no kernel search there
    doc = table_document("NVIDIA H200", "w12", {}, timings)
    assert {(e["m"], e["path"]) for e in doc["entries"]} == {(256, "decoded_cublas"), (8, "decoded_cublas")}


def test_the_fallbacks_are_timed_before_the_search_spends_the_budget(monkeypatch):
    """A search that uses up the budget (each config timing a second on the tuner's clock) leaves
    every shape its decoded-cuBLAS timing: above 64 rows the only choice besides today's."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(shape_tuning, "time", SimpleNamespace(monotonic=lambda: clock.now))

    class SlowSearchBench(W12Bench):
        def time(self, problem, config):
            clock.now += 1.0
            return super().time(problem, config)

    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    bench = SlowSearchBench()
    timings = tune(projection_shapes(config, rows=129, lm_head=False) + projection_shapes(config, 8, False),
                   bench, budget_s=6)
    assert clock.now > 6  # the search ran past the budget
    assert {t.best["path"] for t in timings} == {"decoded_cublas"}
    # fallbacks timed, configs not searched: complete above 64 rows only (nothing else to time there)
    assert [t.shape.m for t in timings if t.complete] == [129] * 4


def test_the_log_names_each_searched_or_improved_shape_and_counts_the_rest():
    """A line per shape the search took (or that improved), one line for the shapes only timed: at
    concurrency 8 on the H200 the prefill buckets were 36 of 45 lines, each 'over 0 configs'."""
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    shapes = projection_shapes(config, rows=8, lm_head=False) + projection_shapes(config, rows=512, lm_head=False)
    lines = []
    timings = tune(shapes, SimulatedBench(unpack_fast={(128, 256)}), budget_s=60, log=lines.append)
    searched = [t for t in timings if t.tried or t.improved]
    assert {(t.shape.m, t.shape.name) for t in searched} == {(8, n) for n in ("qkv", "o", "gate_up", "down")} | {
        (512, "qkv")}  # M=512 'qkv': cuBLAS on the decoded weight beats today's config
    assert lines[:-1] == [line for line in lines if " M=" in line] and len(lines) == len(searched) + 1
    assert "(unpack_cublas) over 0 configs" in next(line for line in lines if "M=512" in line)
    assert lines[-1].startswith("kernel: 3 more shape(s) timed but searched by no config")
