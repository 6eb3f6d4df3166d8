"""The warm-up before a timed generation: long enough that the timed run captures nothing."""

from types import SimpleNamespace

from specpilot.engine.profile import WARMUP_TOKENS_CPU, warm_up


def _recorder(use_graphs: bool):
    calls = []
    gen = SimpleNamespace(use_graphs=use_graphs, generate=lambda prompts, n: calls.append((prompts, n)))
    return gen, calls


def test_under_cuda_graphs_the_warm_up_runs_the_full_length():
    gen, calls = _recorder(True)
    warm_up(gen, [[1, 2, 3]], 256)  # every attention span the timed run reaches is captured here
    assert calls == [([[1, 2, 3]], 256)]


def test_without_graphs_a_short_warm_up_suffices():
    gen, calls = _recorder(False)
    warm_up(gen, [[1, 2, 3]], 256)
    assert calls == [([[1, 2, 3]], WARMUP_TOKENS_CPU)]
    warm_up(gen, [[1]], 3)
    assert calls[-1] == ([[1]], 3)
