"""The worker-side runner under a sampled regime: each prompt samples with the seed it is sent."""

from types import SimpleNamespace

import pytest

from specpilot.config import load_deployment
from specpilot.engine.runner import SessionRunner, prompt_seeds, regime_sampling
from specpilot.errors import ConfigError

PROMPTS = [[5, 9, 11, 3], [7] * 12, [100, 200, 300]]


@pytest.fixture(scope="module")
def runner():
    return SessionRunner(SimpleNamespace(deployment="fixture-sampled", system={}, device="cpu"))


def test_a_seed_fixes_a_prompts_sample_and_another_seed_changes_it(runner):
    seeds = [3, 4, 5]
    first = runner.run({}, PROMPTS, 10, stop_at_eos=False, seeds=seeds)["outputs"]
    assert runner.run({}, PROMPTS, 10, stop_at_eos=False, seeds=seeds)["outputs"] == first
    other = [runner.run({}, PROMPTS, 10, stop_at_eos=False, seeds=[s + 1000 * k for s in seeds])["outputs"]
             for k in (1, 2)]
    assert any(o != first for o in other)  # sampled, not greedy: the seed moves the draws
    greedy = load_deployment("fixture")
    assert regime_sampling(greedy.regime, PROMPTS, seeds) is None  # a greedy regime ignores seeds


def test_prompts_sent_without_seeds_get_seeds_of_their_own():
    regime = load_deployment("fixture-sampled").regime
    params = regime_sampling(regime, [[1, 2], [1, 2]])
    assert [p.seed for p in params] == prompt_seeds([[1, 2], [1, 2]]) and params[0].seed != params[1].seed
    assert (params[0].temperature, params[0].top_p) == (0.7, 0.95)
    with pytest.raises(ConfigError, match="2 sampling seeds for 3 prompts"):
        regime_sampling(regime, PROMPTS, [1, 2])
