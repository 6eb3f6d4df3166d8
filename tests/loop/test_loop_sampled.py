"""The whole loop on CPU on a SAMPLED deployment (temperature 0.7, top-p 0.95): the controller
times request pairs with fixed seeds, the guard that gates the candidate is the sampling guard
(the journal and the report say so), and the final benchmark runs sampled."""

from __future__ import annotations

import io

import pytest

from specpilot.loop.config import LoopConfig, SlotPolicy, StopReason, Timing
from specpilot.loop.journal import JOURNAL_FILE, EventKind, Journal
from specpilot.loop.run import RunOptions, run_loop

from tests.loop.test_loop import CONTROLLER  # the same timing for every loop test run

pytestmark = [pytest.mark.slow, pytest.mark.whole_loop]  # a full loop run with real workers


@pytest.fixture(scope="module")
def run(tmp_path_factory, target_dir, drafter_dir):
    root = tmp_path_factory.mktemp("loop-sampled")
    dep = root / "sampled.toml"
    dep.write_text(f'name = "sampled"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\n'
                   "max_new_tokens = 24\nn_prompts = 2\nsets = [\"gsm8k\"]\n"
                   "[regime]\nbatch = 1\ntemperature = 0.7\ntop_p = 0.95\n"
                   "[stock]\ndepth = 8\ntopk = 8\ntree_budget = 64\n")  # a wide tree: slow on CPU
    config = LoopConfig(rounds=1, agents=("knob",), max_candidates=1, slots=SlotPolicy.ROUND_ROBIN,
                        timing=Timing.QUICK, profile_batches=1, profile_tokens=16, final_prompts=5, final_tokens=8,
                        controller=CONTROLLER)
    with pytest.MonkeyPatch.context() as mp:
        from specpilot.control import load

        mp.setattr(load, "default_probe", lambda: load.FixedProbe())  # a quiet machine, whatever this one does
        mp.setenv("SPECPILOT_HOME", str(root / "home"))
        mp.delenv("SPECPILOT_MEMORY", raising=False)
        stream = io.StringIO()
        result = run_loop(config, RunOptions(deployment=str(dep), out=str(root / "run"),
                                             memory=str(root / "memory.sqlite"), devices=("cpu",)), stream)
    return result, stream.getvalue()


def test_the_loop_gates_with_the_sampling_guard_and_benches_sampled(run):
    result, log = run
    assert result.stop is StopReason.ROUNDS and len(result.rounds) == 1, log
    (timed,) = result.rounds[0].evaluated
    e = timed.evaluation
    assert e.gate is not None and e.gate.summary["guard"] == "sampling", log
    assert e.gate.summary["candidate"]["tokens"] > 0 and e.gate.summary["stock"]["zero_probability"] == 0
    assert e.gate.passed, e.gate.reason  # the knob agent's move is exact speculative sampling
    if e.forced is not None:  # the guard again on timed outputs: sampling too
        assert e.forced.summary["guard"] == "sampling"
    events = Journal.read(result.paths.out / JOURNAL_FILE)
    (decision,) = [x.data for x in events if x.kind is EventKind.EVALUATION]
    assert decision["guard"]["kind"] == "sampling" and decision["guard"]["passed"] is True
    assert decision["guard"]["candidate_p"] is not None
    assert "sampling guard pass" in log
    assert result.report["controller"]["sampled"] is True
    final = result.report["final"]["bench"]
    assert final["config"]["sampling"]["temperature"] == 0.7
    assert all(s["identical"] is None for s in final["systems"])
    md = (result.paths.out / "report.md").read_text()
    assert "Sampled: temperature 0.7" in md
