"""The block statistic: time per generated token, per phase, averaged over phases."""

import math

import pytest

from specpilot.control.blocks import BlockResult, saturated_pairs


def block(inc_s, cand_s, inc_out, cand_out):
    return BlockResult(0, (tuple(inc_s),), (tuple(cand_s),), (tuple(inc_out),), (tuple(cand_out),))


def test_same_outputs_reduce_to_the_time_ratio():
    out = ([1, 2, 3], [4, 5])
    assert block([2.0, 2.0], [1.0, 1.0], out, out).log_ratio == pytest.approx(math.log(2.0))


def test_shorter_outputs_do_not_pass_for_speed():
    """Same time for 10% fewer tokens is 10% slower per token, not a tie."""
    inc = ([1] * 50, [2] * 50)
    cand = ([1] * 45, [2] * 45)
    assert block([1.0, 1.0], [1.0, 1.0], inc, cand).log_ratio == pytest.approx(math.log(90 / 100))
    # and 10% less time for 10% fewer tokens is no gain at all
    assert block([1.0, 1.0], [0.9, 0.9], inc, cand).log_ratio == pytest.approx(0.0)


def test_blocks_without_outputs_use_times_alone():
    r = BlockResult(0, ((2.0,), (3.0,)), ((1.0,), (1.0,)), ((), ()), ((), ()))
    assert r.log_ratio == pytest.approx((math.log(2.0) + math.log(3.0)) / 2)


def test_timings_are_strict_json():
    import json

    r = BlockResult(0, ((1.0,),), ((2.0,),), ((),), ((),), ((float("nan"),),), ((0.5,),))
    t = r.timings()
    assert t["incumbent_reported"] == [[None]] and t["candidate_reported"] == [[0.5]]
    json.dumps(t, allow_nan=False)


def test_a_pair_whose_arms_both_saturated_is_compared_on_those_stretches():
    """Under continuous batching the whole request credits a shorter ramp-down; the stretches with
    every slot taken are the server's rate. A pair where one arm never saturated keeps the whole
    request, for both arms."""
    out = ([1] * 100,)
    sat_a, sat_b = (((2.0, 100), (2.0, 100), (0.0, 0)),), (((1.0, 80), (1.0, 80), (1.0, 80)),)
    r = BlockResult(0, ((4.0, 4.0, 4.0),), ((2.0, 2.0, 2.0),), ((out[0],) * 3,), ((out[0],) * 3,),
                    incumbent_saturated=sat_a, candidate_saturated=sat_b)
    # pairs 1-2: (2/100) / (1/80) = 1.6; pair 3: whole requests, 4/2 = 2.0; median 1.6
    assert r.log_ratio == pytest.approx(math.log(1.6))
    assert saturated_pairs(r.timings()) == (2, 3)
    assert block([4.0] * 3, [2.0] * 3, (out[0],) * 3, (out[0],) * 3).log_ratio == pytest.approx(math.log(2.0))
    t = r.timings()
    assert t["incumbent_saturated"] == [[[2.0, 100], [2.0, 100], [0.0, 0]]]
    assert "incumbent_saturated" not in block([1.0], [1.0], ([1],), ([1],)).timings()
