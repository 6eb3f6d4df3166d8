"""`LoopRunner`: on GPU its warm-up builds every workspace a timed request can need, so no timed
request pays for a new workspace (graph capture, prefill shapes) inside its timing."""

import pytest

import specpilot.loop.runner as loop_runner
from specpilot.control.arm import ArmSpec
from specpilot.loop.runner import LoopRunner, WarmedRunner, warm_workspaces, workspace_lengths

NEW = 16  # new tokens per request, warm-up and timed alike (as the controller sends them)


@pytest.fixture(scope="module")
def gpu_like_runner():
    """The fixture's stock system on CPU, built as LoopRunner builds it for a GPU worker."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop_runner, "_on_cpu", lambda spec: False)
        runner = LoopRunner(ArmSpec("fixture", {"name": "stock"}, device="cpu"))
    return runner


@pytest.mark.slow
def test_after_warm_up_the_longest_timed_prompt_builds_no_workspace(gpu_like_runner):
    runner = gpu_like_runner
    warm = [[5, 6, 7, 8, 9, 10, 11, 12]]
    runner.warmup(warm, NEW)
    gen = runner.generator
    built = dict(gen.workspaces)
    assert len(built) == gen.max_workspaces  # the smallest capacities, one workspace each
    # timed prompts of every length up to well past the H200 streams' longest (436 tokens)
    for length in (3, 60, 300, 436, 700):
        runner.generate([[7] * length], NEW)
        assert dict(gen.workspaces).keys() == built.keys(), f"a {length}-token prompt built a workspace"
    assert all(gen.workspaces[k] is built[k] for k in built)  # reused, not rebuilt
    # a second warm-up request (the controller sends two) does not redo it
    before = runner.warmed
    runner.warmup(warm, NEW)
    assert runner.warmed is before


def test_workspace_lengths_start_each_capacity_smallest_first():
    class Gen:
        max_workspaces, max_positions = 3, 4000

        def capacity_for(self, n, new):
            return -(-(n + new + 75) // 256) * 256

    lengths = workspace_lengths(Gen(), 256)
    assert lengths == [1, 182, 438]  # capacities 512, 768, 1024
    caps = [Gen().capacity_for(n, 256) for n in lengths]
    assert caps == [512, 768, 1024] and Gen().capacity_for(181, 256) == 512


def test_warm_up_runs_largest_first_on_the_warm_up_tokens_only():
    calls = []

    class Gen:
        max_workspaces, max_positions = 2, 1000

        def capacity_for(self, n, new):
            if n + new > 1000:
                from specpilot.errors import ConfigError

                raise ConfigError("too long")
            return -(-(n + new) // 256) * 256

        def generate(self, prompts, new):
            calls.append(([len(p) for p in prompts], set(t for p in prompts for t in p), new))

    class Runner:
        generator = Gen()

    assert warm_workspaces(Runner(), [[1, 2, 3]], 100) == [1, 157]
    assert calls == [([157], {1, 2, 3}, 100), ([1], {1}, 100)]


def test_cpu_workers_are_the_plain_system_runner():
    runner = LoopRunner(ArmSpec("fixture", {"name": "stock"}, device="cpu"))
    assert not isinstance(runner, WarmedRunner)
