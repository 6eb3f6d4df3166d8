"""The warm-up before a timed generation."""

from types import SimpleNamespace

from specpilot.engine.profile import WARMUP_TOKENS, warm_up


def test_the_warm_up_is_a_short_generation_of_the_same_prompts():
    calls = []
    gen = SimpleNamespace(generate=lambda prompts, n: calls.append((prompts, n)))
    warm_up(gen, [[1, 2, 3]], 256)
    assert calls == [([[1, 2, 3]], WARMUP_TOKENS)]
    warm_up(gen, [[1]], 3)  # never longer than the timed run
    assert calls[-1] == ([[1]], 3)
