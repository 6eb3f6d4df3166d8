import pytest

from specpilot.bench.prompts import BenchPrompt, prompt_ids
from specpilot.bench.runner import (
    AR_NAME,
    BenchConfig,
    accept_histogram,
    count_decodes,
    first_divergence,
    make_batches,
    run_benchmark,
    systems_under_test,
)
from specpilot.config import DrafterKind, load_system
from specpilot.errors import ConfigError


def fake_prompts(counts: dict[str, int]) -> list[BenchPrompt]:
    return [BenchPrompt(s, i, f"{s}/{i}", "x", (1, 2), False) for s, n in counts.items() for i in range(n)]


def test_first_divergence_and_histogram():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert accept_histogram([1, 3, 3, 1, 1]) == (3, 0, 2)
    assert accept_histogram([]) == ()


def test_batches_stay_within_a_set_and_drop_remainders():
    batches = make_batches(fake_prompts({"gsm8k": 5, "mbpp": 4}), 2)
    assert [(s, [p.index for p in ps]) for s, ps in batches] == [
        ("gsm8k", [0, 1]), ("gsm8k", [2, 3]), ("mbpp", [0, 1]), ("mbpp", [2, 3])]
    with pytest.raises(ConfigError, match="fewer than --batch"):
        make_batches(fake_prompts({"gsm8k": 1}), 2)


def test_config_defaults_come_from_the_deployment_and_bad_values_are_refused(tiny_deployment):
    c = BenchConfig.for_deployment(tiny_deployment, batch=None, sets=("mbpp",))
    assert (c.sets, c.n_prompts, c.max_new_tokens, c.batch) == (("mbpp",), 2, 6, 1)
    for bad, match in [(dict(n_prompts=3, batch=2), "not a multiple"), (dict(max_new_tokens=0), "max-new-tokens"),
                       (dict(sets=("gsm8k", "nope")), "unknown benchmark set"), (dict(level=1.0), "level")]:
        with pytest.raises(ConfigError, match=match):
            BenchConfig.for_deployment(tiny_deployment, **bad)


def test_systems_under_test(tiny_deployment, chain_system_toml, tmp_path):
    systems = systems_under_test(None, tiny_deployment)
    assert [s.name for s in systems] == ["stock"]
    systems = systems_under_test(["stock", str(chain_system_toml), "ar"], tiny_deployment)
    assert [s.name for s in systems] == ["stock", "chain", "ar-control"]
    assert systems[1].topk == 1 and systems[2].drafter is DrafterKind.NONE
    with pytest.raises(ConfigError, match="distinct names"):
        systems_under_test(["stock", "stock"], tiny_deployment)
    named_ar = tmp_path / "x.toml"
    named_ar.write_text('name = "ar"\n')
    with pytest.raises(ConfigError, match="named 'ar'"):
        systems_under_test([str(named_ar)], tiny_deployment)


def test_interleaved_run_is_lossless_on_cpu_and_rotates_the_order(tiny_session, tiny_deployment, chain_system_toml):
    systems = systems_under_test(["stock", str(chain_system_toml)], tiny_deployment)
    config = BenchConfig.for_deployment(tiny_deployment, sets=("gsm8k", "humaneval"), n_prompts=2, max_new_tokens=5,
                                        warmup_tokens=2)
    prompts = prompt_ids(tiny_deployment, tiny_session.tokenizer, config.sets, config.n_prompts)
    steps = []
    ms = run_benchmark(tiny_session, systems, prompts, config, progress=steps.append)
    assert len(steps) == count_decodes(prompts, config, len(systems)) == 15
    assert [m.order for m in ms] == [("ar", "stock", "chain"), ("stock", "chain", "ar"),
                                     ("chain", "ar", "stock"), ("ar", "stock", "chain")]
    assert [(m.set_name, m.batch_index) for m in ms] == [("gsm8k", 0), ("gsm8k", 1), ("humaneval", 0), ("humaneval", 1)]
    ar_gen = tiny_session.generator(load_system(AR_NAME, tiny_deployment))
    for m in ms:
        assert m.ar.seconds > 0 and m.ar.outputs[0].rounds == m.ar.outputs[0].tokens
        # float32 on CPU: speculative tokens equal AR's exactly
        for run in m.systems:
            assert run.seconds > 0 and all(o.identical and o.first_divergence is None for o in run.outputs)
            assert sum(run.outputs[0].accept_histogram) == run.outputs[0].rounds
        prompt = next(p for p in prompts if p.set_name == m.set_name and p.index == m.prompts[0].index)
        assert m.ar.outputs[0].tokens == len(ar_gen.generate([prompt.as_list()], 5).outputs[0])


def test_batched_run_times_whole_batches(tiny_session, tiny_deployment):
    systems = systems_under_test(["stock"], tiny_deployment)
    config = BenchConfig.for_deployment(tiny_deployment, sets=("mbpp",), n_prompts=4, batch=2, max_new_tokens=4,
                                        warmup_tokens=2)
    prompts = prompt_ids(tiny_deployment, tiny_session.tokenizer, config.sets, config.n_prompts)
    ms = run_benchmark(tiny_session, systems, prompts, config)
    assert len(ms) == 2 and all(len(m.prompts) == 2 and len(m.systems[0].outputs) == 2 for m in ms)
    assert all(o.identical for m in ms for o in m.systems[0].outputs)


def test_context_overflow_fails_before_timing(tiny_session, tiny_deployment):
    systems = systems_under_test(["stock"], tiny_deployment)
    config = BenchConfig.for_deployment(tiny_deployment, sets=("gsm8k",), n_prompts=1, max_new_tokens=5000)
    prompts = prompt_ids(tiny_deployment, tiny_session.tokenizer, config.sets, config.n_prompts)
    steps = []
    with pytest.raises(ConfigError, match="context"):
        run_benchmark(tiny_session, systems, prompts, config, progress=steps.append)
    assert steps == []
