"""--ignore-eos: fixed-length runs on the tiny CPU model, through the generator, the runner and the CLI.

The tiny random model rarely emits its EOS, so the session here declares as EOS a token that AR
emits early on the first prompt: without --ignore-eos that output ends there; with it every output,
AR's and the system's, has exactly max_new_tokens tokens, and they stay equal (lossless).
"""

import json

import pytest

from specpilot.bench.prompts import prompt_ids
from specpilot.bench.runner import AR_NAME, BenchConfig, run_benchmark, systems_under_test
from specpilot.cli import bench as cli
from specpilot.config import load_system
from specpilot.engine.session import Session

MAX_NEW = 8


@pytest.fixture(scope="module")
def eos_session(tiny_session, tiny_deployment):
    """The tiny session with the third token AR emits on the first mbpp prompt declared EOS."""
    prompts = prompt_ids(tiny_deployment, tiny_session.tokenizer, ("mbpp",), 2)
    ar = tiny_session.generator(load_system(AR_NAME, tiny_deployment))
    first = ar.generate([prompts[0].as_list()], MAX_NEW).outputs[0]
    eos = first[2]
    session = Session(tiny_deployment, tiny_session.target, tiny_session.drafter_model, tiny_session.tokenizer, (eos,))
    return session, prompts, first.index(eos) + 1


def test_generator_decodes_through_eos_when_asked(eos_session, tiny_deployment):
    session, prompts, stop = eos_session
    for name in (AR_NAME, "stock"):
        gen = session.generator(load_system(name, tiny_deployment))
        ids = [p.as_list() for p in prompts]
        stopped = gen.generate(ids, MAX_NEW).outputs
        full = gen.generate(ids, MAX_NEW, stop_at_eos=False).outputs
        assert len(stopped[0]) == stop < MAX_NEW
        assert [len(o) for o in full] == [MAX_NEW] * len(prompts)
        assert all(f[: len(s)] == s for f, s in zip(full, stopped))  # the same tokens, continued


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_runner_passes_ignore_eos_to_every_engine(eos_session, tiny_deployment, ignore_eos):
    session, prompts, stop = eos_session
    systems = systems_under_test(["stock"], tiny_deployment)
    config = BenchConfig.for_deployment(tiny_deployment, sets=("mbpp",), n_prompts=2, max_new_tokens=MAX_NEW,
                                        warmup_tokens=2, ignore_eos=ignore_eos)
    ms = run_benchmark(session, systems, prompts, config)
    outputs = [o for m in ms for o in (*m.ar.outputs, *m.systems[0].outputs)]
    assert all(o.identical for m in ms for o in m.systems[0].outputs)  # float32 on CPU: lossless
    if ignore_eos:
        assert all(o.tokens == MAX_NEW for o in outputs)
    else:
        assert ms[0].ar.outputs[0].tokens == ms[0].systems[0].outputs[0].tokens == stop


def test_cli_flag_sets_the_config_and_is_recorded(tiny_deployment_toml, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--deployment", str(tiny_deployment_toml), "--sets", "mbpp", "--n-prompts", "2", "--max-new-tokens", "4",
            "--warmup-tokens", "2", "--resamples", "200", "--device", "cpu", "--out", str(out), "--no-progress",
            "--ignore-eos"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["ignore_eos"] is True and doc["config"]["interval"] == "bca"
    assert all(o["tokens"] == 4 for b in doc["batches"] for o in (*b["ar"]["outputs"], *b["systems"][0]["outputs"]))
    assert "exactly 4 new tokens (EOS ignored)" in (out / "results.md").read_text()
    speedup = doc["systems"][0]["sets"][0]["speedup"]  # two prompts: no interval
    assert speedup["low"] is None and speedup["no_interval"] == "n < 5"
