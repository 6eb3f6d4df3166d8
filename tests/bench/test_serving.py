"""The serving benchmark: its request pool, units, arrivals, statistics, and the CLI end to end."""

import json

import numpy as np
import pytest

from specpilot.bench.prompts import BenchPrompt
from specpilot.bench.serving import ServingConfig, arrival_times, request_pool, units_of
from specpilot.bench.stats import Resampling, quantile_bootstrap, ratio_of_independent, throughput_bootstrap
from specpilot.cli import bench as cli
from specpilot.errors import ConfigError

SETS = ["gsm8k", "math500", "humaneval", "mbpp", "mt_bench"]


def prompt(set_name: str, i: int) -> BenchPrompt:
    return BenchPrompt(set_name, i, f"{set_name}-{i}", "", (1, 2, 3), False)


def test_pool_takes_the_sets_in_turn_and_units_drop_the_remainder():
    prompts = [prompt("gsm8k", i) for i in range(3)] + [prompt("mbpp", i) for i in range(2)]
    pool = request_pool(prompts)
    assert [p.source_id for p in pool] == ["gsm8k-0", "mbpp-0", "gsm8k-1", "mbpp-1", "gsm8k-2"]
    assert [[p.source_id for p in u] for u in units_of(pool, 2, 1)] == [["gsm8k-0", "mbpp-0"], ["gsm8k-1", "mbpp-1"]]
    assert len(units_of(pool, 2, 1, limit=1)) == 1 and len(units_of(pool, 1, 1, limit=0)) == 5
    with pytest.raises(ConfigError, match="raise --n-prompts"):
        units_of(pool, 6, 2)


def test_arrivals_are_seeded_poisson_and_none_in_a_closed_loop():
    assert arrival_times(0.0, 3, 0, 8, 0) == (None, None, None)
    a = arrival_times(4.0, 2000, 1, 8, 0)
    assert a == arrival_times(4.0, 2000, 1, 8, 0) and a != arrival_times(4.0, 2000, 1, 8, 1)
    gaps = np.diff(a)
    assert a[0] == 0 and np.all(gaps > 0) and abs(gaps.mean() - 0.25) < 0.02  # mean gap 1 / rate


def test_config_defaults_and_checks(tiny_deployment):
    c = ServingConfig.for_deployment(tiny_deployment)
    assert c.concurrency == (1,) and c.unit_size(8) == 32
    assert ServingConfig.for_deployment(tiny_deployment, concurrency=[2, 4], requests_per_slot=3).unit_size(4) == 12
    for bad in ({"concurrency": [0]}, {"concurrency": [2, 2]}, {"arrival_rate": -1.0}, {"requests_per_slot": 0},
                {"units": -1}):
        with pytest.raises(ConfigError):
            ServingConfig.for_deployment(tiny_deployment, **bad)


def test_serving_statistics():
    idx = Resampling.draw([6], 1000, 0).indices[0]
    seconds, tokens = np.array([1.0, 2, 1, 2, 1, 2]), np.array([100, 180, 110, 220, 90, 200])
    rate = throughput_bootstrap(seconds, tokens, idx)
    assert rate.estimate == pytest.approx(900 / 9)
    assert rate.interval().contains(100.0)
    doubled = throughput_bootstrap(seconds, 2 * tokens, idx)
    assert ratio_of_independent(doubled, rate).estimate == pytest.approx(2.0)
    values = np.arange(1.0, 25.0).reshape(6, 4)  # 6 units of 4 requests
    median = quantile_bootstrap(values, 0.5, idx)
    assert median.estimate == pytest.approx(12.5) and median.log_replicates.shape == (1000,)
    iv = median.interval()
    assert iv.low < 12.5 < iv.high
    values[0, 0] = np.nan  # a one-token output has no time per output token
    assert quantile_bootstrap(values, 0.5, idx).estimate == pytest.approx(13.0)


def test_a_later_system_gets_its_gain_over_the_first_paired_by_unit():
    from specpilot.bench.runner import PromptInfo
    from specpilot.bench.serving import ServedRequest, UnitMeasurement, UnitRun
    from specpilot.bench.serving_results import level_rows, summarise
    from specpilot.config import System

    def run(name, seconds, tokens):  # one request per unit
        return UnitRun(name, seconds, (ServedRequest(tokens, 1, seconds, 0.1, 0.01, True, None),))

    # final is 1.5x stock's throughput on every unit, whatever the unit's own speed
    units = [UnitMeasurement(1, k, (PromptInfo(k, f"p{k}", 3),), (None,), ("ar", "stock", "final"),
                             run("ar", 2.0 * t, 100), (run("stock", t, 100), run("final", t, 150)))
             for k, t in enumerate((1.0, 2.0, 1.5, 3.0, 1.2, 2.5))]
    systems = (System(name="stock"), System(name="final", depth=3))
    config = ServingConfig(("gsm8k",), 6, 8, (1,), requests_per_slot=1, resamples=200)
    (level,) = summarise(tuple(units), systems, config, 6)
    ar, stock, final = level.engines
    assert ar.gain is None and stock.gain is None and stock.baseline is None and final.baseline == "stock"
    assert final.gain.estimate == pytest.approx(1.5) and final.gain.low == pytest.approx(1.5)  # no spread
    assert final.speedup.estimate == pytest.approx(3.0) and final.to_dict()["gain"]["estimate"] == pytest.approx(1.5)
    header, rows = level_rows(level)
    assert header[3] == "over stock" and rows[2][3].startswith("1.50 [1.50, 1.50]") and rows[1][3] == ""


def test_saturated_throughput_leaves_the_ramp_down_out_and_pairs_by_unit():
    """Each unit: the system's saturated stretch runs at 4x AR's, its whole unit (ramp-down in) at 2x;
    the saturated speedup is 4x with no spread, and absent as soon as one unit never saturated."""
    from specpilot.bench.runner import PromptInfo
    from specpilot.bench.serving import ServedRequest, UnitMeasurement, UnitRun
    from specpilot.bench.serving_results import level_rows, summarise
    from specpilot.config import System

    def run(name, seconds, sat_seconds, sat_tokens):
        return UnitRun(name, seconds, (ServedRequest(100, 1, seconds, 0.1, 0.01, True, None),), sat_seconds,
                       sat_tokens)

    def units(first_saturates=True):
        return tuple(UnitMeasurement(2, k, (PromptInfo(k, f"p{k}", 3),), (None,), ("ar", "stock"),
                                     run("ar", 2.0 * t, t, 40 if first_saturates or k else 0),
                                     (run("stock", t, 0.25 * t, 40),))
                     for k, t in enumerate((1.0, 2.0, 1.5, 3.0, 1.2, 2.5)))

    config = ServingConfig(("gsm8k",), 6, 8, (2,), requests_per_slot=1, resamples=200)
    # a second system: whole units at 3x AR, saturated stretches at 8x: over stock 1.5x and 2x
    fast = tuple(UnitMeasurement(u.concurrency, u.unit_index, u.prompts, u.arrivals, ("ar", "stock", "fast"), u.ar,
                                 (*u.systems, run("fast", u.ar.seconds / 3, u.ar.saturated_seconds / 8, 40)))
                 for u in units())
    (level,) = summarise(fast, (System(name="stock"), System(name="fast")), config, 6)
    assert level.engine("fast").gain.estimate == pytest.approx(1.5)
    assert level.engine("fast").saturated_gain.estimate == pytest.approx(2.0)
    assert level.engine("fast").to_dict()["saturated_gain"]["low"] == pytest.approx(2.0)
    assert level.engine("stock").saturated_gain is None and level.engine("ar").saturated_gain is None
    (level,) = summarise(units(), (System(name="stock"),), config, 6)
    ar, stock = level.engines
    assert stock.speedup.estimate == pytest.approx(2.0)
    assert stock.saturated_speedup.estimate == pytest.approx(4.0) and stock.saturated_speedup.low == pytest.approx(4.0)
    assert ar.saturated.estimate == pytest.approx(240 / 11.2) and ar.saturated_speedup is None
    assert stock.to_dict()["saturated_speedup"]["estimate"] == pytest.approx(4.0)
    header, rows = level_rows(level)
    assert header[4:6] == ["saturated tok/s", "saturated speedup"] and rows[1][5].startswith("4.00 [4.00, 4.00]")
    (level,) = summarise(units(first_saturates=False), (System(name="stock"),), config, 6)
    assert all(e.saturated is None and e.saturated_speedup is None for e in level.engines)
    assert "saturated tok/s" not in level_rows(level)[0]


def test_cli_serving_run_writes_json_and_markdown(tiny_deployment_toml, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--deployment", str(tiny_deployment_toml), "--regime", "serving", "--concurrency", "1", "2",
            "--requests-per-slot", "1", "--units", "5", "--max-new-tokens", "5", "--warmup-tokens", "2",
            "--resamples", "200",
            "--device", "cpu", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "concurrency 1: 5 units of 1 requests, 5 left out" in table and "TPOT p50 ms" in table
    assert "concurrency 2: 5 units of 2 requests" in table
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == "specpilot.serving/1" and doc["config"]["concurrency"] == [1, 2]
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        ar, stock = lv["engines"]
        assert ar["name"] == "ar" and stock["name"] == "stock" and ar["speedup"] is None
        assert stock["identical"] == stock["requests"] == 5 * lv["concurrency"]  # float32 CPU: equal tokens
        assert ar["tokens_per_second"]["estimate"] > 0 and stock["speedup"]["low"] is not None
        assert set(ar["latency"]) == {"p50", "p90", "p99"} and ar["latency"]["p50"]["estimate"] > 0
    assert doc["levels"][0]["engines"][0]["scaling"] is None and doc["levels"][1]["engines"][0]["scaling"]
    assert len(doc["units"]) == 10 and doc["units"][0]["arrivals"] == [None]
    assert "| stock |" in (out / "results.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--regime", "serving", "--batch", "2"], "--batch is for --regime batch"),
    (["--concurrency", "4"], "--concurrency needs --regime serving"),
    (["--regime", "serving", "--concurrency", "0"], "--concurrency must be >= 1"),
    (["--regime", "serving", "--concurrency", "8"], "raise --n-prompts"),
])
def test_bad_serving_input_is_one_error_line(tiny_deployment_toml, tmp_path, capsys, extra, message):
    code = cli.main(["--deployment", str(tiny_deployment_toml), "--out", str(tmp_path / "o"), "--device", "cpu",
                     "--no-progress", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_cli_serving_run_under_foreign_load_warns_once_and_records_the_load(tiny_deployment_toml, tmp_path, capsys,
                                                                            monkeypatch):
    """The serving regime watches the CPU load as the batch regime does (`cli.cpu_load`)."""
    from specpilot.control import load

    monkeypatch.setattr(load, "default_probe", lambda: load.FixedProbe(share=0.9))
    out = tmp_path / "run"
    argv = ["--deployment", str(tiny_deployment_toml), "--regime", "serving", "--concurrency", "1",
            "--requests-per-slot", "1", "--units", "2", "--max-new-tokens", "2", "--warmup-tokens", "1",
            "--resamples", "200", "--device", "cpu", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "90% of the CPU" in warnings[0]
    assert json.loads((out / "results.json").read_text())["environment"]["cpu_load"]["foreign"]
