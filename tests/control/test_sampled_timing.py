"""Timing under a sampled regime: every prompt a block, the gate or the forced sample sends carries a
seed, the same for both arms of a request pair; greedy comparisons send requests as before."""

from types import SimpleNamespace

from fake_runners import random_prompts
from sim_backend import SimBackend, SimSession
from specpilot.config import load_deployment
from specpilot.control import worker_main
from specpilot.control.arm import ArmSpec
from specpilot.control.blocks import derived_seed, plan_block, request_seeds
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.controller import Controller
from specpilot.control.defaults import default_config
from specpilot.control.gate import GateResult
from specpilot.control.pair import _run

CONFIG = ControllerConfig(resamples=999, requests_per_block=4, request_size=2, max_new_tokens=8, blocks=5,
                          extra_blocks=0, noise_blocks=5)
SAMPLED = ControllerConfig.from_dict({**CONFIG.to_dict(), "sampled": True})


class SeededSession(SimSession):
    """A simulated pair that logs the seeds each arm was asked to sample with."""

    def generate(self, arm, prompts, max_new_tokens, seeds=None):
        self.backend.log.append(("seeds", arm, tuple(seeds) if seeds is not None else None))
        return super().generate(arm, prompts, max_new_tokens)

    def run_block(self, plan):
        self.backend.log.append(("plan", plan))
        return super().run_block(plan)


class SeededBackend(SimBackend):
    def open(self, incumbent, candidate, config, warmup=()):
        return SeededSession(self, incumbent, candidate, config)


def spec(name, **knobs):
    return ArmSpec("sim", {"name": name, **knobs}, factory="sim:none")


def evaluate(config):
    backend, requests = SeededBackend(), []

    def gate(request):
        requests.append(request)
        return GateResult(True, {"guard": "test"})

    c = Controller(config, backend, gate, random_prompts, "sim")
    noise = c.measure_noise(spec("stock"))
    backend.log.clear()
    e = c.evaluate(spec("stock"), spec("fast", gain=0.5), noise)
    return e, backend.log, requests


def test_a_sampled_block_carries_a_seed_per_prompt_for_both_arms():
    plan = plan_block(SAMPLED, Placement.ALTERNATE, 3, random_prompts(8, 1), "timing")
    assert plan.seeds == tuple(derived_seed(0, "sampling", "timing", 3, i) for i in range(8))
    assert plan.request_seeds == [list(plan.seeds[i : i + 2]) for i in range(0, 8, 2)]
    again = plan_block(SAMPLED, Placement.ALTERNATE, 3, random_prompts(8, 1), "timing")
    assert again.seeds == plan.seeds  # a function of the plan's labels: a re-run sends the same seeds
    other = plan_block(SAMPLED, Placement.ALTERNATE, 4, random_prompts(8, 1), "timing")
    assert not set(other.seeds) & set(plan.seeds)
    greedy = plan_block(CONFIG, Placement.ALTERNATE, 3, random_prompts(8, 1), "timing")
    assert greedy.seeds == () and greedy.request_seeds == [None] * 4


def test_a_run_request_sends_its_seeds_only_when_it_has_some():
    worker = SimpleNamespace(spec=SimpleNamespace(system={"name": "x"}))
    assert "seeds" not in _run(worker, [[1, 2]], 4, False)
    assert _run(worker, [[1, 2], [3]], 4, False, [11, 12])["seeds"] == [11, 12]


def test_the_worker_passes_seeds_to_its_runner_only_when_sent():
    calls = []

    class Runner:
        def run(self, system, prompts, max_new_tokens, stop_at_eos, **kw):
            calls.append(kw)
            return {"outputs": [[1]] * len(prompts)}

    base = {"op": "run", "system": {}, "prompts": [[1], [2]], "max_new_tokens": 2}
    worker_main._handle(Runner(), base)
    worker_main._handle(Runner(), {**base, "seeds": [5, 6]})
    assert calls == [{}, {"seeds": [5, 6]}]


def test_the_controller_gives_both_arms_the_same_seeds_under_sampling():
    e, log, requests = evaluate(SAMPLED)
    assert e.estimate is not None
    generated = [entry for entry in log if entry[0] == "seeds"]
    assert len(generated) == 2 and generated[0][2] == generated[1][2]  # candidate's and incumbent's gate runs
    gate_seeds = generated[0][2]
    assert len(gate_seeds) == SAMPLED.gate_prompts and len(set(gate_seeds)) == SAMPLED.gate_prompts
    assert requests[0].seeds == gate_seeds  # the guard hears them
    plans = [entry[1] for entry in log if entry[0] == "plan"]
    assert plans and all(len(p.seeds) == SAMPLED.block_prompts for p in plans)
    assert len({s for p in plans for s in p.seeds}) == sum(len(p.seeds) for p in plans)  # fresh per prompt
    forced = requests[-1]  # the gate again, on timed requests: with those requests' seeds
    assert len(requests) == 2 and forced.seeds
    timed = {(prompt, seed) for p in plans for prompt, seed in zip(p.prompts, p.seeds)}
    assert set(zip(forced.prompts, forced.seeds)) <= timed


def test_a_greedy_comparison_sends_no_seeds():
    e, log, requests = evaluate(CONFIG)
    assert [entry[2] for entry in log if entry[0] == "seeds"] == [None, None]
    assert all(entry[1].seeds == () for entry in log if entry[0] == "plan")
    assert all(r.seeds == () for r in requests)


def test_the_defaults_follow_the_regime_and_greedy_procedures_keep_their_key():
    assert default_config(load_deployment("fixture-sampled")).sampled
    assert not default_config(load_deployment("fixture")).sampled
    assert request_seeds(CONFIG, 3, "gate", "x") == ()
    # the key every stored greedy noise floor was measured under (before `sampled` existed)
    assert ControllerConfig().procedure_key(Placement.ALTERNATE) == "df8e20eddce5134a"
    assert ControllerConfig(sampled=True).procedure_key(Placement.ALTERNATE) != "df8e20eddce5134a"

    assert ControllerConfig.from_dict(SAMPLED.to_dict()).sampled is True
