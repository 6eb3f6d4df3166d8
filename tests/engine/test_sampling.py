"""The logit processor against a direct per-row reference, parameter validation, seeded draws."""

import math

import pytest
import torch

from specpilot.engine.sampling import SamplingParams, process_logits, request_generator, sample, sample_from
from specpilot.errors import ConfigError


def reference(logits: list[float], params: SamplingParams) -> list[float]:
    """One row, float64, by the definitions in `sampling`'s docstring."""
    V = len(logits)
    if params.temperature == 0:
        best = max(range(V), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(V)]
    m = max(logits)
    w = [math.exp((x - m) / params.temperature) for x in logits]
    probs = [x / sum(w) for x in w]

    def keep(ok):
        kept = [x if ok(i, x) else 0.0 for i, x in enumerate(probs)]
        return [x / sum(kept) for x in kept]

    if 0 < params.top_k < V:
        kth = sorted(probs, reverse=True)[params.top_k - 1]
        probs = keep(lambda i, x: x >= kth)
    if params.top_p < 1:
        order = sorted(probs, reverse=True)
        mass, threshold = 0.0, order[0]
        for x in order:
            if mass >= params.top_p:
                break
            threshold, mass = x, mass + x
        probs = keep(lambda i, x: x >= threshold)
    if params.min_p > 0:
        top = max(probs)
        probs = keep(lambda i, x: x >= params.min_p * top)
    return probs


PARAMS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_p=0.9), SamplingParams(1.3, top_k=5),
          SamplingParams(0.8, top_k=7, top_p=0.8, min_p=0.05), SamplingParams(1.0, min_p=0.2),
          SamplingParams(0.5, top_p=0.3), SamplingParams(2.0, top_k=3, min_p=0.5)]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_process_logits_matches_the_reference(params):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 11, generator=g) * 2  # [B,V]
    probs = process_logits(logits, params)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    ref = torch.tensor([reference(row.tolist(), params) for row in logits], dtype=torch.float64)
    assert torch.equal(probs > 0, ref > 0)  # the same kept set
    assert (probs.double() - ref).abs().max() < 1e-6
    assert torch.allclose(probs.sum(-1), torch.ones(16), atol=1e-6)


def test_ties_at_the_top_p_boundary_are_kept_whatever_their_ids():
    base = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1]).log()  # the mass reaches 0.5 inside the tied pair
    params = SamplingParams(1.0, top_p=0.5)
    for perm in [torch.arange(5), torch.tensor([3, 1, 4, 0, 2]), torch.tensor([4, 3, 2, 1, 0])]:
        probs = process_logits(base[perm], params)
        expected = torch.tensor([0.5, 0.25, 0.25, 0.0, 0.0])[perm]
        assert torch.equal(probs > 0, expected > 0)
        assert torch.allclose(probs, expected, atol=1e-6)


def test_ties_at_the_kth_are_kept():
    probs = process_logits(torch.tensor([3.0, 2.0, 2.0, 1.0]), SamplingParams(1.0, top_k=2))
    assert (probs > 0).tolist() == [True, True, True, False]


def test_top_k_1_and_temperature_0_are_greedy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 50, generator=g)
    greedy = torch.nn.functional.one_hot(logits.argmax(-1), 50).float()
    assert torch.equal(process_logits(logits, SamplingParams(0.0)), greedy)
    for t in (0.3, 1.0, 4.0):
        assert torch.equal(process_logits(logits, SamplingParams(t, top_k=1)), greedy)


def test_the_processor_works_on_any_leading_shape():
    logits = torch.randn(2, 3, 9)  # [B,N,V]
    params = SamplingParams(0.9, top_k=4, top_p=0.9)
    assert torch.equal(process_logits(logits, params), process_logits(logits.reshape(6, 9), params).reshape(2, 3, 9))


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_k=-1),
                                    dict(top_k=1.5), dict(top_p=0.0), dict(top_p=1.2), dict(min_p=-0.1),
                                    dict(min_p=1.5), dict(seed=-3)])
def test_bad_values_are_one_config_error_line(kwargs):
    with pytest.raises(ConfigError) as err:
        SamplingParams(**{"temperature": 1.0, **kwargs})
    assert "\n" not in str(err.value) and str(err.value).startswith("sampling: ")


def test_sample_from_is_the_inverse_cdf_and_never_a_zero_weight():
    weights = torch.tensor([0.0, 2.0, 0.0, 1.0, 1.0, 0.0])  # unnormalised
    n = 4000
    u = (torch.arange(n) + 0.5) / n
    tokens = sample_from(weights.expand(n, -1), u)
    assert torch.bincount(tokens, minlength=6).tolist() == [0, 2000, 0, 1000, 1000, 0]
    almost_one = torch.tensor([1 - 2 ** -24])
    assert sample_from(torch.tensor([[0.3, 0.3, 0.3999, 0.0]]), almost_one).item() == 2  # overshoot lands on 2


def test_same_seed_same_tokens():
    probs = torch.softmax(torch.randn(32, 20), -1)
    params = SamplingParams(1.0, seed=7)
    a = sample(probs, request_generator(params))
    b = sample(probs, request_generator(params))
    c = sample(probs, request_generator(SamplingParams(1.0, seed=8)))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert request_generator(SamplingParams(1.0)) is None
