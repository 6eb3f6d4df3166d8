"""scripts/headline.py (the GPU driver): its plan, resumption and table, without a GPU or a model.

The bench outputs here are fake: measurements made up per set, summarised by bench's own
`summarise` and written by its `write_json`, so they have the shape a GPU run writes."""

import json
from dataclasses import replace

import numpy as np
import pytest

from specpilot.bench.report import write_json
from specpilot.bench.results import BenchResult, summarise
from specpilot.bench.runner import BatchMeasurement, EngineRun, Output, PromptInfo
from specpilot.config import System


@pytest.fixture(scope="module")
def driver(bench_script):
    return bench_script("headline")


@pytest.fixture
def systems_dir(tmp_path):
    final = tmp_path / "final.toml"
    final.write_text(System(name="whatever", depth=3, topk=1, tree_budget=3).to_toml())
    ref = tmp_path / "ref.toml"
    ref.write_text(System(name="ref", depth=2, topk=1, tree_budget=2).to_toml())
    loop = tmp_path / "loop"
    loop.mkdir()
    knobs = System(name="k", depth=4, topk=2, tree_budget=5).knobs()
    (loop / "report.json").write_text(json.dumps({"final_system": {"name": "knob:depth=4", "knobs": knobs,
                                                                   "has_patch": False}}))
    return tmp_path


def argv(dep, out, *extra):
    return ["--row", str(dep), "--n-prompts", "5", "--max-new-tokens", "6", "--resamples", "200",
            "--device", "cpu", "--out", str(out), *extra]


def fake_bench(row, config, out_dir, seed=0):
    """A results.json for `row` under `config`: per set 5 units, systems faster than AR by set."""
    rng = np.random.default_rng(seed)
    measurements = []
    for k, set_name in enumerate(config.sets):
        for i in range(config.n_prompts // config.batch):
            def run(name, seconds, rounds):
                outs = tuple(Output(6, rounds, (0,) * (6 // rounds - 1) + (rounds,), True, None)
                             for _ in range(config.batch))
                return EngineRun(name, seconds, 0.001, outs)

            ar = run("ar", 1.0 + 0.1 * rng.random(), 6)
            systems = tuple(run(s.name, (0.6 - 0.1 * j) * (1 + 0.1 * rng.random()) / (1 + 0.1 * k), 3 - (j > 0))
                            for j, s in enumerate(row.systems))
            info = tuple(PromptInfo(i * config.batch + b, f"{set_name}-{i}-{b}", 10) for b in range(config.batch))
            measurements.append(BatchMeasurement(set_name, i, info, ("ar", *(s.name for s in row.systems)),
                                                 ar, systems))
    measurements = tuple(measurements)
    result = BenchResult(deployment=row.deployment, config=config,
                         systems=summarise(measurements, row.systems, config), measurements=measurements,
                         environment={"gpu": "Fake GPU", "git_commit": "abc1234", "dtype": "bfloat16",
                                      "versions": {"torch": "0"}}, created="2026-12-08T00:00:00Z",
                         command=("fake",), chat_template=False, wall_seconds=12.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    return json.loads(write_json(result, out_dir).read_text())


def test_dry_run_plans_rows_finals_and_baselines(driver, tiny_deployment_toml, systems_dir, tmp_path, capsys):
    dep = tiny_deployment_toml
    args = argv(dep, tmp_path / "out", "--row", f"{dep}@b5", "--final", f"tiny@b1={systems_dir / 'final.toml'}",
                "--final", f"tiny={systems_dir / 'loop'}", "--baseline", f"ref={systems_dir / 'ref.toml'}",
                "--baseline", f"tiny@b1:ref2={systems_dir / 'ref.toml'}", "--dry-run")
    one, five = driver.plan(driver.parse_args(args))
    assert (one.name, five.name) == ("tiny@b1", "tiny@b5")
    assert [s.name for s in one.systems] == ["stock", "final", "ref", "ref2"]  # the @b1 final is the more specific
    assert [s.name for s in five.systems] == ["stock", "final", "ref"]
    assert (one.systems[1].depth, five.systems[1].depth, five.systems[1].tree_budget) == (3, 4, 5)
    assert five.final_source.endswith("loop (knob:depth=4)") and five.config.batch == 5
    assert (one.config.max_new_tokens, one.config.ignore_eos, one.config.n_prompts) == (6, True, 5)
    assert driver.main(args) == 0
    err = capsys.readouterr().err
    assert "tiny@b1" in err and "[todo] 5 prompts x 5 sets x 6 new tokens (EOS ignored), batch 1" in err
    assert "systems: stock, final, ref, ref2" in err and "checks out" in err and "~" in err
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


@pytest.mark.parametrize("extra, message", [
    (["--row", "no-such-deployment"], "no-such-deployment"),
    (["--final", "tiny=/no/such/loop"], "neither a loop run directory nor a system file"),
    (["--final", "other=/no/such/loop"], "'other' names no row"),
    (["--row", "{dep}@b0"], "expected b1, bN or batched"),
    (["--baseline", "stock=scripts/systems/tree.toml"], "distinct names"),
])
def test_bad_input_is_one_error_line(driver, tiny_deployment_toml, tmp_path, capsys, extra, message):
    args = argv(tiny_deployment_toml, tmp_path, *(e.format(dep=tiny_deployment_toml) for e in extra))
    if extra[0] == "--row":
        args = args[2:]  # that row alone
    assert driver.main([*args, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_finished_rows_are_skipped_and_the_table_marks_the_rest(driver, tiny_deployment_toml, systems_dir,
                                                                 tmp_path, capsys):
    out = tmp_path / "out"
    args = argv(tiny_deployment_toml, out, "--row", f"{tiny_deployment_toml}@b5",
                "--final", f"tiny={systems_dir / 'final.toml'}", "--baseline", f"ref={systems_dir / 'ref.toml'}")
    one, five = driver.plan(driver.parse_args(args))
    doc = fake_bench(one, one.config, out / one.name)
    # the first row is done; the second would need a model: a budget of 0 s starts nothing
    assert driver.main([*args, "--max-seconds", "0"]) == 0
    err = capsys.readouterr().err
    assert "tiny@b1: measured already" in err and "tiny@b5: estimated" in err and "not started" in err
    table = (out / "headline.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `tiny`")]
    assert len(rows) == 2 and "not yet measured" in rows[1] and "not yet measured" not in rows[0]
    assert "6 new tokens (EOS ignored)" in table and "1/2 rows measured" in table and "Fake GPU" in table
    stock, final, ref = doc["systems"]
    line = json.loads((out / "headline.json").read_text())["rows"][0]
    assert line["stock_over_ar"] == stock["geomean_speedup"] and line["final_over_stock"] == final["geomean_gain"]
    assert driver.fmt(final["geomean_speedup"]) in rows[0] and driver.fmt(final["geomean_gain"]) in rows[0]
    # final / baseline: bench's gain with the baseline first; with stock as the baseline it is results.json's own
    assert driver.gain_over(doc, "final", "stock") == final["geomean_gain"]
    over_ref = line["final_over_baseline"]["ref"]
    assert over_ref["estimate"] == pytest.approx(final["geomean_speedup"]["estimate"]
                                                 / ref["geomean_speedup"]["estimate"])
    assert driver.fmt(over_ref) in rows[0]
    # a row measured with another config is refused, not overwritten
    assert driver.main([*args, "--max-new-tokens", "5", "--dry-run"]) == 2
    assert "measured with another config" in capsys.readouterr().err


def test_per_set_parts_merge_into_the_row(driver, tiny_deployment_toml, systems_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = argv(tiny_deployment_toml, out, "--final", f"tiny={systems_dir / 'final.toml'}", "--per-set",
                "--sets", "gsm8k", "mbpp")
    (row,) = driver.plan(driver.parse_args(args))
    parts = row.parts(True)
    assert [f for f, _ in parts] == ["tiny@b1/gsm8k", "tiny@b1/mbpp"]
    docs = [fake_bench(row, c, out / f, seed=k) for k, (f, c) in enumerate(parts)]
    assert driver.main(args) == 0  # every part in: merged without a model
    assert "merged 2 sets" in capsys.readouterr().err
    merged = json.loads((out / row.name / "results.json").read_text())
    assert driver.recorded(merged) == driver.expected(row)
    measurements = tuple(m for d in docs for m in driver.measurements_from(d))
    direct = summarise(measurements, row.systems, replace(row.config))
    assert merged["systems"][1]["geomean_gain"] == direct[1].gain.to_dict()
    assert "1/1 rows measured" in (out / "headline.md").read_text()
