"""The final measurement runs the benchmark of the deployment's regime: static batches, or the
serving benchmark at the regime's concurrency for a continuous deployment (CPU, float32)."""

import json
from dataclasses import replace

import pytest

from specpilot.bench.runner import BenchConfig
from specpilot.bench.serving import ServingConfig
from specpilot.config import Deployment
from specpilot.errors import ConfigError
from specpilot.loop.final import (
    bench_argv,
    bench_config,
    heldout_config,
    measure_final,
    serving_line,
)
from specpilot.loop.journal import plain_json
from specpilot.loop.report import format_speedup, heldout_line, render_final
from specpilot.loop.systems import Candidate

SETS = '["gsm8k", "mbpp"]'


def write_deployment(path, target_dir, drafter_dir, regime: str) -> Deployment:
    path.write_text(f'name = "tiny-final"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\nsets = {SETS}\n'
                    f"max_new_tokens = 6\nn_prompts = 2\n[regime]\n{regime}\n"
                    "[stock]\ndepth = 3\ntopk = 2\ntree_budget = 4\n")
    return Deployment.from_toml(path)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory, target_dir, drafter_dir):
    tmp = tmp_path_factory.mktemp("final")
    continuous = write_deployment(tmp / "continuous.toml", target_dir, drafter_dir, "batch = 2\ncontinuous = true")
    static = write_deployment(tmp / "static.toml", target_dir, drafter_dir, "batch = 2")
    return continuous, static, tmp


@pytest.fixture(scope="module")
def session(deployments):
    from specpilot.engine.session import Session

    return Session.load(deployments[1], device="cpu")  # the same models; measure_final takes the deployment apart


def candidates(dep: Deployment):
    return Candidate(dep.stock), Candidate(dep.stock.with_changes(name="chain", depth=3, topk=1, tree_budget=3))


def test_the_final_benchmark_follows_the_regime(deployments):
    continuous, static, tmp = deployments
    batch = bench_config(static, 3, 64)
    assert isinstance(batch, BenchConfig) and (batch.batch, batch.n_prompts, batch.max_new_tokens) == (2, 4, 6)
    serve = bench_config(continuous, 3, 64)
    # at least 5 units (an interval) of 2 requests per slot at concurrency 2: 20 requests from 2 sets
    assert isinstance(serve, ServingConfig)
    assert (serve.concurrency, serve.requests_per_slot, serve.units, serve.n_prompts) == ((2,), 2, 5, 10)
    assert serve.arrival_rate == 0 and serve.max_new_tokens == 6
    big = bench_config(replace(continuous, sets=("gsm8k",)), 30, 6)
    assert (big.units, big.n_prompts) == (8, 32)  # 30 requests ask for ceil(30 / 4) = 8 units
    argv = bench_argv("d.toml", tmp / "f.toml", serve, tmp / "out")
    assert argv[argv.index("--regime") + 1] == "serving" and argv[argv.index("--concurrency") + 1] == "2"
    assert argv[argv.index("--units") + 1] == "5" and "--batch" not in argv
    argv = bench_argv("d.toml", tmp / "f.toml", batch, tmp / "out")
    assert "--regime" not in argv and argv[argv.index("--batch") + 1] == "2"


def test_a_continuous_deployment_is_measured_by_the_serving_benchmark(deployments, session):
    continuous, _, tmp = deployments
    stock, final = candidates(continuous)
    result = measure_final(session, continuous, continuous.source, stock, final, bench_config(continuous, 2, 6), tmp)
    bench = result.bench
    assert result.serving and bench["schema"] == "specpilot.serving/1" and bench["config"]["concurrency"] == [2]
    (level,) = bench["levels"]
    assert (level["concurrency"], level["units"], level["unit_requests"]) == (2, 5, 4)
    ar, s, f = level["engines"]
    assert [e["name"] for e in (ar, s, f)] == ["ar", "stock", "final"]
    assert s["identical"] == f["identical"] == f["requests"] == 20  # float32 CPU: every output equals AR's
    for iv in (result.stock_speedup, result.final_speedup, result.final_gain):
        assert set(iv) == {"estimate", "low", "high", "level", "method", "no_interval"}
        assert iv["low"] is not None and iv["low"] <= iv["estimate"] <= iv["high"]  # 5 units: an interval
    rate = {e["name"]: e["tokens"] / e["seconds"] for e in (ar, s, f)}
    assert result.stock_speedup["estimate"] == pytest.approx(rate["stock"] / rate["ar"])
    assert result.final_gain["estimate"] == pytest.approx(rate["final"] / rate["stock"])  # paired, same units
    assert s["gain"] is None and f["baseline"] == "stock"
    doc = result.to_dict()
    assert doc["regime"] == "serving" and doc["final_gain"] == result.final_gain
    json.dumps(plain_json(doc), allow_nan=False)  # what report.json holds

    # the report says what ran: the serving run, not the batch benchmark
    md = "\n".join(render_final({"final": doc, "final_system": {"name": "chain"}}))
    assert "continuous batching at concurrency 2, closed loop" in md and "5 units of 4 requests" in md
    assert "batch by batch" not in md and "| tok/s (95% CI) | TPOT p50 ms | identical to AR |" in md
    assert "| final `chain` |" in md and md.count("| 20/20 |") == 2
    line = serving_line(doc)
    assert line.startswith("concurrency 2, 5 units of 4 requests: AR ") and "stock 20/20, final 20/20" in line
    # two requests per slot: the first pair decodes while the second waits, the second drains
    for unit in bench["units"]:
        for run in (unit["ar"], *unit["systems"]):
            assert 0 < run["saturated_tokens"] < sum(r["tokens"] for r in run["requests"])
            assert 0 < run["saturated_seconds"] < run["seconds"]
    assert f["saturated_speedup"]["estimate"] > 0 and ar["saturated_speedup"] is None
    assert f"final {f['saturated_speedup']['estimate']:.2f}x [" in line.split("while a request waited for a slot")[1]
    assert result.saturated_gain == f["saturated_gain"] and doc["saturated_gain"]["estimate"] > 0
    assert f"final / stock {result.saturated_gain['estimate']:.2f}x [" in line.split("while a request waited")[1]
    assert "| saturated over AR | saturated over stock |" in md
    assert f"| {result.saturated_gain['estimate']:.2f}x [" in md.split("| final `chain` |")[1].split("\n")[0]
    from specpilot.cli.run import summary

    report = {"deployment": {"name": "tiny-final", "device": "cpu"}, "run": {"stop": "rounds", "out": "x"},
              "final": doc, "rounds": [], "start": {"cumulative_gain": 0.0}, "promotions": [],
              "final_system": {"name": "chain", "changes_from_stock": {}}}
    assert f"(while every slot was taken: {result.saturated_gain['estimate']:.2f}x [" in summary(report)


@pytest.mark.filterwarnings("error::UserWarning")  # a plot of no rounds warns of an empty legend
def test_the_report_plot_and_summary_of_a_serving_run(deployments, session, tmp_path):
    from specpilot.cli.run import summary
    from specpilot.loop.plots import plot_trajectory

    continuous, _, tmp = deployments
    stock, _ = candidates(continuous)
    result = measure_final(session, continuous, continuous.source, stock, stock, bench_config(continuous, 2, 6), tmp)
    assert result.final is None and result.final_gain is None and result.serving
    doc = plain_json(result.to_dict())
    md = "\n".join(render_final({"final": doc, "final_system": {"name": "stock"}}))
    assert "| final" not in md and md.count("| 20/20 |") == 1
    report = {"deployment": {"name": "tiny-final", "device": "cpu"}, "run": {"stop": "rounds", "out": str(tmp_path)},
              "final": doc, "rounds": [], "start": {"cumulative_gain": 0.0}, "promotions": [],
              "final_system": {"name": "stock", "changes_from_stock": {}}}
    assert "speedup over AR (one serving run at concurrency 2, 95% CI): stock " in summary(report)
    assert plot_trajectory(report, tmp_path / "t.png").stat().st_size > 0


def test_a_static_deployment_keeps_the_batch_benchmark(deployments, session):
    continuous, static, tmp = deployments
    stock, final = candidates(static)
    result = measure_final(session, static, static.source, stock, final, bench_config(static, 2, 6), tmp)
    assert not result.serving and result.bench["schema"] == "specpilot.bench/2"
    assert [s["name"] for s in result.bench["systems"]] == ["stock", "final"]
    assert result.final_gain == result.system("final")["geomean_gain"] and result.to_dict()["regime"] == "batch"
    md = "\n".join(render_final({"final": plain_json(result.to_dict()), "final_system": {"name": "chain"}}))
    assert "interleaved batch by batch on 2 sets x 4 prompts x 6 new tokens (batch 2)" in md
    with pytest.raises(ConfigError, match="serving benchmark"):  # never the regime the loop did not optimise for
        measure_final(session, continuous, continuous.source, stock, final, bench_config(static, 2, 6), tmp)


def test_the_held_out_run_is_sized_like_the_final_benchmark(deployments):
    """At least MIN_UNITS batches or serving units of the final benchmark's size (an interval needs
    them), as far as the held-out set's 40 prompts go; none for 0 prompts or when not one fits."""
    continuous, static, _ = deployments
    batch = heldout_config(bench_config(static, 3, 64), 8)
    assert (batch.sets, batch.n_prompts, batch.batch, batch.max_new_tokens) == (("heldout",), 10, 2, 6)
    assert heldout_config(bench_config(static, 3, 64), 13).n_prompts == 14
    assert heldout_config(bench_config(static, 3, 64), 99).n_prompts == 40  # the whole set
    assert heldout_config(bench_config(static, 3, 64), 0) is None
    serve = heldout_config(bench_config(continuous, 3, 64), 8)
    assert (serve.sets, serve.units, serve.n_prompts, serve.concurrency) == (("heldout",), 5, 20, (2,))
    wide = heldout_config(bench_config(replace(continuous, regime=replace(continuous.regime, batch=8)), 3, 64), 8)
    assert (wide.units, wide.n_prompts) == (2, 32)  # units of 16: two fit, no interval
    huge = bench_config(replace(static, regime=replace(static.regime, batch=41)), 3, 64)
    assert heldout_config(huge, 8) is None


def test_the_final_measurement_adds_the_held_out_gain(deployments, session):
    """After the final benchmark, AR, stock and the final system on held-out prompts the loop never
    saw: final over stock with an interval (5 batches of 2), in the result, report.json and the report."""
    from specpilot.cli.run import summary

    _, static, tmp = deployments
    stock, final = candidates(static)
    result = measure_final(session, static, static.source, stock, final, bench_config(static, 2, 6), tmp,
                           heldout_prompts=8)
    held = result.heldout
    assert held["config"]["sets"] == ["heldout"] and held["config"]["n_prompts"] == 10
    assert [s["name"] for s in held["systems"]] == ["stock", "final"]
    assert [s["set"] for s in held["systems"][1]["sets"]] == ["heldout"]
    gain = result.heldout_gain
    assert gain == held["systems"][1]["geomean_gain"] and gain["low"] is not None
    assert gain["low"] <= gain["estimate"] <= gain["high"]
    assert result.bench["config"]["sets"] == ["gsm8k", "mbpp"]  # the main run is unchanged
    doc = plain_json(result.to_dict())
    json.dumps(doc, allow_nan=False)
    assert doc["heldout"]["prompts"] == 10 and doc["heldout"]["final_gain"] == gain
    line = heldout_line(doc)
    assert line == (f"held-out prompts (never seen by the loop, 10 prompts): final / stock {format_speedup(gain)}; "
                    f"final over AR {format_speedup(doc['heldout']['final_speedup'])}")
    assert "[n/a" not in line
    report = {"deployment": {"name": "tiny-final", "device": "cpu"}, "run": {"stop": "rounds", "out": "x"},
              "final": doc, "rounds": [], "start": {"cumulative_gain": 0.0}, "promotions": [],
              "final_system": {"name": "chain", "changes_from_stock": {}}}
    assert line in summary(report)
    # stock as the final system: nothing to compare, no held-out run
    same = measure_final(session, static, static.source, stock, stock, bench_config(static, 2, 6), tmp,
                         heldout_prompts=8)
    assert same.heldout is None and same.heldout_gain is None and heldout_line(same.to_dict()) is None


def test_a_continuous_deployment_serves_the_held_out_prompts(deployments, session):
    """Under continuous batching the held-out run is the serving benchmark at the same concurrency:
    5 units of 4 held-out requests, the gain final / stock paired by unit, with an interval."""
    continuous, _, tmp = deployments
    stock, final = candidates(continuous)
    result = measure_final(session, continuous, continuous.source, stock, final, bench_config(continuous, 2, 6), tmp,
                           heldout_prompts=4)
    held = result.heldout
    assert held["schema"] == "specpilot.serving/1" and held["config"]["sets"] == ["heldout"]
    (level,) = held["levels"]
    assert (level["concurrency"], level["units"], level["unit_requests"]) == (2, 5, 4)
    assert result.heldout_gain == level["engines"][-1]["gain"] and result.heldout_gain["low"] is not None
    assert result.to_dict()["heldout"]["prompts"] == 20
