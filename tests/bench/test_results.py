"""Summaries on hand-made measurements, where every number is known."""

import math

import pytest

from specpilot.bench.results import add_histograms, summarise
from specpilot.bench.runner import BatchMeasurement, BenchConfig, EngineRun, Output, PromptInfo
from specpilot.bench.stats import geometric_mean
from specpilot.config import System

STOCK, TREE = System(name="stock"), System(name="tree", depth=6, topk=8, tree_budget=40)


def run(name, seconds, tokens=100, rounds=100, hist=(100,), identical=True):
    return EngineRun(name, seconds, 0.01, (Output(tokens, rounds, hist, identical, None if identical else tokens),))


def batch(set_name, k, ar, stock, tree):
    return BatchMeasurement(set_name, k, (PromptInfo(k, f"{set_name}/{k}", 10),), ("ar", "stock", "tree"),
                            run("ar", ar), (run("stock", stock, rounds=40, hist=(10, 20, 10)),
                                            run("tree", tree, rounds=25, hist=(0, 5, 10, 10))))


# set a: AR 10 + 30 s; stock 5 + 5 s (4x); tree 4 + 4 s (5x). set b: AR 1 + 1 s; stock 1 + 1 s (1x); tree 0.5 + 0.5 s
MEASUREMENTS = (batch("gsm8k", 0, 10.0, 5.0, 4.0), batch("gsm8k", 1, 30.0, 5.0, 4.0),
                batch("mbpp", 0, 1.0, 1.0, 0.5), batch("mbpp", 1, 1.0, 1.0, 0.5))
CONFIG = BenchConfig(sets=("gsm8k", "mbpp"), n_prompts=2, max_new_tokens=100, resamples=500)


def test_set_speedup_with_equal_tokens_is_total_ar_time_over_total_system_time():
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
    assert d["sets"][0]["speedup"]["method"] == "bca"
    assert d["ar_tokens"] == 400 and d["tokens"] == 400 and d["sets"][0]["tokens"] == 200


def test_two_prompts_per_set_have_no_interval():
    stock, _ = summarise(MEASUREMENTS, (STOCK, TREE), CONFIG)
    for iv in (stock.set("gsm8k").speedup, stock.geomean):
        d = iv.to_dict()
        assert d["low"] is None and d["high"] is None and d["no_interval"] == "n < 5" and d["estimate"] > 0


def early_set(n=6):
    """AR: 100 tokens per prompt in 1.0-1.5 s; "tree" ends its outputs early (40-65 tokens) in 0.2-0.3 s;
    "stock" decodes AR's 100 tokens in 0.5-0.75 s."""
    out = []
    for k in range(n):
        scale = 1.0 + 0.1 * k
        out.append(BatchMeasurement("mbpp", k, (PromptInfo(k, f"mbpp/{k}", 10),), ("ar", "stock", "tree"),
                                    run("ar", scale), (run("stock", 0.5 * scale, rounds=40, hist=(10, 20, 10)),
                                                       run("tree", 0.2 * scale, tokens=40 + 5 * k, rounds=20,
                                                           hist=(0, 20), identical=False))))
    return tuple(out)


def test_a_system_that_ends_early_gets_the_per_token_ratio():
    ms = early_set()
    config = BenchConfig(sets=("mbpp",), n_prompts=6, max_new_tokens=100, resamples=500)
    stock, tree = summarise(ms, (STOCK, TREE), config)
    ar_seconds, ar_tokens = sum(m.ar.seconds for m in ms), sum(m.ar.tokens for m in ms)
    t = tree.set("mbpp")
    assert (t.ar_tokens, t.tokens) == (600, 315)
    per_token = (ar_seconds / ar_tokens) / (t.seconds / t.tokens)
    assert t.speedup.estimate == pytest.approx(per_token) == pytest.approx(t.tokens_per_second / t.ar_tokens_per_second)
    assert t.speedup.estimate == pytest.approx(5.0 * 315 / 600)  # not the time ratio, 5.0x
    assert tree.geomean.estimate == pytest.approx(per_token)  # one set
    # gain over stock: stock's time per token over tree's (stock decodes AR's tokens at 2x)
    assert t.gain.estimate == pytest.approx(per_token / 2.0)
    assert stock.set("mbpp").speedup.estimate == pytest.approx(2.0)
    # six prompts: a real interval, around the estimate
    assert t.speedup.no_interval is None and t.speedup.low <= t.speedup.estimate <= t.speedup.high
    d = tree.to_dict(STOCK)["sets"][0]
    assert (d["ar_tokens"], d["tokens"]) == (600, 315) and d["speedup"]["estimate"] == pytest.approx(per_token)


def test_outputs_of_different_lengths_get_a_note_against_ar_and_against_the_baseline(tiny_deployment):
    from specpilot.bench.report import length_notes
    from specpilot.bench.results import BenchResult

    config = BenchConfig(sets=("mbpp",), n_prompts=6, max_new_tokens=100, resamples=500)
    ms = early_set()
    result = BenchResult(tiny_deployment, config, summarise(ms, (STOCK, TREE), config), ms, {"versions": {}},
                         "2026-01-01T00:00:00Z", ("specpilot", "bench"), False)
    notes = length_notes(result)  # stock decodes AR's 600 tokens: no note of its own
    assert len(notes) == 2 and all(n.startswith("`tree` generated 315 tokens, ") for n in notes)
    assert "AR 600 (-47.5%)" in notes[0] and "`stock` 600 (-47.5%)" in notes[1]
