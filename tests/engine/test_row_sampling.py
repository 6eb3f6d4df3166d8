"""Per-row processing equals the one-request processor bit for bit; counter uniforms are a pure,
uniform function of their key; the sampled fault specs parse."""

import pytest
import torch
from scipy.stats import kstest

from specpilot.engine.counter_rng import STREAM_DRAFT, counter_uniforms, lowbias32
from specpilot.engine.faults import FaultKind, parse_fault
from specpilot.engine.row_sampling import Filters, RowSampling, process_rows
from specpilot.engine.sampling import SamplingParams, process_logits
from specpilot.errors import ConfigError

MIXED = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_p=0.9), SamplingParams(1.3, top_k=5),
         SamplingParams(0.8, top_k=7, top_p=0.8, min_p=0.05), SamplingParams(1.0, min_p=0.2),
         SamplingParams(0.5, top_p=0.3), SamplingParams(2.0, top_k=3, min_p=0.5), SamplingParams(1.0, top_k=50)]
TOP_K_ALL = [SamplingParams(0.0), SamplingParams(0.9, top_k=4, top_p=0.7), SamplingParams(1.5, top_k=9),
             SamplingParams(1.0, top_k=2, top_p=0.5, min_p=0.1)]  # every sampled row has top-k: a narrow sort
NO_GREEDY = [SamplingParams(1.0), SamplingParams(0.6, top_p=0.5), SamplingParams(1.2, min_p=0.1)]


@pytest.mark.parametrize("params", [MIXED, TOP_K_ALL, NO_GREEDY], ids=["mixed", "top-k-everywhere", "no-greedy"])
def test_each_row_is_processed_as_process_logits_would(params):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(params), 5, 40, generator=g) * 2  # [B,N,V]
    logits[:, 0, :6] = 1.5  # ties at the top-k / top-p boundaries
    rows = RowSampling.allocate(len(params), "cpu")
    rows.load(params)
    filters = Filters.of(params)
    assert (filters.sort_width == 9) == (params is TOP_K_ALL) and filters.greedy == (params is not NO_GREEDY)
    probs = process_rows(logits, rows, filters)
    for b, p in enumerate(params):
        assert torch.equal(probs[b], process_logits(logits[b], p)), p


def test_rows_load_one_at_a_time_and_draw_seeds_when_none_is_given():
    rows = RowSampling.allocate(3, "cpu")
    rows.load([SamplingParams(1.0, seed=4)] * 3)
    rows.load_row(1, SamplingParams(0.5, top_k=3, seed=11))
    assert rows.seed.tolist() == [4, 11, 4] and rows.top_k.tolist() == [0, 3, 0]
    torch.manual_seed(0)
    rows.load([SamplingParams(1.0)] * 3)
    drawn = rows.seed.tolist()
    assert len(set(drawn)) == 3 and all(s >= 0 for s in drawn)


def test_counter_uniforms_are_a_pure_uniform_function_of_the_key():
    seed = torch.arange(4000) * 7919 + (1 << 40)  # large seeds: both halves mixed
    index = torch.arange(4000) % 13
    u = counter_uniforms(seed, index, 9)  # [B,9]
    assert torch.equal(u, counter_uniforms(seed, index, 9))
    assert torch.equal(u[:, :4], counter_uniforms(seed, index, 4))  # a draw id names one uniform
    assert ((u >= 0) & (u < 1)).all()
    assert kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    assert kstest(counter_uniforms(torch.zeros(1, dtype=torch.long), torch.tensor([3]), 20000)[0].numpy(),
                  "uniform").pvalue > 1e-3
    others = [counter_uniforms(seed + 1, index, 9), counter_uniforms(seed, index + 1, 9),
              counter_uniforms(seed, index, 9, STREAM_DRAFT)]
    for v in others:  # another seed, counter or stream: unrelated uniforms
        assert abs(torch.corrcoef(torch.stack([u.flatten(), v.flatten()]))[0, 1]) < 0.02


def test_lowbias32_matches_its_32_bit_definition():
    def ref(x):  # the C definition on Python ints
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    xs = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xDEADBEEF]
    assert lowbias32(torch.tensor(xs)).tolist() == [ref(x) for x in xs]


def test_sampled_fault_specs_parse_and_bad_ones_are_one_error():
    f = parse_fault("sampling-rule:correction-from-p")
    assert f.kind is FaultKind.SAMPLING_RULE and f.rule == "correction-from-p" and f.sampling
    assert parse_fault(f.spec()) == f
    t = parse_fault("target-temperature:0.5")
    assert t.kind is FaultKind.TARGET_TEMPERATURE and t.value == 0.5 and parse_fault(t.spec()) == t
    assert parse_fault("target-top-p:1").value == 1.0
    for bad in ("sampling-rule:nope", "target-temperature:0", "target-top-p:1.5", "target-top-p:x"):
        with pytest.raises(ConfigError):
            parse_fault(bad)
