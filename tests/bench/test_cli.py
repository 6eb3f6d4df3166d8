"""`specpilot bench` end to end on the tiny deployment: one command, the table, the JSON, the plots."""

import json

import pytest

from specpilot.cli import bench as cli
from specpilot.bench.report import OUTPUT_FILES

SET_KEYS = {"set", "prompts", "batches", "speedup", "gain", "ar_seconds", "seconds", "ar_tokens", "tokens", "rounds",
            "ar_tokens_per_second", "tokens_per_second", "mean_accepted_length", "identical", "accept_histogram"}
SYSTEM_KEYS = {"name", "fingerprint", "knobs", "diff_vs_stock", "geomean_speedup", "baseline", "geomean_gain",
               "prompts", "identical", "mean_accepted_length", "accept_histogram", "sets"}
ENV_KEYS = {"git_commit", "git_dirty", "device", "dtype", "gpu", "gpu_count", "cuda", "driver", "cpu",
            "torch_threads", "versions", "platform", "hostname"}
CONFIG_KEYS = {"sets", "n_prompts", "max_new_tokens", "batch", "seed", "warmup_tokens", "resamples", "level",
               "interval", "bootstrap_seed", "ignore_eos", "chat_template", "dropped_prompts", "speedup_definition"}
INTERVAL_KEYS = {"estimate", "low", "high", "level", "method", "no_interval"}


@pytest.fixture(scope="module")
def bench_run(tiny_deployment_toml, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "run"
    argv = ["--deployment", str(tiny_deployment_toml), "--system", "stock", "--max-new-tokens", "4",
            "--warmup-tokens", "2", "--resamples", "500", "--device", "cpu", "--out", str(out), "--no-progress"]
    return argv, out


@pytest.mark.slow
def test_one_command_writes_table_json_and_plots(bench_run, capsys):
    argv, out = bench_run
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    table = captured.out
    assert "bench: 5 sets x 2 prompts per set x up to 4 new tokens, AR and 1 system(s)" in captured.err
    assert "geomean" in table and "stock speedup" in table and "identical to AR" in table
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    for png in ("speedup.png", "accept_hist.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| geomean |" in (out / "results.md").read_text()

    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == "specpilot.bench/2" and doc["command"][:2] == ["specpilot", "bench"]
    assert ENV_KEYS <= set(doc["environment"]) and doc["environment"]["versions"]["torch"]
    assert doc["environment"]["dtype"] == "float32" and doc["environment"]["device"] == "cpu"
    assert doc["deployment"]["name"] == "tiny" and doc["deployment"]["stock"]["depth"] == 3
    assert CONFIG_KEYS <= set(doc["config"]) and doc["config"]["max_new_tokens"] == 4
    (system,) = doc["systems"]
    assert SYSTEM_KEYS <= set(system) and INTERVAL_KEYS <= set(system["geomean_speedup"])
    assert [s["set"] for s in system["sets"]] == ["gsm8k", "math500", "humaneval", "mbpp", "mt_bench"]
    assert all(SET_KEYS <= set(s) and s["prompts"] == 2 for s in system["sets"])
    assert system["identical"] == system["prompts"] == 10  # float32 on CPU: lossless means equal tokens
    assert len(doc["batches"]) == 10
    b = doc["batches"][0]
    assert {"set", "batch", "prompts", "order", "ar", "systems"} <= set(b)
    assert set(b["systems"][0]["outputs"][0]) == {"tokens", "rounds", "mean_accepted_length", "accept_histogram",
                                                  "identical", "first_divergence"}
    assert b["ar"]["seconds"] > 0 and b["systems"][0]["seconds"] > 0


@pytest.mark.slow
def test_an_existing_results_directory_is_never_overwritten_silently(bench_run, capsys):
    argv, out = bench_run
    assert (out / "results.json").is_file()
    assert cli.main(argv) == 2
    assert "already holds files" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--sets", "gsm8k,nope"], "unknown benchmark set"),
    (["--system", "missing.toml"], "neither 'stock', 'ar' nor an existing file"),
    (["--n-prompts", "3", "--batch", "2"], "not a multiple of --batch"),
])
def test_bad_input_is_one_error_line(tiny_deployment_toml, tmp_path, capsys, extra, message):
    code = cli.main(["--deployment", str(tiny_deployment_toml), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and message in err and "\n" not in err


def test_register_adds_the_bench_subcommand():
    import argparse

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--system", "a.toml", "--system", "b.toml", "--sets", "gsm8k", "mbpp"])
    assert args.func is cli.run_bench and args.system == ["a.toml", "b.toml"] and args.sets == ["gsm8k", "mbpp"]


def test_under_foreign_load_the_cpu_run_fits_its_threads_warns_once_and_records_the_load(
        tiny_deployment_toml, tmp_path, capsys, monkeypatch):
    """Others at 99% of the CPU by the load probe (nothing burns CPU): torch times on one thread,
    one `warning:` line follows the table, and results.json keeps the load; the speedups are still
    printed (`cli/bench.py`'s rule)."""
    import torch

    from specpilot.control import load

    monkeypatch.setattr(load, "default_probe", lambda: load.FixedProbe(share=0.99, loadavg=3.5))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        code = cli.main(["--deployment", str(tiny_deployment_toml), "--sets", "gsm8k", "--n-prompts", "2",
                         "--max-new-tokens", "2", "--warmup-tokens", "1", "--resamples", "200", "--device", "cpu",
                         "--out", str(tmp_path / "run"), "--no-progress"])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert code == 0 and len(warnings) == 1 and "99% of the CPU" in warnings[0] and "not trustworthy" in warnings[0]
    assert "stock speedup" in captured.out
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["environment"]["torch_threads"] == 1
    assert doc["environment"]["cpu_load"]["foreign"] and doc["environment"]["cpu_load"]["default_threads"] == 2
