"""Summaries on hand-made measurements, where every number is known."""

import math

import pytest

from specpilot.bench.results import add_histograms, summarise
from specpilot.bench.runner import BatchMeasurement, BenchConfig, EngineRun, Output, PromptInfo
from specpilot.bench.stats import geometric_mean
from specpilot.config import System

STOCK, TREE = System(name="stock"), System(name="tree", depth=6, topk=8, tree_budget=40)


def run(name, seconds, tokens=100, rounds=100, hist=(100,)):
    return EngineRun(name, seconds, 0.01, (Output(tokens, rounds, hist, True, None),))


def batch(set_name, k, ar, stock, tree):
    return BatchMeasurement(set_name, k, (PromptInfo(k, f"{set_name}/{k}", 10),), ("ar", "stock", "tree"),
                            run("ar", ar), (run("stock", stock, rounds=40, hist=(10, 20, 10)),
                                            run("tree", tree, rounds=25, hist=(0, 5, 10, 10))))


# set a: AR 10 + 30 s; stock 5 + 5 s (4x); tree 4 + 4 s (5x). set b: AR 1 + 1 s; stock 1 + 1 s (1x); tree 0.5 + 0.5 s
MEASUREMENTS = (batch("gsm8k", 0, 10.0, 5.0, 4.0), batch("gsm8k", 1, 30.0, 5.0, 4.0),
                batch("mbpp", 0, 1.0, 1.0, 0.5), batch("mbpp", 1, 1.0, 1.0, 0.5))
CONFIG = BenchConfig(sets=("gsm8k", "mbpp"), n_prompts=2, max_new_tokens=100, resamples=500)


def test_set_speedup_is_total_ar_time_over_total_system_time():
    stock, tree = summarise(MEASUREMENTS, (STOCK, TREE), CONFIG)
    assert stock.set("gsm8k").speedup.estimate == pytest.approx(40.0 / 10.0)
    assert stock.set("mbpp").speedup.estimate == pytest.approx(1.0)
    assert tree.set("gsm8k").speedup.estimate == pytest.approx(5.0)
    assert tree.set("mbpp").speedup.estimate == pytest.approx(2.0)


def test_geomean_is_over_set_ratios_not_times():
    stock, tree = summarise(MEASUREMENTS, (STOCK, TREE), CONFIG)
    assert stock.geomean.estimate == pytest.approx(geometric_mean([4.0, 1.0]))  # 2.0
    assert stock.geomean.estimate != pytest.approx(42.0 / 12.0)  # pooled times would say 3.5x
    assert tree.geomean.estimate == pytest.approx(math.sqrt(10.0))


def test_gain_over_the_baseline_is_the_ratio_of_speedups():
    stock, tree = summarise(MEASUREMENTS, (STOCK, TREE), CONFIG)
    assert stock.gain is None and tree.baseline == "stock"
    assert tree.set("gsm8k").gain.estimate == pytest.approx(5.0 / 4.0)
    assert tree.set("mbpp").gain.estimate == pytest.approx(2.0)
    assert tree.gain.estimate == pytest.approx(tree.geomean.estimate / stock.geomean.estimate)


def test_tokens_accept_lengths_and_identity():
    stock, tree = summarise(MEASUREMENTS, (STOCK, TREE), CONFIG)
    s = stock.set("gsm8k")
    assert (s.prompts, s.batches, s.tokens, s.rounds, s.identical) == (2, 2, 200, 80, 2)
    assert s.mean_accepted_length == pytest.approx(2.5)
    assert s.tokens_per_second == pytest.approx(20.0) and s.ar_tokens_per_second == pytest.approx(5.0)
    assert tree.accept_histogram == (0, 20, 40, 40) and tree.mean_accepted_length == pytest.approx(4.0)
    assert add_histograms([(1, 2), (0, 0, 3)]) == (1, 2, 3)


def test_to_dict_is_plain_data():
    stock, tree = summarise(MEASUREMENTS, (STOCK, TREE), CONFIG)
    d = tree.to_dict(STOCK)
    assert d["diff_vs_stock"] == {"depth": [5, 6], "topk": [4, 8], "tree_budget": [7, 40]}
    assert d["geomean_gain"]["estimate"] == pytest.approx(tree.gain.estimate)
    assert d["sets"][0]["speedup"]["method"] == "studentized"
