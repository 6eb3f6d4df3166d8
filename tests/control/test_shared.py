"""Shared workers: which comparisons share one, settling, and a real comparison on CPU."""

from __future__ import annotations

import itertools
import math

import pytest

from specpilot.config import load_deployment, load_system
from specpilot.control.arm import ArmSpec
from specpilot.control.backends.local import LocalBackend
from specpilot.control.blocks import BlockResult
from specpilot.control.config import ControllerConfig
from specpilot.control.controller import Controller
from specpilot.control.defaults import runner_spec
from specpilot.control.gate import ALWAYS_PASS
from specpilot.control.shared import SharedPair, settle, shareable
from specpilot.engine.runner import SessionRunner

pytestmark = pytest.mark.serial  # real workers timed under the process census; CI runs these after the parallel part

RUNNER = "specpilot.engine.runner:SystemRunner"


def test_only_own_code_on_one_deployment_is_shared():
    a = ArmSpec("d.toml", {"name": "stock"}, factory=RUNNER)
    assert shareable(a, ArmSpec("d.toml", {"name": "tree", "depth": 7}, factory=RUNNER))
    assert not shareable(a, ArmSpec("d.toml", {"name": "patch"}, workdir="/tmp/wt", factory=RUNNER))  # a patch
    assert not shareable(a, ArmSpec("d.toml", {"name": "x"}, factory="fake_runners:FakeRunner"))  # unknown code
    assert not shareable(a, ArmSpec("e.toml", {"name": "x"}, factory=RUNNER))


def reply(per_token: float) -> dict:
    return {"timing": {"decode_s": per_token * 100, "tokens": 100}}


def test_settle_stops_once_three_requests_agree():
    times = iter([2.0, 1.5, 1.2, 1.001, 1.0, 1.002, 5.0])
    out = settle(lambda: reply(next(times)), tolerance=0.005, window=3, max_seconds=60)
    assert out.settled and out.trace == pytest.approx([2.0, 1.5, 1.2, 1.001, 1.0, 1.002])


def test_settle_gives_up_after_its_time():
    times = itertools.cycle([1.0, 1.1])
    out = settle(lambda: reply(next(times)), tolerance=0.005, window=3, max_seconds=0.0)
    assert not out.settled and len(out.trace) == 1


def test_block_statistic_is_the_median_of_request_pairs():
    # four request pairs: candidate 10% faster per token in three, one disturbed request (x3)
    block = BlockResult(0, ((1.0, 1.0, 3.0, 1.0),), ((1 / 1.1,) * 4,), ((),), ((),))
    assert block.log_ratio == pytest.approx(__import__("math").log(1.1))


def test_session_runner_times_fixed_length_requests(target_dir, drafter_dir, tmp_path):
    dep = tmp_path / "d.toml"
    dep.write_text(f'name = "t"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\n')
    runner = SessionRunner(ArmSpec(str(dep), {"name": "stock"}, device="cpu"))
    prompts = [[5, 6, 7], [9, 10]]
    stock = runner.run({"name": "stock"}, prompts, 12, stop_at_eos=False)
    ar = runner.run({"name": "ar", "drafter": "none"}, prompts, 12, stop_at_eos=False)
    assert stock["outputs"] == ar["outputs"] and all(len(o) == 12 for o in ar["outputs"])  # lossless, EOS ignored
    assert ar["timing"]["tokens"] == 24 and ar["timing"]["decode_s"] > 0 and ar["timing"]["gpu_s"] is None
    assert runner.session.target is runner.generator({"name": "stock"}).target  # one copy of the weights


@pytest.mark.slow
def test_a_knob_comparison_runs_in_one_persistent_worker(target_dir, drafter_dir, tmp_path):
    dep_path, config, backend, stock, ar = _stock_and_ar(target_dir, drafter_dir, tmp_path)
    source = lambda n, seed: [[1 + (seed + i) % 50, 2, 3] for i in range(n)]  # noqa: E731
    controller = Controller(config, backend, ALWAYS_PASS, source, str(dep_path))
    try:
        session = backend.open(stock, ar, config, [[[4, 5, 6]]])
        assert isinstance(session._session, SharedPair)
        pid = session._session.worker.proc.pid
        session.close()
        first = controller.evaluate(stock, ar, _noise(controller, stock))
        second = controller.evaluate(stock, ar, _noise(controller, stock))
        assert first.estimate.n == second.estimate.n == 5
        (worker,) = backend.shared._workers.values()
        assert worker.proc.pid == pid and worker.proc.poll() is None  # the same worker served every comparison
    finally:
        backend.close()
    assert worker.proc.poll() is not None  # closing the backend stops it


def _stock_and_ar(target_dir, drafter_dir, tmp_path):
    """A fixture deployment, a small controller config, a CPU backend, and stock and AR arms of it."""
    dep_path = tmp_path / "d.toml"
    dep_path.write_text(f'name = "t"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\nmax_new_tokens = 8\n')
    dep = load_deployment(str(dep_path))
    config = ControllerConfig(blocks=5, noise_blocks=5, requests_per_block=1, max_new_tokens=8, extra_blocks=0,
                              warmup_requests=1, resamples=199, settle_seconds=0.5, gate_prompts=1, pin_cpus=False)
    stock = runner_spec(str(dep_path), dep.stock, RUNNER)
    ar = runner_spec(str(dep_path), load_system("ar", dep), RUNNER)
    return dep_path, config, LocalBackend(devices=["cpu"]), stock, ar


def _noise(controller, stock):
    return controller.measure_noise(stock)


@pytest.mark.slow
def test_a_dead_shared_worker_rejects_the_candidate_and_is_replaced(target_dir, drafter_dir, tmp_path):
    import os
    import signal

    from specpilot.control.blocks import Arm
    from specpilot.control.pair import ArmFailure
    from specpilot.control.worker import FailureKind

    dep_path, config, backend, stock, ar = _stock_and_ar(target_dir, drafter_dir, tmp_path)
    try:
        session = backend.open(stock, ar, config, [[[4, 5, 6]]])
        pair = session._session
        dead = pair.worker
        os.kill(dead.proc.pid, signal.SIGKILL)  # dies between two requests (as a worker whose starting thread exited did, before `worker.spawn`)
        dead.proc.wait(10)
        with pytest.raises(ArmFailure) as failure:
            pair.generate(Arm.INCUMBENT, [[4, 5, 6]], 4)  # the incumbent's request finds it gone
        assert failure.value.arm is Arm.CANDIDATE and failure.value.kind is FailureKind.CRASHED
        assert "killed by SIGKILL" in str(failure.value) and str(dead.log_path) in str(failure.value)
        session.close()
        again = backend.open(stock, ar, config, [[[4, 5, 6]]])  # the next comparison: a new worker
        assert again._session.worker.proc.pid != dead.proc.pid and again._session.worker.proc.poll() is None
        assert again._session.generate(Arm.INCUMBENT, [[4, 5, 6]], 4)
        again.close()
        # stock against stock: nothing new to blame, the failure stays the incumbent's
        same = backend.open(stock, stock, config, [[[4, 5, 6]]])
        os.kill(same._session.worker.proc.pid, signal.SIGKILL)
        with pytest.raises(ArmFailure) as failure:
            same._session.generate(Arm.INCUMBENT, [[4, 5, 6]], 4)
        assert failure.value.arm is Arm.INCUMBENT
        same.close()
    finally:
        backend.close()
    assert dead.log_path.parent.is_dir()  # a worker died: the logs stay for the user, under the home
    from specpilot import env

    assert dead.log_path.parent.parent == env.home() / "workers"


def test_a_shared_block_carries_each_requests_saturated_stretches():
    """The runner's saturated seconds and tokens reach the block (continuous batching); a runner that
    reports none (static batches) leaves the block on whole requests."""
    from specpilot.control.blocks import Arm, BlockPlan, Phase, saturated_pairs

    def reply(arm, saturated):
        s, n = saturated[arm]
        return {"outputs": [[1, 2, 3], [4, 5]], "timing": {"decode_s": 2.0 if arm is Arm.INCUMBENT else 1.0,
                                                            "wall_s": 2.0, "wall_prefill_s": 0.0, "tokens": 5,
                                                            "saturated_s": s, "saturated_tokens": n}}

    plan = BlockPlan(0, ((1,), (2,)), 2, 8, (Phase(0, 0),), (Arm.INCUMBENT,))
    for saturated, expected in (({Arm.INCUMBENT: (1.0, 4), Arm.CANDIDATE: (0.5, 2)}, 0.0),
                                ({Arm.INCUMBENT: (None, None), Arm.CANDIDATE: (None, None)}, math.log(2.0 / 1.0))):
        pair = SharedPair.__new__(SharedPair)
        pair.config = ControllerConfig()
        pair.specs = {}
        pair._timed = lambda arm, request, n, s=saturated: reply(arm, s)
        block = pair.run_block(plan)
        assert block.log_ratio == pytest.approx(expected)
        assert saturated_pairs(block.timings()) == ((1 if saturated[Arm.INCUMBENT][0] else 0), 1)
