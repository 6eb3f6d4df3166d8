"""Fault specs as the guard's users write them (the engine owns `specpilot.engine.faults`)."""

from __future__ import annotations

import pytest
import torch

from specpilot.engine.faults import Fault, FaultKind, apply_logit_bias, parse_fault
from specpilot.errors import ConfigError


def test_parse_and_spec_round_trip():
    f = parse_fault("logit-bias:2:every=7:after=2048")
    assert f == Fault(FaultKind.LOGIT_BIAS, 2.0, 7, 2048)
    assert parse_fault(f.spec()) == f
    assert parse_fault("accept-unverified") == Fault(FaultKind.ACCEPT_UNVERIFIED)
    assert parse_fault("delay:2.5") == Fault(FaultKind.DELAY, 2.5) and parse_fault("delay:2.5").spec() == "delay:2.5"
    assert parse_fault("") is None and parse_fault(None) is None


@pytest.mark.parametrize("spec", ["logit-bias:2", "logit-bias:x:every=7:after=1", "logit-bias:2:every=0:after=1",
                                  "logit-bias:2:every=7:after=-1", "accept", "logit-bias:1.2.3:every=7:after=1",
                                  "delay:", "delay:-1", "delay:1.2.3"])
def test_bad_specs(spec):
    with pytest.raises(ConfigError):
        parse_fault(spec)


def test_bias_hits_every_kth_id_from_generated_index_t():
    logits = torch.zeros(1, 3, 15)
    out = apply_logit_bias(parse_fault("logit-bias:2:every=7:after=1"), logits, torch.tensor([[0, 1, 2]]))
    expected = torch.zeros(1, 3, 15)
    expected[0, 1:, [0, 7, 14]] = 2.0
    assert torch.equal(out, expected)
    assert apply_logit_bias(None, logits, torch.tensor([[0, 1, 2]])) is logits


def test_delay_sleeps_and_leaves_the_logits_alone():
    import time

    logits = torch.zeros(1, 2, 5)
    start = time.perf_counter()
    out = apply_logit_bias(parse_fault("delay:30"), logits, torch.tensor([[0, 1]]))
    assert out is logits and time.perf_counter() - start >= 0.03
