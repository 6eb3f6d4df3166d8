"""The decision on real engine outputs (CPU float32): lossless systems pass, both faults are rejected."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specpilot.errors import ConfigError
from specpilot.guard.config import GuardConfig, Pairing, RateTest, default_near_tie_nats
from specpilot.guard.forcing import ForcingResult
from specpilot.guard.verdict import Caution, Rule, Verdict, compare

from .conftest import AFTER, SYSTEMS

CONFIG = GuardConfig(resamples=2000)


def test_stock_vs_stock_passes_exactly(forced):
    v = compare(forced("ar"), forced("ar"), CONFIG)
    assert v.passed and v.violated == ()
    assert (v.difference, v.rate.lower, v.rate.upper) == (0.0, 0.0, 0.0)
    assert v.candidate == v.stock and v.stock.mismatches == 0
    assert v.rate.paired and v.near_tie_nats == 1e-3 and v.dtype == "float32"
    assert v.cautions == ()


@pytest.mark.parametrize("name", ["tree", "chain"])
def test_lossless_speculative_systems_pass(records, forced, name):
    assert records(name) == records("ar")  # greedy speculative decoding is exact on CPU float32
    v = compare(forced(name), forced("ar"), CONFIG)
    assert v.passed and v.candidate.mismatches == 0


@pytest.mark.parametrize("name", ["tree-bias", "ar-bias"])
def test_logit_bias_fault_is_rejected_and_behaves_as_specified(forced, name):
    f = forced(name)
    v = compare(f, forced("ar"), CONFIG)
    assert not v.passed and v.violated == (Rule.RATE, Rule.LARGE_MARGIN)
    assert v.rate.lower > CONFIG.rate_margin and v.candidate.large_margin > 0
    for s in f.sequences:
        pos = np.flatnonzero(s.mismatch)
        out = np.array(s.output_ids)
        assert (pos >= AFTER).all()  # nothing changes before T generated tokens
        assert (out[pos] % 7 == 0).all()  # only biased ids are promoted
        assert (s.margin[pos] <= 2.0 + 1e-4).all()  # by at most the bias


def test_fault_is_applied_at_the_same_generated_index_in_ar_and_speculative_decoding(records):
    assert records("tree-bias") == records("ar-bias")
    assert records("tree-bias") != records("ar")


def test_accept_unverified_is_rejected(forced):
    v = compare(forced("tree-unverified"), forced("ar"), CONFIG)
    assert not v.passed and Rule.LARGE_MARGIN in v.violated
    assert v.candidate.large_margin == v.candidate.mismatches > 0


def test_accept_unverified_without_a_drafter_is_refused(session):
    with pytest.raises(ConfigError, match="accept-unverified' needs a drafter"):
        session.generator(SYSTEMS["ar-unverified"])


def test_faulty_stock_is_flagged_and_equal_faults_pass(forced):
    v = compare(forced("tree-bias"), forced("tree-bias"), CONFIG)
    assert v.passed and Caution.STOCK_LARGE_MARGIN in v.cautions


def test_verdict_round_trips_through_json(forced):
    v = compare(forced("tree-unverified"), forced("ar"), CONFIG)
    d = json.loads(json.dumps(v.to_dict()))
    assert Verdict.from_dict(d) == v
    assert d["passed"] is False and d["violated"] == ["rate", "large-margin"]
    assert d["bound"] == v.rate.lower and d["difference"] == v.difference
    assert "REJECT (rate, large-margin)" in v.summary()
    assert compare(forced("ar"), forced("ar"), CONFIG).summary().splitlines()[0].endswith("PASS")


def test_pairing_is_by_prompt_not_by_line(forced):
    c, s = forced("tree-unverified"), forced("ar")
    shuffled = ForcingResult(c.sequences[::-1], c.dtype, c.device, c.chunk)
    assert compare(shuffled, s, CONFIG) == compare(c, s, CONFIG)


def test_different_prompts_are_an_error_unless_allowed(forced):
    c, s = forced("tree-bias"), forced("ar")
    fewer = ForcingResult(c.sequences[:-1], c.dtype, c.device, c.chunk)
    with pytest.raises(ConfigError, match="not for the same prompts"):
        compare(fewer, s, CONFIG)
    v = compare(fewer, s, GuardConfig(resamples=2000, pairing=Pairing.AUTO))
    assert not v.rate.paired and Caution.UNPAIRED in v.cautions and not v.passed


def test_few_sequences_are_flagged(forced):
    c = forced("ar")
    few = ForcingResult(c.sequences[:5], c.dtype, c.device, c.chunk)
    v = compare(few, few, CONFIG)
    assert v.passed and v.cautions == (Caution.FEW_SEQUENCES,)


def test_non_inferiority_rejects_unless_the_upper_bound_is_below_the_margin(forced):
    config = GuardConfig(resamples=2000, rate_test=RateTest.NON_INFERIORITY)
    assert compare(forced("tree"), forced("ar"), config).passed
    v = compare(forced("tree-bias"), forced("ar"), config)
    assert not v.passed and v.bound == v.rate.upper


def test_large_margin_allowance(forced):
    c = forced("tree-unverified")
    n = compare(c, forced("ar"), CONFIG).candidate.large_margin
    lenient = GuardConfig(resamples=2000, large_margin_allowance=n, rate_margin=0.99)
    assert compare(c, forced("ar"), lenient).passed


def test_scorer_dtypes_must_agree(forced):
    c = forced("ar")
    other = ForcingResult(c.sequences, "bfloat16", c.device, c.chunk)
    with pytest.raises(ConfigError, match="one scorer"):
        compare(other, c, CONFIG)


def test_config_validation():
    for bad in (dict(rate_margin=-0.1), dict(confidence=0.3), dict(near_tie_nats=-1.0), dict(resamples=10),
                dict(chunk=0), dict(large_margin_allowance=-1)):
        with pytest.raises(ConfigError):
            GuardConfig(**bad)
    assert GuardConfig.from_dict(GuardConfig(pairing=Pairing.AUTO).to_dict()) == GuardConfig(pairing=Pairing.AUTO)


def test_near_tie_threshold_is_per_dtype_unless_set():
    assert [default_near_tie_nats(d) for d in (torch.bfloat16, torch.float16, torch.float32)] == [0.5, 0.0625, 1e-3]
    assert GuardConfig().near_tie_for(torch.bfloat16) == 0.5
    assert GuardConfig(near_tie_nats=0.1).near_tie_for(torch.float32) == 0.1
    with pytest.raises(ConfigError, match="near-tie"):
        default_near_tie_nats(torch.int8)
