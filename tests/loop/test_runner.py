"""`LoopRunner`: on GPU a system's first warm-up builds every workspace a timed request can need, so
no timed request pays for a new workspace (graph capture, prefill shapes) inside its timing."""

import pytest

import specpilot.loop.runner as loop_runner
from specpilot.config import load_deployment
from specpilot.control.arm import ArmSpec
from specpilot.engine.runner import SessionRunner, warm_workspaces, workspace_lengths
from specpilot.errors import ConfigError
from specpilot.loop.runner import LoopRunner

NEW = 16  # new tokens per request, warm-up and timed alike (as the controller sends them)
STOCK = {"name": "stock"}


@pytest.fixture(scope="module")
def gpu_like_runner():
    """The fixture's stock system on CPU, built as LoopRunner builds it for a GPU worker."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop_runner, "_on_cpu", lambda spec: False)
        runner = LoopRunner(ArmSpec("fixture", STOCK, device="cpu"))
    return runner


@pytest.mark.slow
def test_after_warm_up_the_longest_timed_prompt_builds_no_workspace(gpu_like_runner):
    runner = gpu_like_runner
    warm = [[5, 6, 7, 8, 9, 10, 11, 12]]
    runner.warm(STOCK, warm, NEW)
    gen = runner.generator(STOCK)
    built = dict(gen.workspaces)
    assert len(built) == gen.max_workspaces  # the smallest capacities, one workspace each
    # timed prompts of every length up to well past the longest prompt of the shipped sets
    for length in (3, 60, 300, 436, 700):
        runner.run(STOCK, [[7] * length], NEW)
        assert dict(gen.workspaces).keys() == built.keys(), f"a {length}-token prompt built a workspace"
    assert all(gen.workspaces[k] is built[k] for k in built)  # reused, not rebuilt
    # a second warm-up request (the controller sends two) does not redo it
    (before,) = runner.warmed.values()
    runner.warm(STOCK, warm, NEW)
    assert runner.warmed == {runner.system(STOCK).fingerprint(): before} and next(iter(runner.warmed.values())) is before


def test_workspace_lengths_start_each_capacity_smallest_first():
    class Gen:
        max_workspaces, max_positions = 3, 4000

        def capacity_for(self, n, new):
            return -(-(n + new + 75) // 256) * 256

    lengths = workspace_lengths(Gen(), 256)
    assert lengths == [1, 182, 438]  # capacities 512, 768, 1024
    caps = [Gen().capacity_for(n, 256) for n in lengths]
    assert caps == [512, 768, 1024] and Gen().capacity_for(181, 256) == 512


class Gen:
    """A generator that keeps two workspaces of a 1000-position context and records its requests."""

    max_workspaces, max_positions = 2, 1000

    def __init__(self, calls: list):
        self.calls = calls

    def capacity_for(self, n, new):
        if n + new > 1000:
            raise ConfigError("too long")
        return -(-(n + new) // 256) * 256

    def generate(self, prompts, new):
        self.calls.append(([len(p) for p in prompts], set(t for p in prompts for t in p), new))


def test_warm_up_runs_largest_first_on_the_warm_up_tokens_only():
    calls = []
    assert warm_workspaces(Gen(calls), 1, [[1, 2, 3]], 100) == [1, 157]
    assert calls == [([157], {1, 2, 3}, 100), ([1], {1}, 100)]


def test_each_systems_first_warm_up_builds_its_workspaces_again_once_it_was_forgotten():
    """Shared and isolated workers alike: per system, once; a system whose generator the runner
    dropped (`keep`) is rebuilt without workspaces, so its next warm-up builds them again."""
    calls, forgotten = [], []

    class Session:
        def generator(self, system):
            return Gen(calls)

        def forget(self, fingerprint):
            forgotten.append(fingerprint)

    runner = SessionRunner.__new__(SessionRunner)
    runner.deployment, runner.session, runner.keep, runner.workspaces = load_deployment("fixture"), Session(), 1, True
    runner.warmed, runner._recent = {}, []
    runner.run = lambda *args, **kwargs: None  # the warm-up request itself is not what is tested
    ar = {"name": "ar", "drafter": "none"}
    for knobs in (STOCK, STOCK, ar, STOCK):
        runner.warm(knobs, [[1, 2, 3]], 100)
    batch = runner.deployment.regime.batch
    assert [c[0] for c in calls] == [[157] * batch, [1] * batch] * 3  # stock, ar, stock again
    assert forgotten == [runner.system(STOCK).fingerprint(), runner.system(ar).fingerprint()]


def test_cpu_workers_build_no_workspaces_and_run_one_thread():
    import torch

    threads = torch.get_num_threads()
    try:
        runner = LoopRunner(ArmSpec("fixture", STOCK, device="cpu"))
        assert isinstance(runner, SessionRunner) and not runner.workspaces
        assert torch.get_num_threads() == loop_runner.CPU_THREADS
    finally:
        torch.set_num_threads(threads)
