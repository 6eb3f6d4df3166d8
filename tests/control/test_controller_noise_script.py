"""scripts/controller_noise.py on CPU with fake runners: both placements, files written by code."""

import json

import pytest

from fake_runners import WORKDIR

ARGS = ["--deployment", "fixture", "--blocks", "5", "--requests-per-block", "2", "--max-new-tokens", "8",
        "--runner", "fake_runners:SpeedRunner", "--workdir", WORKDIR, "--prompt-source",
        "fake_runners:prompt_source_factory", "--resamples", "500"]


@pytest.mark.slow
def test_both_placements_write_json_and_markdown(tmp_path, bench_script):
    script = bench_script("controller_noise")
    assert script.main([*ARGS, "--out", str(tmp_path), "--devices", "cpu,cpu", "--placement", "both"]) == 0
    result = json.loads((tmp_path / "controller_noise.json").read_text())
    assert [m["placement"] for m in result["modes"]] == ["alternate", "side-by-side"]
    for mode in result["modes"]:
        assert mode["noise"]["blocks"] == 5 and mode["noise"]["value"] >= 0
        assert mode["evaluation"]["verdict"] in ("reject", "need-more-data")  # stock never beats itself
        assert mode["seconds_per_block"] > 0 and mode["projected_evaluation_seconds"]["full_budget"] > 0
    assert result["commit"] is not None and result["date"] and result["provenance"]["versions"]["torch"]
    md = (tmp_path / "controller_noise.md").read_text()
    assert "| alternate | 5 |" in md and "| side-by-side | 5 |" in md


def test_missing_runner_fails_with_one_clear_line(tmp_path, capsys, bench_script):
    script = bench_script("controller_noise")
    code = script.main([*ARGS, "--out", str(tmp_path), "--devices", "cpu", "--runner", "specpilot.engine.nope:Runner",
                        "--no-evaluation"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runner factory 'specpilot.engine.nope:Runner' cannot be imported" in err[0]
    assert not (tmp_path / "controller_noise.json").exists()


def test_too_few_blocks_fail_with_one_clear_line(tmp_path, capsys, bench_script):
    script = bench_script("controller_noise")
    args = [a if a != "5" else "3" for a in ARGS]  # --blocks 3: no bootstrap interval from so few
    assert script.main([*args, "--out", str(tmp_path), "--devices", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "noise_blocks must be >= 5" in err[0], err
    assert not (tmp_path / "controller_noise.json").exists()
