"""Containment: what a candidate starts stays in its worker and dies with it; foreign CPU voids
blocks; the gate draws fresh prompts and token-forces a sample of the timed outputs."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fake_runners import WORKDIR, random_prompts
from sim_backend import SimBackend
from specpilot.control.arm import ArmSpec
from specpilot.control.backends.local import LocalBackend
from specpilot.control.census import Census, read_proc
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.controller import MAX_VOID_BLOCKS, Controller
from specpilot.control.gate import GateResult
from specpilot.control.rule import Outcome, Reason
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.control.worker import Worker

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="containment reads /proc"), pytest.mark.serial]

# requests long enough that a burner running while the incumbent is timed shows in every block
CONFIG = ControllerConfig(blocks=6, requests_per_block=4, extra_blocks=0, noise_blocks=6, max_new_tokens=8,
                          resamples=999, warmup_requests=1, request_timeout_s=20, startup_timeout_s=60)
NOISE = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, -0.0005, 0.0), resamples=999),
                   CONFIG.procedure_key(Placement.ALTERNATE))


def arm(kind="SpeedRunner", name=None, seconds=0.05, **knobs):
    return ArmSpec("fixture", {"name": name or kind, "seconds": seconds, **knobs}, workdir=WORKDIR,
                   factory=f"fake_runners:{kind}")


def token_gate(request):
    """Passes only outputs equal to the incumbent's (a stand-in for the token-forcing guard)."""
    same = request.candidate_outputs == request.incumbent_outputs
    return GateResult(same, {"identical": same, "prompts": len(request.prompts)},
                      "" if same else "tokens differ from the incumbent's")


def evaluate(candidate, gate=token_gate, config=CONFIG):
    noise = replace(NOISE, procedure=config.procedure_key(Placement.ALTERNATE))
    return Controller(config, LocalBackend(["cpu"]), gate, random_prompts, "fixture").evaluate(
        arm(name="stock"), candidate, noise)


def live(pid: int) -> bool:
    p = read_proc(pid)
    return p is not None and p.state not in "ZX"


def pids_in(path: Path, count: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [int(x) for x in path.read_text().split()] if path.exists() else []
        if len(pids) >= count:
            return pids
        time.sleep(0.01)
    raise AssertionError(f"{path} holds fewer than {count} pids")


def kill_leftovers(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_worker_stops_and_kills_every_process_its_runner_detached(tmp_path):
    pid_file = tmp_path / "burners"
    w = Worker.start(arm("DetachedBurnerRunner", pid_file=str(pid_file), burners=2).placed("cpu"), "b", tmp_path)
    pids = []
    try:
        w.send({"op": "build", "spec": w.spec.to_dict()})
        w.wait_ready(30)
        w.receive()
        pids = pids_in(pid_file, 2)
        tree = w.track()
        assert set(pids) <= set(tree)  # re-parented to the worker (its subreaper), not to init
        assert all(read_proc(pid).sid != w.proc.pid for pid in pids)  # out of the worker's session
        w.freeze()
        assert all(read_proc(pid).state == "T" for pid in pids)
        w.thaw()
        time.sleep(0.05)
        assert all(read_proc(pid).state != "T" for pid in pids)
    finally:
        w.close()
        alive = [pid for pid in pids if live(pid)]
        kill_leftovers(pids)
    assert not alive


@pytest.mark.slow
@pytest.mark.parametrize("escape", [False, True], ids=["contained", "escaped"])
def test_a_detached_cpu_burner_does_not_win_and_leaves_nothing_behind(tmp_path, escape):
    """The issue's no-op candidate: two detached processes burn CPU while the incumbent is timed.
    Contained (the worker is their subreaper) they are frozen with their arm; escaped (the runner
    switched the subreaper off) the census sees them and voids the blocks. Either way they are
    dead when the evaluation returns."""
    pid_file = tmp_path / "burners"
    candidate = arm("DetachedBurnerRunner", name="burner", pid_file=str(pid_file), burners=2, escape=escape)
    pids = []
    try:
        e = evaluate(candidate)
        pids = pids_in(pid_file, 2)
        alive = [pid for pid in pids if live(pid)]
    finally:
        kill_leftovers(pids)
    assert e.verdict is not Outcome.PROMOTE
    assert not alive
    if escape:
        assert e.decision.reasons == (Reason.CONTAMINATED,) and e.verdict is Outcome.NEED_MORE_DATA
        assert e.census.void_blocks == MAX_VOID_BLOCKS + 1 and e.census.foreign
        assert e.error and "void blocks" in e.error


def test_lossless_on_the_gate_lossy_on_timed_prompts_is_rejected():
    """Honest on its first request (the gate's), wrong on every timed one, and fast: the gate passes,
    the forced sample of timed outputs fails."""
    e = evaluate(arm("HonestFirstRunner", name="two-faced", seconds=0.006), config=replace(CONFIG, requests_per_block=2))
    assert e.gate.passed
    assert e.forced is not None and not e.forced.passed and len(e.forced.summary["forced_requests"]) == 2
    assert e.verdict is Outcome.REJECT and Reason.GUARD_FAILED in e.decision.reasons
    assert e.estimate is not None and e.estimate.n == CONFIG.blocks  # it was timed: only the forcing caught it


def test_gate_prompts_are_fresh_for_every_evaluation_and_reproducible():
    def gate_prompts(controller, backend, candidate):
        start = len(backend.log)
        controller.evaluate(ArmSpec("sim", {"name": "stock"}, factory="sim:none"), candidate, noise)
        return {p for entry in backend.log[start:] if entry[0] == "generate" for p in entry[2]}

    config = ControllerConfig(resamples=999, requests_per_block=4, max_new_tokens=8)
    noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, -0.0005, 0.0), resamples=999),
                       config.procedure_key(Placement.ALTERNATE))
    fast = ArmSpec("sim", {"name": "fast", "gain": 0.1}, factory="sim:none")
    other = ArmSpec("sim", {"name": "other", "gain": 0.1}, factory="sim:none")
    runs = []
    for _ in range(2):
        backend = SimBackend()
        c = Controller(config, backend, token_gate, random_prompts, "sim")
        runs.append([gate_prompts(c, backend, fast), gate_prompts(c, backend, fast), gate_prompts(c, backend, other)])
    first, again = runs
    assert first == again  # a fresh controller draws the same sequence
    assert first[0] != first[1] and first[0] != first[2]  # every evaluation draws afresh
    assert all(len(p) == config.gate_prompts for p in first)


def test_sampled_forcing_rejects_a_candidate_lossy_only_on_timed_prompts_sim():
    """The same check on simulated arms: the forced sample is drawn from the timed outputs."""

    class TwoFaced(SimBackend):
        def open(self, incumbent, candidate, config, warmup=()):
            session = super().open(incumbent, candidate, config, warmup)
            plain = session.run_block

            def run_block(plan):
                r = plain(plan)
                wrong = tuple(tuple(tuple((t + 1) % 997 for t in o) for o in phase) for phase in r.candidate_outputs)
                return replace(r, candidate_outputs=wrong)

            session.run_block = run_block
            return session

    config = ControllerConfig(resamples=999, requests_per_block=4, max_new_tokens=8)
    noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, -0.0005, 0.0), resamples=999),
                       config.procedure_key(Placement.ALTERNATE))
    c = Controller(config, TwoFaced(), token_gate, random_prompts, "sim")
    e = c.evaluate(ArmSpec("sim", {"name": "stock"}, factory="sim:none"),
                   ArmSpec("sim", {"name": "fast", "gain": 0.2}, factory="sim:none"), noise)
    assert e.gate.passed and not e.forced.passed
    assert e.verdict is Outcome.REJECT and e.decision.reasons[-1] is Reason.GUARD_FAILED


BURN = "import time\nt = time.monotonic() + 20\nwhile time.monotonic() < t: pass\n"


def _orphan_burner() -> int:
    """A CPU burner orphaned to init (started by a shell that exits at once); returns its pid."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c '{BURN}' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_census_blames_new_orphans_not_pre_existing_load():
    old = _orphan_burner()  # unrelated load that was there before the comparison began
    new = None
    try:
        census = Census()
        new = _orphan_burner()  # an orphan that appeared during it
        time.sleep(0.1)
        before = census.snapshot()
        time.sleep(0.5)
        after = census.snapshot()
        c = census.judge(before, after, tracked={})
        assert c.void and c.foreign and all(line.split()[0] == str(new) for line in c.foreign)
        assert c.background_cpu_s > 0.05  # the old burner: reported, not blamed
    finally:
        kill_leftovers([p for p in (old, new) if p])
