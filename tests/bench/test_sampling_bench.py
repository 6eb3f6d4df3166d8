"""`specpilot bench` under sampling: one seed per prompt, the same for AR and every system; speedup
and accepted length reported, no "identical to AR" claimed, the settings recorded."""

import argparse
import json

import pytest

from specpilot.bench.prompts import BenchPrompt
from specpilot.bench.runner import AR_NAME, BenchConfig, prompt_seed, run_benchmark, systems_under_test
from specpilot.cli import bench as cli
from specpilot.config import Sampling, load_deployment
from specpilot.engine.generator import GenerationResult
from specpilot.errors import ConfigError


class RecordingGenerator:
    """Records the sampling argument of every call (absent: greedy); emits 3 tokens a row."""

    def __init__(self):
        self.calls = []

    def capacity_for(self, prompt_len, max_new):
        return prompt_len + max_new

    def generate(self, prompts, max_new_tokens, stop_at_eos=True, **kw):
        self.calls.append(kw.get("sampling", "greedy"))
        n = len(prompts)
        return GenerationResult([[1, 2, 3]] * n, [2] * n, [[2, 1]] * n, 0.01, 0.001)


class Session:
    def __init__(self, deployment):
        self.deployment = deployment
        self.engines = {}

    def generator(self, system):
        return self.engines.setdefault(system.name, RecordingGenerator())


PROMPTS = [BenchPrompt(s, k, f"{s}/{k}", "x", (k + 3, 1, 2), False) for s in ("gsm8k", "mbpp") for k in range(4)]


def run(sampling: Sampling, batch: int = 2):
    dep = load_deployment("fixture")
    session = Session(dep)
    config = BenchConfig.for_deployment(dep, sets=("gsm8k", "mbpp"), n_prompts=4, max_new_tokens=3, batch=batch,
                                        resamples=200, seed=7, sampling=sampling)
    run_benchmark(session, systems_under_test(["stock"], dep), PROMPTS, config)
    return session.engines


def test_every_engine_samples_each_prompt_with_the_same_seed():
    engines = run(Sampling(temperature=0.7, top_p=0.95))
    ar, stock = engines[AR_NAME].calls, engines["stock"].calls
    assert len(ar) == len(stock) == 1 + 4  # warm-up + 4 batches of 2
    assert ar == stock  # the same SamplingParams, seeds included, call by call
    timed = [p for call in ar[1:] for p in call]
    assert [p.seed for p in timed] == [prompt_seed(7, p.set_name, p.index) for p in PROMPTS]
    assert len({p.seed for p in timed}) == 8  # a seed per prompt
    assert {(p.temperature, p.top_p, p.top_k, p.min_p) for p in timed} == {(0.7, 0.95, 0, 0.0)}
    assert [p.seed for p in ar[0]] == [p.seed for p in timed[:2]]  # the warm-up samples the first batch


def test_seeds_depend_on_the_bench_seed_and_the_prompt_only():
    assert prompt_seed(0, "gsm8k", 3) == prompt_seed(0, "gsm8k", 3)
    assert len({prompt_seed(s, n, i) for s in (0, 1) for n in ("gsm8k", "mbpp") for i in range(3)}) == 12
    assert 0 <= prompt_seed(123, "mt_bench", 9) < 2**63


def test_a_greedy_bench_calls_the_engines_as_before():
    engines = run(Sampling())
    assert set(engines[AR_NAME].calls) == set(engines["stock"].calls) == {"greedy"}


def args(**given):
    base = {k: None for k in ("sets", "n_prompts", "max_new_tokens", "batch", "temperature", "top_k", "top_p",
                              "min_p")}
    base.update(seed=0, warmup_tokens=2, resamples=200, level=0.95, interval="bca", ignore_eos=False)
    return argparse.Namespace(**{**base, **given})


def test_flags_override_the_regime_sampling_one_knob_at_a_time():
    dep = load_deployment("fixture-sampled")
    assert cli.config_from_args(args(), dep).sampling == Sampling(0.7, 0, 0.95, 0.0)
    assert cli.config_from_args(args(top_k=20), dep).sampling == Sampling(0.7, 20, 0.95, 0.0)
    assert cli.config_from_args(args(temperature=0.0), dep).sampling.greedy
    greedy = load_deployment("fixture")
    assert cli.config_from_args(args(temperature=1.0), greedy).sampling == Sampling(temperature=1.0)
    assert cli.serving_config_from_args(args(concurrency=None, arrival_rate=None, requests_per_slot=None,
                                             units=None, min_p=0.1), dep).sampling == Sampling(0.7, 0, 0.95, 0.1)
    with pytest.raises(ConfigError, match="sampling top_p must be in"):
        cli.config_from_args(args(top_p=0.0), dep)


@pytest.mark.slow
def test_bench_on_the_sampled_fixture_reports_speedup_and_acceptance(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--deployment", "fixture-sampled", "--sets", "gsm8k", "--n-prompts", "2", "--max-new-tokens", "8",
            "--warmup-tokens", "2", "--resamples", "200", "--device", "cpu", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "sampled: temperature 0.7, top-p 0.95" in captured.err  # the plan line
    table = captured.out
    assert "stock speedup" in table and "n/a (sampled)" in table
    assert "(one seed per prompt, the same for AR and every system)" in table
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["sampling"] == {"temperature": 0.7, "top_k": 0, "top_p": 0.95, "min_p": 0.0,
                                         "greedy": False}
    assert doc["deployment"]["regime"]["temperature"] == 0.7
    (system,) = doc["systems"]
    assert system["identical"] is None and all(s["identical"] is None for s in system["sets"])
    assert system["geomean_speedup"]["estimate"] > 0
    assert 1.0 <= system["mean_accepted_length"] <= 6  # drafts accepted under sampling, at most depth + 1
    assert "n/a (sampled)" in (out / "results.md").read_text()
    assert "Tokens differ from AR" not in (out / "results.md").read_text()
