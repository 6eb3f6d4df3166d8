"""The controller's logic on simulated arms (no processes): gate first, rule, outputs, rounds."""

from dataclasses import replace

import pytest

from fake_runners import random_prompts
from sim_backend import SimBackend
from specpilot.control.config import ControllerConfig, Multiplicity, Stage
from specpilot.control.controller import Controller, Costs, Evaluation
from specpilot.control.gate import ALWAYS_PASS, GateResult
from specpilot.control.rule import Decision, Reason, Outcome
from specpilot.control.arm import ArmSpec
from specpilot.control.stats import GainEstimate
from specpilot.errors import ConfigError

pytestmark = pytest.mark.serial  # real workers timed under the process census; CI runs these after the parallel part

CONFIG = ControllerConfig(resamples=1999, requests_per_block=4, max_new_tokens=8)


def spec(name, **knobs):
    return ArmSpec("sim", {"name": name, **knobs}, factory="sim:none")


STOCK = spec("stock")


def token_gate(request):
    """Passes only candidates whose tokens equal the incumbent's (a stand-in for the guard)."""
    same = request.candidate_outputs == request.incumbent_outputs
    return GateResult(same, {"identical": same}, "" if same else "tokens differ from the incumbent's")


def controller(backend=None, gate=token_gate, config=CONFIG):
    return Controller(config, backend or SimBackend(), gate, random_prompts, "sim")


@pytest.fixture(scope="module")
def noise():
    return controller().measure_noise(STOCK)


def test_noise_floor_is_stock_against_stock(noise):
    assert noise.procedure == CONFIG.procedure_key(SimBackend.placement)
    assert noise.estimate.n == CONFIG.noise_blocks
    assert abs(noise.estimate.gain) < 0.01 and 0 < noise.value < 0.01


@pytest.mark.parametrize("gain", [0.0, 0.3, 3.0])
def test_a_candidate_failing_the_guard_is_never_promoted_and_never_timed(noise, gain):
    backend = SimBackend()
    e = controller(backend).evaluate(STOCK, spec("lossy", gain=gain, wrong=True), noise)
    assert e.verdict is Outcome.REJECT and e.decision.reasons == (Reason.GUARD_FAILED,)
    assert e.estimate is None and not e.gate.passed
    assert backend.blocks() == [] and backend.closed == 1  # gated before any timing


def test_fast_lossless_candidate_is_promoted(noise):
    backend = SimBackend()
    e = controller(backend).evaluate(STOCK, spec("fast", gain=0.1), noise)
    assert e.verdict is Outcome.PROMOTE and e.decision.reasons == (Reason.CLEARS_THRESHOLD,)
    assert e.estimate.gain == pytest.approx(0.1, abs=0.01)
    assert e.decision.lower_bound > e.decision.threshold == pytest.approx(0.01 + 2 * noise.value)
    assert e.gate.passed and e.outputs.divergence_rate == 0 and e.outputs.token_ratio == 1
    assert e.costs.blocks == CONFIG.blocks and len(backend.blocks()) == CONFIG.blocks + CONFIG.warmup_blocks
    # gate prompts and warm-up prompts are never timed prompts
    gate_prompts = {p for entry in backend.log if entry[0] == "generate" for p in entry[2]}
    timed = {p for _, index, prompts in backend.blocks()[CONFIG.warmup_blocks:] for p in prompts}
    assert gate_prompts and not gate_prompts & timed


def test_slower_candidate_is_rejected_at_the_first_look(noise):
    e = controller().evaluate(STOCK, spec("slow", gain=-0.05), noise)
    assert e.verdict is Outcome.REJECT and e.decision.reasons == (Reason.BELOW_THRESHOLD,)
    assert e.decision.look == 1 and e.estimate.n == CONFIG.blocks


def test_undecided_candidate_gets_the_declared_extra_blocks_then_need_more_data(noise):
    e = controller(SimBackend(noise=0.05)).evaluate(STOCK, spec("marginal", gain=0.02), noise)
    assert e.verdict is Outcome.NEED_MORE_DATA and e.decision.reasons == (Reason.UNDECIDED,)
    assert e.estimate.n == CONFIG.max_blocks and e.decision.look == CONFIG.looks
    assert e.verdict.exit_code == 3


def test_candidate_returning_fewer_tokens_is_rejected_however_fast(noise):
    e = controller(gate=ALWAYS_PASS).evaluate(STOCK, spec("short", gain=0.5, short=True), noise)
    assert e.verdict is Outcome.REJECT and Reason.OUTPUTS_SHORTER in e.decision.reasons
    assert e.outputs.token_ratio < CONFIG.min_token_ratio


def test_round_corrects_gates_and_remeasures_the_winner(noise):
    backend = SimBackend(seed=3)
    candidates = [spec("none", gain=0.0), spec("small", gain=0.04), spec("big", gain=0.10),
                  spec("lossy", gain=0.5, wrong=True)]
    result = controller(backend).evaluate_round(STOCK, candidates, noise)
    none, small, big, lossy = result.evaluations
    assert lossy.decision.reasons == (Reason.GUARD_FAILED,) and lossy.estimate is None
    assert none.verdict is Outcome.REJECT
    assert result.winner == 2 and result.promoted is big
    assert big.stage is Stage.REMEASURE and Reason.REMEASURED in big.decision.reasons
    assert big.screening.stage is Stage.SCREEN and big.screening.estimate != big.estimate
    assert big.adjusted_p is not None and big.adjusted_p <= CONFIG.alpha
    assert small.verdict is Outcome.REJECT and small.decision.reasons[-1] is Reason.NOT_SELECTED
    # the re-measure ran on fresh prompts
    screened = {p for _, _, prompts in backend.blocks()[: -(CONFIG.warmup_blocks + big.estimate.n)] for p in prompts}
    fresh = {p for _, _, prompts in backend.blocks()[-big.estimate.n:] for p in prompts}
    assert not screened & fresh


def test_a_powered_evaluation_times_more_blocks_at_the_same_looks(noise):
    """Factor 2 (`ControllerConfig.powered`): an undecided candidate spends twice the blocks over the
    same pre-declared looks, each spending the same alpha; the estimate and costs count them all."""
    e = controller(SimBackend(noise=0.05)).evaluate(STOCK, spec("marginal", gain=0.02), noise, factor=2)
    assert e.verdict is Outcome.NEED_MORE_DATA and e.decision.reasons == (Reason.UNDECIDED,)
    assert e.estimate.n == e.costs.blocks == 2 * CONFIG.max_blocks
    assert e.decision.look == e.decision.looks == CONFIG.looks
    assert e.decision.alpha_look == pytest.approx(CONFIG.alpha / CONFIG.looks)


def test_a_round_powers_each_candidate_by_its_own_factor_screening_and_remeasure_alike(noise):
    backend = SimBackend(seed=5)
    result = controller(backend).evaluate_round(STOCK, [spec("slow", gain=-0.05), spec("fast", gain=0.10)], noise,
                                                factors=[1, 2])
    slow, fast = result.evaluations
    assert slow.verdict is Outcome.REJECT and slow.estimate.n == CONFIG.blocks and slow.decision.look == 1
    assert result.winner == 1 and fast.stage is Stage.REMEASURE and fast.verdict is Outcome.PROMOTE
    assert fast.estimate.n == fast.screening.estimate.n == 2 * CONFIG.blocks
    assert fast.decision.looks == slow.decision.looks == CONFIG.looks
    with pytest.raises(ConfigError, match="power factors"):
        controller().evaluate_round(STOCK, [spec("a"), spec("b")], noise, factors=[2])


def _fake_eval(name, p):
    verdict = Outcome.PROMOTE if p <= CONFIG.alpha else Outcome.REJECT
    est = GainEstimate((0.05, 0.06, 0.04, 0.05, 0.055), resamples=200)
    return Evaluation(STOCK, spec(name), Stage.SCREEN, SimBackend.placement,
                      Decision(verdict, (Reason.CLEARS_THRESHOLD,), 0.01, 0.03, 0.0083, 1, 3, p),
                      None, GateResult(True), est, None, Costs())


@pytest.mark.parametrize("method, significant", [(Multiplicity.HOLM, [0]), (Multiplicity.BH, [0, 1])])
def test_round_multiplicity(monkeypatch, noise, method, significant):
    """p = (0.006, 0.016, 0.5): Holm keeps only the first (0.016 * 2 > 0.025), BH keeps both."""
    c = controller(config=replace(CONFIG, multiplicity=method))
    ps = {"a": 0.006, "b": 0.016, "c": 0.5}

    def compare(incumbent, candidate, noise, stage, config, gate_result=None):
        e = _fake_eval(candidate.name, ps[candidate.name])
        return replace(e, stage=stage)

    monkeypatch.setattr(c, "_compare", compare)
    result = c.evaluate_round(STOCK, [spec("a"), spec("b"), spec("c")], noise)
    a, b, cc = result.evaluations
    assert result.winner == 0 and a.stage is Stage.REMEASURE
    assert cc.verdict is Outcome.REJECT
    if 1 in significant:
        assert b.decision.reasons[-1] is Reason.NOT_SELECTED
    else:
        assert b.verdict is Outcome.NEED_MORE_DATA and b.decision.reasons[-1] is Reason.NOT_SIGNIFICANT


def test_noise_from_another_procedure_is_refused(noise):
    other = controller(config=replace(CONFIG, requests_per_block=2))
    with pytest.raises(ConfigError, match="another timing procedure"):
        other.evaluate(STOCK, spec("x"), noise)


def test_evaluation_round_trips_through_plain_data(noise):
    e = controller().evaluate(STOCK, spec("fast", gain=0.1), noise)
    again = Evaluation.from_dict(e.to_dict())
    assert again.to_dict() == e.to_dict()
    assert again.estimate == e.estimate and again.decision == e.decision


def test_round_confirms_the_best_threshold_clearer_when_none_survives_the_correction(monkeypatch, noise):
    """p = (0.016, 0.02, 0.5): Holm keeps none, so the larger gain of the two that cleared the
    threshold alone is re-measured on fresh blocks; that one measurement decides."""
    c = controller()
    ps = {"a": 0.016, "b": 0.02, "c": 0.5}
    gains = {"a": (0.05, 0.06, 0.04, 0.05, 0.055), "b": (0.08, 0.09, 0.07, 0.08, 0.085), "c": (0.0,) * 5}
    stages = []

    def compare(incumbent, candidate, noise, stage, config, gate_result=None):
        stages.append((candidate.name, stage))
        e = _fake_eval(candidate.name, ps[candidate.name])
        return replace(e, stage=stage, estimate=GainEstimate(gains[candidate.name], resamples=200))

    monkeypatch.setattr(c, "_compare", compare)
    result = c.evaluate_round(STOCK, [spec("a"), spec("b"), spec("c")], noise)
    a, b, cc = result.evaluations
    assert result.winner == 1 and ("b", Stage.REMEASURE) in stages and ("a", Stage.REMEASURE) not in stages
    assert b.stage is Stage.REMEASURE and b.decision.reasons[-1] is Reason.REMEASURED
    assert a.verdict is Outcome.NEED_MORE_DATA and a.decision.reasons[-1] is Reason.NOT_SIGNIFICANT
    assert cc.verdict is Outcome.REJECT



@pytest.mark.parametrize("failure, fallback", [(Reason.WORKER_FAILED, True), (Reason.GUARD_FAILED, True),
                                               (Reason.BELOW_THRESHOLD, False)])
def test_a_winner_disqualified_at_its_remeasure_hands_the_remeasure_to_the_next(monkeypatch, noise, failure,
                                                                                 fallback):
    """BH keeps a (gain 8%) and b (5%): a is re-measured first. Where that re-measure disqualifies it
    (its worker died, its timed outputs failed the guard), b is re-measured in its place and
    promoted; where a is merely not confirmed, the round ends without b."""
    c = controller(config=replace(CONFIG, multiplicity=Multiplicity.BH))
    ps = {"a": 0.006, "b": 0.016, "c": 0.5}
    gains = {"a": (0.08, 0.09, 0.07, 0.08, 0.085), "b": (0.05, 0.06, 0.04, 0.05, 0.055), "c": (0.0,) * 5}
    stages = []

    def compare(incumbent, candidate, noise, stage, config, gate_result=None):
        stages.append((candidate.name, stage))
        e = replace(_fake_eval(candidate.name, ps[candidate.name]), stage=stage,
                    estimate=GainEstimate(gains[candidate.name], resamples=200))
        if stage is Stage.REMEASURE and candidate.name == "a":
            return replace(e, decision=Decision(Outcome.REJECT, (failure,), 0.01))
        return e

    monkeypatch.setattr(c, "_compare", compare)
    result = c.evaluate_round(STOCK, [spec("a"), spec("b"), spec("c")], noise)
    a, b, _ = result.evaluations
    assert a.stage is Stage.REMEASURE and a.decision.reasons == (failure, Reason.REMEASURED)
    assert a.screening.stage is Stage.SCREEN and a.screening.verdict is Outcome.PROMOTE
    if fallback:
        assert stages[-2:] == [("a", Stage.REMEASURE), ("b", Stage.REMEASURE)]
        assert result.winner == 1 and result.promoted is b and b.decision.reasons[-1] is Reason.REMEASURED
        assert b.screening.verdict is Outcome.PROMOTE  # its screening, before it was passed over
    else:
        assert ("b", Stage.REMEASURE) not in stages and result.winner == 0 and result.promoted is None
        assert b.decision.reasons[-1] is Reason.NOT_SELECTED
