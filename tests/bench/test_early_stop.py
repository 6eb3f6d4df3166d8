"""Issue 27: a system that ends its outputs early must not look faster than it is.

A fake session whose system stops after fewer tokens than AR, with fixed times, goes through the
whole benchmark path (`run_benchmark`, `summarise`, results.json, results.md): the speedup reported
is the ratio of time per generated token, not of total times, and both arms' tokens are reported
beside it.
"""

import json

import pytest

from specpilot.bench.prompts import BenchPrompt
from specpilot.bench.report import length_notes, render_markdown, render_terminal, write_json
from specpilot.bench.results import BenchResult, summarise
from specpilot.bench.runner import AR_NAME, BenchConfig, run_benchmark, systems_under_test
from specpilot.engine.generator import GenerationResult

# issue 27 (fixture-x16, MBPP): AR 1,536 tokens, the system 1,046 in 3.63x less total time
AR_TOKENS = [256] * 6
EARLY_TOKENS = [200, 190, 180, 170, 160, 146]
AR_SECONDS = [3.63, 3.63, 3.63, 3.63, 3.63, 3.63]
SECONDS = [1.0] * 6


class FakeGenerator:
    """Returns fixed outputs and times per prompt; `tokens` = how many of AR's tokens it emits."""

    def __init__(self, tokens: list[int], seconds: list[float]):
        self.tokens, self.seconds, self.calls = tokens, seconds, []

    def capacity_for(self, prompt_len: int, max_new: int) -> int:
        return prompt_len + max_new

    def generate(self, prompts, max_new_tokens, stop_at_eos=True):
        self.calls.append(stop_at_eos)
        k = prompts[0][0]  # the prompt's index, carried in its first token
        n = max_new_tokens if not stop_at_eos else min(self.tokens[k], max_new_tokens)
        return GenerationResult([list(range(n))], [n], [[1] * n], self.seconds[k], 0.001)


class FakeSession:
    def __init__(self, deployment):
        self.deployment = deployment
        self.engines = {AR_NAME: FakeGenerator(AR_TOKENS, AR_SECONDS), "stock": FakeGenerator(EARLY_TOKENS, SECONDS)}

    def generator(self, system):
        return self.engines[system.name]


@pytest.fixture
def early_result(tiny_deployment):
    session = FakeSession(tiny_deployment)
    systems = systems_under_test(["stock"], tiny_deployment)
    config = BenchConfig.for_deployment(tiny_deployment, sets=("mbpp",), n_prompts=6, max_new_tokens=256,
                                        resamples=500)
    prompts = [BenchPrompt("mbpp", k, f"mbpp/{k}", "x", (k, 1, 2), False) for k in range(6)]
    ms = run_benchmark(session, systems, prompts, config)
    result = BenchResult(tiny_deployment, config, summarise(ms, systems, config), ms, {"versions": {"torch": "x"}},
                         "2026-01-01T00:00:00Z", ("specpilot", "bench"), False)
    return result, session


def test_speedup_is_the_per_token_ratio_when_the_system_ends_early(early_result, tmp_path):
    result, session = early_result
    assert session.engines["stock"].calls == [True] * 7  # warm-up + 6 prompts: stops at EOS by default
    s = result.system("stock").set("mbpp")
    assert (s.ar_tokens, s.tokens) == (1536, 1046)
    per_token = (sum(AR_SECONDS) / 1536) / (sum(SECONDS) / 1046)
    assert per_token == pytest.approx(2.472, abs=1e-3)
    assert s.speedup.estimate == pytest.approx(per_token)
    assert s.speedup.estimate != pytest.approx(sum(AR_SECONDS) / sum(SECONDS))  # 3.63x, the old definition
    assert result.system("stock").geomean.estimate == pytest.approx(per_token)
    assert s.identical == 0  # shorter than AR's: not AR's tokens

    doc = json.loads(write_json(result, tmp_path).read_text())
    assert doc["schema"] == "specpilot.bench/2" and "tokens" in doc["config"]["speedup_definition"]
    d = doc["systems"][0]["sets"][0]
    assert (d["ar_tokens"], d["tokens"]) == (1536, 1046) and d["speedup"]["estimate"] == pytest.approx(per_token)
    assert d["speedup"]["no_interval"] is None and d["speedup"]["low"] <= per_token <= d["speedup"]["high"]
    assert (doc["systems"][0]["ar_tokens"], doc["systems"][0]["tokens"]) == (1536, 1046)

    md = render_markdown(result)
    row = next(line for line in md.splitlines() if line.startswith("| mbpp | 6 |"))
    assert "| 1536 | 1046 | 2.47x [" in row
    assert "time per generated token" in md and "stopping at EOS" in md
    assert "2.47x" in render_terminal(result) and "3.63x" not in render_terminal(result)
    # the lengths differ: both renderings say the ratio compares different work, and how to avoid it
    note = "`stock` generated 1046 tokens, AR 1536 (-31.9%): their speeds per token come from outputs of different"
    assert f"- {note}" in md and f"note: {note}" in render_terminal(result) and "`--ignore-eos`" in md


def test_ignore_eos_reaches_every_generate_call(tiny_deployment):
    session = FakeSession(tiny_deployment)
    systems = systems_under_test(["stock"], tiny_deployment)
    config = BenchConfig.for_deployment(tiny_deployment, sets=("mbpp",), n_prompts=6, max_new_tokens=256,
                                        resamples=500, ignore_eos=True)
    prompts = [BenchPrompt("mbpp", k, f"mbpp/{k}", "x", (k, 1, 2), False) for k in range(6)]
    ms = run_benchmark(session, systems, prompts, config)
    assert all(calls == [False] * 7 for calls in (g.calls for g in session.engines.values()))
    assert all(o.tokens == 256 for m in ms for o in (*m.ar.outputs, *m.systems[0].outputs))
    s = summarise(ms, systems, config)[0].set("mbpp")
    assert s.speedup.estimate == pytest.approx(3.63)  # equal lengths: per token = total time ratio
    result = BenchResult(tiny_deployment, config, summarise(ms, systems, config), ms, {"versions": {"torch": "x"}},
                         "2026-01-01T00:00:00Z", ("specpilot", "bench"), False)
    assert not length_notes(result) and "note:" not in render_terminal(result)
