"""The kernel agent: off on CPU; on a (simulated) GPU it tunes the shapes furthest from their floor."""

import json
from pathlib import Path
from types import SimpleNamespace

from loop_fixtures import context, git_repo

from specpilot.kernels import configs as kc
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat
from specpilot.kernels.search import Trial
from specpilot.loop.agents.base import AgentOptions, LoopSetup
from specpilot.loop.agents.kernel import KernelAgent, projection_shapes, table_document, tune
from specpilot.models.random_checkpoint import tiny_config

SLOW = LaunchConfig(KernelPath.GEMV, block_n=4, block_k=512)  # today's choice: no candidate of the search
FAST = kc.candidates(8)[1]  # a candidate of every shape at M = 8
BROKEN = kc.candidates(8)[0]


class SimulatedBench:
    """Today's config is SLOW everywhere; FAST is 2x faster on 'down' only; BROKEN fails the check;
    every other config the search tries is as fast as SLOW."""

    device_name = "NVIDIA H200"
    weight_format = WeightFormat.DENSE
    sm_count = 132

    def __init__(self):
        self.timed = []

    def current(self, shape):
        return SLOW

    def floor_us(self, shape):
        return shape.n * shape.k * 2 / 4e6  # 4 TB/s

    def time(self, problem, config):
        self.timed.append(((problem.n, problem.k), config))
        if config == BROKEN:
            return Trial(config, worst_error_over_bound=3.0, error="exceeds the error bound")
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0  # launch-bound: far above the floor
        return Trial(config, us=base / 2 if (config == FAST and (problem.n, problem.k) == (256, 1024)) else base)


def test_off_on_cpu_and_says_why(tmp_path):
    status = KernelAgent().status(LoopSetup(context().deployment, "cpu", "cpu-x86_64", None, tmp_path))
    assert not status.enabled and "cpu" in status.reason


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


class TransientBench(SimulatedBench):
    """Every candidate is as fast as today's config, but today's first timing of each shape is 10x slow."""

    def time(self, problem, config):
        first = all(nk != (problem.n, problem.k) for nk, _ in self.timed)
        self.timed.append(((problem.n, problem.k), config))
        return Trial(config, us=(3 * problem.n * problem.k * 2 / 4e6 + 200.0) * (10 if first else 1))


def test_a_slow_first_timing_of_todays_config_is_not_a_gain(tmp_path):
    from specpilot.loop.worktree import Checkout

    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    timings = tune(projection_shapes(config, rows=8, lm_head=False), TransientBench(), budget_s=60)
    assert not any(t.improved for t in timings)
    assert all(t.current_us == t.best_us for t in timings)
    checkout = Checkout.capture(git_repo(tmp_path / "repo"))
    models = SimpleNamespace(target=SimpleNamespace(config=config))
    ctx = context(checkout=checkout, scratch=tmp_path / "scratch", models=models)
    ctx.setup.scratch.mkdir()
    assert KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, TransientBench()) == []


def test_the_tuned_table_is_proposed_as_a_patch_with_triton_kernels(tmp_path):
    from specpilot.loop.worktree import Checkout

    checkout = Checkout.capture(git_repo(tmp_path / "repo"))
    models = SimpleNamespace(target=SimpleNamespace(config=tiny_config(hidden_size=256, intermediate_size=1024)))
    ctx = context(checkout=checkout, scratch=tmp_path / "scratch", models=models)
    ctx.setup.scratch.mkdir()
    (p,) = KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, SimulatedBench())
    assert p.candidate.system.kernel.value == "triton" and p.gap.value == "verify-kernels"
    table = Path(p.candidate.workdir) / "specpilot/kernels/tuned/nvidia_h200.json"
    entries = json.loads(table.read_text())["entries"]  # the shipped table's entries, plus the new one
    (tuned,) = [e for e in entries if (e["m"], e["n"], e["k"]) == (8, 256, 1024)]
    assert tuned["config"] == FAST.to_dict()
    assert "specpilot/kernels/tuned/nvidia_h200.json" in p.candidate.patch
    assert p.rationale.startswith("tuned launch configs for 1 projection shape(s) at M=8 (down ")
