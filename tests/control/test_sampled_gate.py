"""The guard gate of a sampled deployment is the sampling guard (PIT uniformity of the sampled
outputs forced through the stock target), not token forcing; it passes an exact speculative
sampler's outputs and rejects tokens the target's processed distribution cannot emit."""

import pytest

from specpilot.config import load_deployment
from specpilot.control.arm import ArmSpec
from specpilot.control.gate import GateRequest, controller_gate
from specpilot.engine.runner import sampling_params
from specpilot.guard.gate import cached_session

DEPLOYMENT = "fixture-sampled"
PROMPTS = ((5, 9, 11, 3), (7, 8, 9, 10, 11, 12), (100, 200, 300), (42, 43, 44, 45))
SEEDS = (11, 12, 13, 14)
TOKENS = 24


def request(outputs) -> GateRequest:
    arm = ArmSpec(DEPLOYMENT, {"name": "stock"}, device="cpu")
    return GateRequest(DEPLOYMENT, arm, arm, PROMPTS, tuple(tuple(o) for o in outputs), (), TOKENS, SEEDS)


@pytest.fixture(scope="module")
def speculative_outputs():
    session = cached_session(DEPLOYMENT, "cpu")
    sampling = session.deployment.regime.sampling
    result = session.generator(session.deployment.stock).generate(
        [list(p) for p in PROMPTS], TOKENS, sampling=[sampling_params(sampling, s) for s in SEEDS])
    return result.outputs


def test_a_sampled_deployment_is_judged_by_the_sampling_guard(speculative_outputs):
    verdict = controller_gate(request(speculative_outputs))
    assert verdict.summary["guard"] == "sampling" and verdict.summary["baseline"] == "stock-ar"
    assert verdict.summary["sampling"]["temperature"] == 0.7
    assert verdict.summary["candidate"]["tokens"] == sum(len(o) for o in speculative_outputs)
    assert verdict.summary["stock"]["zero_probability"] == 0
    assert "few-tokens" in verdict.summary["cautions"]  # a gate's cheap subset is far below 16384 tokens
    assert verdict.passed, verdict.reason  # exact speculative sampling


def test_tokens_outside_the_nucleus_fail_it(speculative_outputs):
    vocab = cached_session(DEPLOYMENT, "cpu").target.config.vocab_size
    bad = [list(o[:-1]) + [vocab - 1] for o in speculative_outputs]  # the last token: one the nucleus never holds
    verdict = controller_gate(request(bad))
    assert not verdict.passed and "zero-probability" in verdict.summary["violated"]
    assert verdict.reason.startswith("sampling guard:") and "target probability 0" in verdict.reason


def test_a_greedy_deployment_keeps_token_forcing():
    assert not load_deployment("fixture").regime.sampled
    session = cached_session("fixture", "cpu")
    out = session.generator(session.deployment.stock).generate([list(PROMPTS[0])], 8).outputs
    arm = ArmSpec("fixture", {"name": "stock"}, device="cpu")
    verdict = controller_gate(GateRequest("fixture", arm, arm, PROMPTS[:1], (tuple(out[0]),), (), 8))
    assert verdict.summary["guard"] == "token-forcing" and verdict.passed
