"""Token-for-token comparison and the log-prob gap at each first divergence."""

from __future__ import annotations

import pytest

from specpilot.errors import ConfigError
from specpilot.guard.divergence import compare_outputs, first_divergence
from specpilot.guard.forcing import ForcingResult

from .conftest import AFTER


def test_first_divergence():
    assert first_divergence((1, 2, 3), (1, 2, 3)) is None
    assert first_divergence((1, 2, 3), (1, 5, 3)) == 1
    assert first_divergence((1, 2), (1, 2, 3)) == 2
    assert first_divergence((), ()) is None


def test_identical_outputs(forced):
    r = compare_outputs(forced("ar"), forced("tree"))
    assert (r.pairs, r.identical, r.max_nats, r.median_index) == (24, 24, 0.0, None)
    assert r.common_tokens == r.tokens == forced("ar").num_tokens


def test_fault_diverges_after_t_by_at_most_the_bias(forced):
    r = compare_outputs(forced("ar"), forced("ar-bias"))
    diverged = [d for d in r.divergences if d.index is not None]
    assert diverged and all(d.index >= AFTER for d in diverged)
    gaps = [d.nats for d in diverged if d.nats is not None]
    assert 0 < max(gaps) <= 2.0 + 1e-4 and r.max_nats == max(gaps)
    # at the divergence the AR token is the scorer's argmax, so the gap is the fault token's margin
    bias = forced("ar-bias")
    for i, d in enumerate(r.divergences):
        if d.nats is not None:
            assert d.nats == pytest.approx(float(bias.sequences[i].margin[d.index]), abs=1e-5)


def test_needs_the_same_prompts(forced):
    a = forced("ar")
    with pytest.raises(ConfigError):
        compare_outputs(a, ForcingResult(a.sequences[1:], a.dtype, a.device, a.chunk))
