"""Forcing: alignment against a cache-free reference, chunk invariance, exactness vs AR, input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specpilot.errors import SpecPilotError
from specpilot.guard.forcing import ForcedSequence, force
from specpilot.guard.records import OutputRecord


def test_ar_outputs_force_without_mismatches_at_any_chunk(records, session):
    ar = records("ar")
    whole = force(session.target, ar, chunk=512)
    assert whole.num_tokens == sum(len(r.output_ids) for r in ar)
    assert whole.num_mismatches == 0  # float32 CPU: the random target has no near-ties
    one = force(session.target, ar, chunk=1)  # AR step shapes: reproduces AR's argmax exactly
    odd = force(session.target, ar, chunk=7)
    for a, b, c in zip(whole.sequences, one.sequences, odd.sequences):
        assert np.array_equal(a.argmax, b.argmax) and np.array_equal(a.argmax, c.argmax)
        assert np.array_equal(a.argmax, np.array(a.output_ids))
        assert not a.margin.any()  # the emitted token is the argmax: margin exactly 0
        assert np.abs(a.emitted_logprob - b.emitted_logprob).max() <= 1e-5
        assert np.abs(a.emitted_logprob - c.emitted_logprob).max() <= 1e-5


def test_scores_match_a_cache_free_causal_reference(session):
    """Random outputs (mostly mismatches): every position's argmax, margin and log-prob line up with
    `Transformer.forward_causal` over prompt + output, a different code path."""
    model = session.target
    g = torch.Generator().manual_seed(3)
    ids = lambda n: tuple(torch.randint(0, 4096, (n,), generator=g).tolist())  # noqa: E731
    recs = [OutputRecord(ids(p), ids(t)) for p, t in ((1, 9), (5, 30), (12, 1))]
    result = force(model, recs, chunk=4)
    for rec, seq in zip(recs, result.sequences):
        ids = torch.tensor(rec.prompt_ids + rec.output_ids)[None]
        with torch.inference_mode():
            z = model.forward_causal(ids)[0, len(rec.prompt_ids) - 1 : -1].float()  # [T,V] predicting outputs
        out = torch.tensor(rec.output_ids)
        lp = torch.log_softmax(z, -1)
        ref_margin = (z.max(-1).values - z.gather(1, out[:, None])[:, 0]).numpy()
        ref_lp = lp.gather(1, out[:, None])[:, 0].numpy()
        assert np.array_equal(seq.argmax, z.argmax(-1).numpy())
        assert np.abs(seq.margin - ref_margin).max() <= 1e-4
        assert np.abs(seq.emitted_logprob - ref_lp).max() <= 1e-4
        assert (seq.margin >= 0).all()
        assert seq.num_mismatches == int((z.argmax(-1) != out).sum())


def test_a_sequence_scores_the_same_whatever_else_is_in_the_file(records, session):
    recs = records("tree-bias")
    together = force(session.target, recs)
    alone = force(session.target, [recs[5]])
    s, t = together.sequences[5], alone.sequences[0]
    assert np.array_equal(s.argmax, t.argmax)
    assert np.array_equal(s.margin, t.margin) and np.array_equal(s.emitted_logprob, t.emitted_logprob)


def test_exact_tie_flipped_the_other_way_is_a_mismatch_and_a_near_tie():
    seq = ForcedSequence((1,), (5, 6), argmax=np.array([5, 9]), margin=np.array([0.0, 0.0], np.float32),
                         emitted_logprob=np.array([-1.0, -1.0], np.float32))
    assert seq.mismatch.tolist() == [False, True]
    assert seq.num_mismatches == 1 and seq.num_large_margin(0.0) == 0 and seq.first_mismatch() == 1


def test_empty_outputs_count_zero_tokens(session):
    result = force(session.target, [OutputRecord((1, 2), ()), OutputRecord((3,), (4, 5))])
    assert [s.num_tokens for s in result.sequences] == [0, 2]
    assert result.dtype == "float32" and result.device == "cpu"


@pytest.mark.parametrize("recs, message", [
    ([], "no records"),
    ([OutputRecord((1,), (4096,))], "outside the vocabulary"),
    ([OutputRecord((-1,), (3,))], "outside the vocabulary"),
    ([OutputRecord((), (3,))], "empty prompt"),
    ([OutputRecord((1,), ())], "no generated tokens"),
    ([OutputRecord((1,) * 2000, (2,) * 49)], "more than the target's 2048 positions"),
])
def test_bad_records_raise_one_clear_error(session, recs, message):
    with pytest.raises(SpecPilotError, match=message):
        force(session.target, recs)
