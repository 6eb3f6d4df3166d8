"""Sampling through the engine: every path emits the target's processed distribution.

For one fixed context on the tiny random target, S rows of one batch with seeds 0..S-1 each emit
two tokens; the empirical law of (first token, second token) over the rows must match the
target's: p(t1) p(t2 | t1), both processed by the request's temperature, top-k and top-p, by a
chi-square test (cells expected below 5 pooled). AR, draft-model chains, trees and a shared-budget
tree, n-gram chains and tries, EAGLE-3 and DFlash chains and trees all pass (p > EXACT); the
engine with a broken acceptance rule or a wrongly processed target (`engine.faults`, sampled
kinds) fails (p < CAUGHT). The seeds are fixed, so every outcome is deterministic.

Also: temperature 0 (or no sampling) is today's greedy output token for token, a request's
tokens depend on its seed only (not on its batch), and bad settings are one clear error.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specpilot.config import TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.drafters.ngram import NgramDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.sampling import SamplingParams, process_logits
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.steps import chunk_forward, prefill
from specpilot.errors import ConfigError
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import load_dflash, write_dflash
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import write_noisy_drafter

S = 600  # rows = seeds
PARAMS = SamplingParams(1.0, top_k=6, top_p=0.8)
CONTEXT = [1117]  # one token: no prefill, so S rows cost little more than their rounds
# prompt lookup drafts 1078, 404, ... after the last 1117, and the target then gives 1078 p = 0.45
NGRAM_CONTEXT = [1117, 1078, 404, 1117]
EXACT = 1e-3  # an exact engine passes above this p-value
CAUGHT = 1e-6  # a faulted one fails below this


@pytest.fixture(scope="module")
def noisy(target_dir, tmp_path_factory):
    """A draft model close to the target: drafts are accepted often, to depth 2 and beyond."""
    return load_model(write_noisy_drafter(target_dir, tmp_path_factory.mktemp("noisy") / "drafter", noise=0.2))


@pytest.fixture(scope="module")
def eagle3(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle3")
    write_eagle3(random_eagle3(target.config, seed=3), out, dtype=torch.float32)
    return load_eagle3(out, target)


@pytest.fixture(scope="module")
def dflash(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash")
    write_dflash(random_dflash(target.config, num_layers=1, block_size=4, mask_token_id=5, seed=3), out,
                 dtype=torch.float32)
    return load_dflash(out, target)


def likely(target, context: list[int]) -> tuple[int, int, int]:
    """(a1, a2, b1): the target's two likeliest tokens after `context`, and its likeliest after a1."""
    a1, a2 = next_probs(target, context, PARAMS).topk(2).indices.tolist()
    return a1, a2, int(next_probs(target, context + [a1], PARAMS).argmax())


class OracleEagle3(Eagle3Drafter):
    """The real head's best-first tree (its cache filled by the real `observe`), with the first
    depth-1 node set to a1 and that node's first child to b1 in rows at CONTEXT (`likely`), so
    a random head's trees are accepted to depth 2: a drafter like any other, deterministic."""

    def __init__(self, *args, guesses, **kw):
        super().__init__(*args, **kw)
        self.guesses = guesses

    def propose(self, state, host_tokens=None):
        tree = super().propose(state)
        a1, _, b1 = self.guesses
        first = state.seq_lens == len(CONTEXT)  # [B] rows in their first round
        tree.tokens[:, 1] = torch.where(first, a1, tree.tokens[:, 1])
        child = (tree.parents == 1).float().argmax(1)  # [B] node 1's first child (0: none)
        has = (tree.parents == 1).any(1) & first
        tree.tokens[has, child[has]] = b1
        return tree


class OracleDFlash(DFlashDrafter):
    """The real DFlash block with a bonus on (a1, a2) at depth 1 and b1 at depth 2 (`likely`)."""

    def __init__(self, *args, guesses, **kw):
        super().__init__(*args, **kw)
        self.guesses = guesses

    def block_logprobs(self, state):
        lp = super().block_logprobs(state)  # [B,K,V]
        a1, a2, b1 = self.guesses
        bonus = torch.zeros_like(lp)
        bonus[:, 0, a1], bonus[:, 0, a2], bonus[:, 1, b1] = 50.0, 49.0, 50.0
        return torch.log_softmax(lp + bonus, -1)


def next_probs(target, context: list[int], params: SamplingParams) -> torch.Tensor:
    """The target's processed next-token distribution [V] after `context` (stock forward)."""
    cache = target.new_cache(1, 256)
    prefill(target, cache, [context])
    last = torch.tensor([[context[-1]]])
    logits = chunk_forward(target, cache, last, torch.tensor([len(context) - 1]))  # [1,1,V]
    return process_logits(logits[0, 0], params)


def joint_law(target, context: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    """{(t1, t2): p(t1) p(t2 | t1)} over the processed support."""
    p1 = next_probs(target, context, params)
    law = {}
    for t1 in p1.nonzero()[:, 0].tolist():
        p2 = next_probs(target, context + [t1], params)
        for t2 in p2.nonzero()[:, 0].tolist():
            law[(t1, t2)] = p1[t1].item() * p2[t2].item()
    return law


def pvalue(pairs: list[tuple[int, int]], law: dict[tuple[int, int], float]) -> float:
    """Chi-square goodness of fit of the pairs to `law`; 0 when a pair lies outside its support."""
    if any(pair not in law for pair in pairs):
        return 0.0
    cells = sorted(law)
    counts = torch.tensor([float(sum(1 for x in pairs if x == c)) for c in cells], dtype=torch.float64)
    expected = torch.tensor([law[c] for c in cells], dtype=torch.float64)
    expected = expected / expected.sum() * len(pairs)
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


def sample_pairs(gen: Generator, context: list[int], params: SamplingParams = PARAMS):
    """(first two tokens of each of S rows with seeds 0..S-1, the run's result)."""
    rows = [SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed=s) for s in range(S)]
    result = gen.generate([list(context)] * S, 2, stop_at_eos=False, sampling=rows)
    return [(o[0], o[1]) for o in result.outputs], result


@pytest.fixture(scope="module")
def laws(target):
    return {tuple(c): joint_law(target, c, PARAMS) for c in (CONTEXT, NGRAM_CONTEXT)}


SYSTEMS = {
    "ar": lambda m: {},
    "model-chain": lambda m: {3: DraftModelDrafter(m["noisy"], 3, 1, 3)},
    "model-tree": lambda m: {3: DraftModelDrafter(m["noisy"], 3, 3, 8)},
    "model-shared-budget": lambda m: {3: DraftModelDrafter(m["noisy"], 3, 3, 8, shared_budget=4)},
    "ngram-chain": lambda m: {3: NgramDrafter(3, 1, 3)},
    "ngram-trie": lambda m: {3: NgramDrafter(3, 2, 5)},
    "eagle3-chain": lambda m: {3: OracleEagle3(m["eagle3"], m["target"], 3, 1, 3, guesses=m["likely"])},
    "eagle3-tree": lambda m: {3: OracleEagle3(m["eagle3"], m["target"], 3, 3, 8, guesses=m["likely"])},
    "dflash-chain": lambda m: {3: OracleDFlash(m["dflash"], m["target"], 4, 3, TreeConstruction.CHAIN,
                                               guesses=m["likely"])},
    "ddtree": lambda m: {3: OracleDFlash(m["dflash"], m["target"], 4, 8, TreeConstruction.BEST_FIRST,
                                         guesses=m["likely"])},
}


@pytest.fixture(scope="module")
def models(target, noisy, eagle3, dflash):
    return {"target": target, "noisy": noisy, "eagle3": eagle3, "dflash": dflash, "likely": likely(target, CONTEXT)}


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_path_emits_the_target_distribution(target, models, laws, system):
    context = NGRAM_CONTEXT if system.startswith("ngram") else CONTEXT
    pairs, result = sample_pairs(Generator(target, SYSTEMS[system](models)), context)
    assert pvalue(pairs, laws[tuple(context)]) > EXACT
    if system != "ar":  # drafts were accepted: rows whose first round emitted both tokens
        assert sum(a[0] >= 2 for a in result.accept_lengths) / S > 0.1


# (the drafter's temperature on the target, `target-temperature:T`, is caught by the sampling guard's
# tests, tests/guard/test_sampled_forcing.py, and by this test as well: p < 1e-20 at 0.6)
FAULTS = ["sampling-rule:correction-from-p", "sampling-rule:residual-unnormalised", "target-top-p:1"]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulted_engine_is_caught(target, models, laws, fault):
    gen = Generator(target, SYSTEMS["model-tree"](models), fault=fault)
    pairs, _ = sample_pairs(gen, CONTEXT)
    assert pvalue(pairs, laws[tuple(CONTEXT)]) < CAUGHT


# -- greedy unchanged, reproducibility, errors ------------------------------------------------------


def test_temperature_zero_is_todays_greedy_output(target, models, make_prompts):
    prompts = make_prompts(4, seed=11)
    for system in ("ar", "model-tree", "ngram-trie"):
        gen = Generator(target, SYSTEMS[system](models))
        greedy = gen.generate(prompts, 12).outputs
        assert gen.generate(prompts, 12, sampling=SamplingParams(0.0)).outputs == greedy
        # one sampled row makes the batch a sampled one: its greedy rows stay greedy
        mixed = [SamplingParams(0.0)] * 3 + [SamplingParams(1.0, seed=3)]
        assert gen.generate(prompts, 12, sampling=mixed).outputs[:3] == greedy[:3]


@pytest.mark.parametrize("system", ["ar", "model-tree", "ngram-trie", "eagle3-tree"])
def test_a_requests_tokens_depend_on_its_seed_not_its_batch(target, models, make_prompts, system):
    prompts = make_prompts(3, seed=12)
    gen = Generator(target, SYSTEMS[system](models))
    params = [SamplingParams(0.9, top_p=0.9, seed=s) for s in (5, 6, 7)]
    together = gen.generate(prompts, 10, sampling=params).outputs
    alone = gen.generate(prompts[1:2], 10, sampling=params[1]).outputs
    reordered = gen.generate([prompts[1], prompts[0]], 10, sampling=[params[1], SamplingParams(1.0, seed=9)]).outputs
    assert alone[0] == together[1] == reordered[0]
    other = gen.generate(prompts[1:2], 10, sampling=SamplingParams(0.9, top_p=0.9, seed=8)).outputs
    assert other[0] != together[1]


def test_sampling_refuses_what_it_does_not_support(target, models):
    with pytest.raises(ConfigError, match="accept-unverified"):
        Generator(target, SYSTEMS["model-chain"](models), fault="accept-unverified").generate(
            [CONTEXT], 2, sampling=PARAMS)
    with pytest.raises(ConfigError, match="2 sampling parameters for 1 prompts"):
        Generator(target).generate([CONTEXT], 2, sampling=[PARAMS, PARAMS])


@pytest.mark.parametrize("system", ["ar", "model-tree", "ngram-trie"])
def test_continuous_batching_samples_each_request_as_alone(target, models, make_prompts, system):
    """Five requests through two slots (greedy and sampled mixed): each gets the tokens that
    generating it alone with its seed gives."""
    prompts = make_prompts(5, seed=13)
    params = [SamplingParams(0.8, top_k=20, seed=s) if s % 3 else None for s in range(5)]
    gen = Generator(target, SYSTEMS[system](models))
    served = ServingEngine(gen, slots=2).run([Request(tuple(p), 8, sampling=s) for p, s in zip(prompts, params)])
    for p, s, r in zip(prompts, params, served.requests):
        assert r.output == gen.generate([p], 8, sampling=s).outputs[0]
