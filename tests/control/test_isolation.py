"""Real worker processes with fake runners: placement, timing from outside, tampering, failures."""

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from fake_runners import WORKDIR, random_prompts, self_marker
from specpilot import env
from specpilot.control.backends.local import LocalBackend
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.controller import Controller, EvaluationError
from specpilot.control.gate import ALWAYS_PASS
from specpilot.control.rule import Reason, Outcome, decide, promotion_threshold
from specpilot.control.pair import WorkerPair
from specpilot.control.arm import ArmSpec
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.control.worker import FailureKind, Worker, WorkerError

pytestmark = pytest.mark.serial  # real workers timed under the process census; CI runs these after the parallel part

CONFIG = ControllerConfig(blocks=6, requests_per_block=2, extra_blocks=0, noise_blocks=6, max_new_tokens=8,
                          resamples=999, warmup_requests=1, request_timeout_s=20, startup_timeout_s=60)
# a quiet stand-in noise floor (measuring one costs seconds; its own test measures it)
NOISE = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, -0.0005, 0.0), resamples=999),
                   CONFIG.procedure_key(Placement.ALTERNATE))


def arm(kind="SpeedRunner", name=None, **knobs):
    return ArmSpec("fixture", {"name": name or kind, "seconds": 0.01, **knobs}, workdir=WORKDIR,
                      factory=f"fake_runners:{kind}")


def evaluate(candidate, incumbent=None, devices=("cpu",), config=CONFIG, noise=NOISE):
    backend = LocalBackend(list(devices))
    if noise.procedure != config.procedure_key(backend.placement):
        noise = replace(noise, procedure=config.procedure_key(backend.placement))
    c = Controller(config, backend, ALWAYS_PASS, random_prompts, "fixture")
    return c.evaluate(incumbent or arm(name="stock"), candidate, noise)


def assert_timed_from_outside(e, incumbent_seconds, candidate_seconds, config=CONFIG):
    """What the controller guarantees however busy the machine is: `blocks` blocks on its own clock,
    each arm's time per phase at least its runner's sleep (`seconds` x the block's prompts), each
    block's log ratio within the range of its request pairs' log time ratios (equal token counts
    here), an interval around the estimate, and the verdict the promotion rule gives for that
    estimate. How large the gain comes out, and so which verdict, depends on the load: not asserted."""
    est = e.estimate
    assert est is not None, (e.decision, e.error)
    assert est.n == len(e.timings) == config.blocks
    for block, x in zip(e.timings, est.log_ratios):
        pairs = []
        for a, b in zip(block["incumbent"], block["candidate"]):
            assert sum(a) >= incumbent_seconds * config.block_prompts
            assert sum(b) >= candidate_seconds * config.block_prompts
            pairs += [math.log(ta / tb) for ta, tb in zip(a, b)]
        assert min(pairs) - 1e-12 <= x <= max(pairs) + 1e-12
    assert math.isfinite(est.gain) and est.lower <= est.gain <= est.upper
    assert e.decision == decide(est, promotion_threshold(config, e.noise), config, look=config.looks)


def test_worker_environment_pins_one_gpu_and_turns_multicast_off(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    e = env.worker_environment("cuda:1")
    assert e["CUDA_VISIBLE_DEVICES"] == "6"
    assert (e["NCCL_NVLS_ENABLE"], e["TORCH_SYMM_MEM_DISABLE_MULTICAST"], e["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")
    assert env.worker_environment("cpu")["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(ValueError):
        env.worker_environment("cuda:2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert env.worker_environment("cuda:3")["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_worker_imports_the_controllers_package_without_an_install(monkeypatch, tmp_path):
    """`python -m specpilot run` in a checkout that is not installed: workers (started from their
    own folder, without site-packages here) still import this very package."""
    import subprocess
    import sys

    import specpilot

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    e = env.worker_environment(None)
    assert e["PYTHONPATH"].split(os.pathsep) == [str(Path(specpilot.__file__).resolve().parents[1]), "/elsewhere"]
    probe = [sys.executable, "-S", "-c", "import specpilot; print(specpilot.__file__)"]  # -S: no installed copy
    out = subprocess.run(probe, env=e, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and Path(out.stdout.strip()).resolve() == Path(specpilot.__file__).resolve()
    bare = {k: v for k, v in e.items() if k != "PYTHONPATH"}
    assert subprocess.run(probe, env=bare, cwd=tmp_path, capture_output=True).returncode != 0


@pytest.mark.slow
def test_alternate_times_a_faster_candidate_from_outside():
    e = evaluate(arm(name="fast", seconds=0.006))
    assert e.placement is Placement.ALTERNATE
    assert_timed_from_outside(e, 0.01, 0.006)
    assert e.outputs.runs == CONFIG.blocks * CONFIG.block_prompts and e.outputs.divergence_rate == 0
    assert e.costs.open > 0 and e.costs.timed_blocks > 0


RENDEZVOUS_RUNNER = """
import time
from pathlib import Path

class Runner:
    \"\"\"Each request of one arm waits (up to 5 s) for the same request of the other arm to start.\"\"\"

    def __init__(self, spec):
        knobs = spec.system
        self.dir, self.arm, self.other = Path(knobs["dir"]), knobs["arm"], knobs["other"]

    def warm(self, system, prompts, n):
        pass

    def run(self, system, prompts, n, stop_at_eos=True):
        seq = len(list(self.dir.glob(self.arm + ".*")))  # one request of an arm at a time
        (self.dir / f"{self.arm}.{seq}").touch()
        peer = self.dir / f"{self.other}.{seq}"
        deadline = time.monotonic() + 5.0
        while not peer.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        with open(self.dir / (self.arm + "-log"), "a") as f:
            f.write("met\\n" if peer.exists() else "alone\\n")
        return {"outputs": [[1] for _ in prompts]}
"""


@pytest.mark.slow
def test_side_by_side_two_workers_per_arm_swap_devices(tmp_path):
    """The two-GPU code path on CPU: four workers, arms run at once, devices swapped in every block.

    "At once" is checked by a rendezvous, not by wall time (which a busy machine stretches): each
    request waits for the other arm's to start, so arms run one after the other would not meet."""
    config = replace(CONFIG, placement=Placement.SIDE_BY_SIDE)
    (tmp_path / "rendezvous_runner.py").write_text(RENDEZVOUS_RUNNER)
    meet = tmp_path / "meet"
    meet.mkdir()

    def rendezvous(name, other):
        return ArmSpec("fixture", {"name": name, "dir": str(meet), "arm": name, "other": other},
                       workdir=str(tmp_path), factory="rendezvous_runner:Runner")

    with WorkerPair(rendezvous("a", "b"), rendezvous("b", "a"), ["cpu", "cpu"], config,
                    Placement.SIDE_BY_SIDE) as session:
        assert sorted((a.value, d) for a, d in session.workers) == [("A", 0), ("A", 1), ("B", 0), ("B", 1)]
        pids = {w.proc.pid for w in session.workers.values()}
        assert len(pids) == 4 and os.getpid() not in pids
        from specpilot.control.blocks import plan_block

        plan = plan_block(config, Placement.SIDE_BY_SIDE, 1, random_prompts(config.block_prompts, 1), "t")
        assert [(p.incumbent, p.candidate) for p in plan.phases] == [(1, 0), (0, 1)]
        r = session.run_block(plan)
    assert len(r.incumbent_seconds) == 2 and len(r.candidate_seconds[0]) == config.requests_per_block
    requests = len(plan.phases) * config.requests_per_block
    for name in ("a", "b"):
        assert (meet / f"{name}-log").read_text().split() == ["met"] * requests
    e = evaluate(arm(name="fast", seconds=0.006), devices=("cpu", "cpu"), config=config)
    assert e.placement is Placement.SIDE_BY_SIDE
    assert_timed_from_outside(e, 0.01, 0.006, config)


@pytest.mark.slow
def test_candidate_faking_its_clocks_cannot_win():
    """Really 50% slower; every clock in its own process runs 100x slow so it would 'see' itself fast.
    The statistic uses the controller's clock only: every timed request of the cheat took at least its
    real sleep and 100x what the cheat reported."""
    e = evaluate(arm("ClockCheatRunner", name="cheat", seconds=0.015))
    assert_timed_from_outside(e, 0.01, 0.015)
    for block in e.timings:
        for timed, reported in zip(block["candidate"][0], block["candidate_reported"][0]):
            assert 0 < 100 * reported <= timed + 1e-9


@pytest.mark.slow
def test_idle_arm_is_frozen_while_the_other_is_timed(tmp_path):
    pid_file, log = tmp_path / "pid", tmp_path / "states"
    incumbent = arm("WatcherRunner", name="stock", watch_pid_file=str(pid_file), log_file=str(log))
    candidate = arm("PidFileRunner", name="spinner", pid_file=str(pid_file))
    config = replace(CONFIG, blocks=5)
    evaluate(candidate, incumbent, config=config)
    states = log.read_text().split()
    assert len(states) >= config.blocks * config.requests_per_block and set(states) == {"T"}
    log.unlink()
    evaluate(candidate, incumbent, config=replace(config, freeze_idle=False))
    assert "T" not in log.read_text().split()  # the check above does discriminate


@pytest.mark.parametrize("kind, reason", [
    ("BadOutputRunner", Reason.BAD_OUTPUT),
    ("CrashRunner", Reason.WORKER_FAILED),
    ("BuildFailRunner", Reason.WORKER_FAILED),
])
@pytest.mark.slow
def test_failing_candidates_are_rejected(kind, reason):
    e = evaluate(arm(kind))
    assert e.verdict is Outcome.REJECT and e.decision.reasons == (reason,) and e.error


@pytest.mark.slow
def test_a_worker_cannot_make_the_controller_unpickle():
    marker = Path(self_marker())
    marker.unlink(missing_ok=True)
    e = evaluate(arm("PickleAttackRunner", name="evil", seconds=0.001))
    assert e.verdict is Outcome.REJECT and e.decision.reasons == (Reason.BAD_OUTPUT,)
    assert "not JSON" in e.error
    assert not marker.exists()


@pytest.mark.slow
def test_failing_incumbent_is_an_error_not_a_verdict():
    with pytest.raises(EvaluationError, match="incumbent failed"):
        evaluate(arm(), incumbent=arm("BuildFailRunner"))


@pytest.mark.slow
def test_worktree_comes_first_on_the_workers_path(tmp_path):
    (tmp_path / "specpilot").mkdir()
    (tmp_path / "specpilot" / "__init__.py").write_text("PATCHED = True\n")
    (tmp_path / "patched_runner.py").write_text(
        "import specpilot\n"
        "class Runner:\n"
        "    def __init__(self, spec):\n        self.flag = int(getattr(specpilot, 'PATCHED', False))\n"
        "    def warm(self, system, prompts, n):\n        pass\n"
        "    def run(self, system, prompts, n, stop_at_eos=True):\n"
        "        return {'outputs': [[self.flag] for _ in prompts]}\n")
    w = Worker.start(ArmSpec("fixture", {"name": "p"}, "cpu", str(tmp_path), "patched_runner:Runner"), "p", tmp_path)
    try:
        w.send({"op": "build", "spec": w.spec.to_dict()})
        w.wait_ready(20)
        info = w.receive()
        assert info["specpilot"] == str(tmp_path / "specpilot" / "__init__.py")
        w.send({"op": "run", "system": {"name": "p"}, "prompts": [[1], [2]], "max_new_tokens": 4})
        w.wait_ready(20)
        assert w.receive()["outputs"] == [[1], [1]]
        w.send({"op": "explode"})  # failures inside the worker are reported, not fatal
        w.wait_ready(20)
        with pytest.raises(WorkerError) as err:
            w.receive()
        assert err.value.kind is FailureKind.RAISED
    finally:
        w.close()
    assert w.proc.returncode is not None


@pytest.mark.slow
def test_stock_vs_stock_noise_with_real_workers():
    """What the measurement guarantees whatever the load: `noise_blocks` finite per-block log ratios,
    an interval around the A/A estimate, and the floor read off that interval as a relative gain
    (not seconds). How small it comes out depends on the machine, so that is not asserted."""
    backend = LocalBackend(["cpu"])
    noise = Controller(CONFIG, backend, ALWAYS_PASS, random_prompts, "fixture").measure_noise(arm(name="stock"))
    est = noise.estimate
    assert est.n == CONFIG.noise_blocks and all(math.isfinite(x) for x in est.log_ratios)
    assert est.resamples == CONFIG.resamples and est.lower <= est.gain <= est.upper
    assert math.isfinite(noise.value) and noise.value == max(abs(est.lower), abs(est.upper)) >= abs(est.gain)
    assert noise.procedure == CONFIG.procedure_key(Placement.ALTERNATE)


@pytest.mark.parametrize("collect", [True, False])
@pytest.mark.slow
def test_garbage_collection_runs_between_timed_requests_not_inside_them(tmp_path, collect):
    """With collect_garbage the workers' cyclic GC is off inside every timed request and a collection
    runs (untimed) before each; without it the GC stays on. The workers' own timings are kept apart."""
    config = replace(CONFIG, collect_garbage=collect)
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    with WorkerPair(arm("GarbageRunner", name="a", log=str(logs["a"])),
                          arm("GarbageRunner", name="b", log=str(logs["b"])), ["cpu"], config,
                          Placement.ALTERNATE) as session:
        from specpilot.control.blocks import plan_block

        for index in range(3):
            r = session.run_block(plan_block(config, Placement.ALTERNATE, index,
                                             random_prompts(config.block_prompts, index), "t"))
    for log in logs.values():
        rows = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
        timed = rows  # no warm-up requests in this session: every request was a timed one
        assert len(timed) == 3 * config.requests_per_block
        assert all(enabled == (not collect) for enabled, _ in timed)
        if collect:  # a collection between any two timed requests of the same worker
            assert all(b > a for (_, a), (_, b) in zip(timed, timed[1:]))
    t = r.timings()
    assert len(t["incumbent_reported"][0]) == config.requests_per_block
    # the worker's own account is never longer than the round trip the controller timed
    assert all(0 < rep <= ctl for rep, ctl in zip(t["incumbent_reported"][0], t["incumbent"][0]))
