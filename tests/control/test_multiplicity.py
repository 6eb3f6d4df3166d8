"""Holm and Benjamini-Hochberg adjusted p-values against hand-computed values."""

import pytest

from specpilot.control.config import Multiplicity
from specpilot.control.multiplicity import adjust, significant

P = [0.01, 0.04, 0.03, 0.005]


def test_holm_step_down():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, 1*0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert adjust(P, Multiplicity.HOLM) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert significant(P, 0.05, Multiplicity.HOLM) == [True, False, False, True]


def test_bh_step_up():
    # sorted: 0.005*4/1, 0.01*4/2, 0.03*4/3, 0.04*4/4 -> running min from the top: 0.02, 0.02, 0.04, 0.04
    assert adjust(P, Multiplicity.BH) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert significant(P, 0.05, Multiplicity.BH) == [True, True, True, True]


def test_single_and_capped():
    assert adjust([0.02], Multiplicity.HOLM) == [0.02]
    assert adjust([0.6, 0.7], Multiplicity.HOLM) == [1.0, 1.0]
    assert adjust([], Multiplicity.BH) == []
