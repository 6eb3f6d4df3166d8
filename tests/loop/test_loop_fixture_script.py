"""scripts/loop_fixture.py (the GPU driver) checks its inputs and prints its plan without loading a model."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each check starts the script in a fresh interpreter

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "loop_fixture.py"


def run(*args, home):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "SPECPILOT_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""})


def test_dry_run_prints_the_plan_and_refuses_an_occupied_out(tmp_path):
    out = tmp_path / "out"
    ok = run("--dry-run", "--deployment", "fixture-x16", "--out", str(out), "--rounds", "2", home=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "plan: fixture-x16 (target x16, drafter x4, batch 1)" in ok.stdout
    assert "2 round(s) within 8.5 min" in ok.stdout
    out.mkdir()
    (out / "report.md").write_text("an earlier run")
    refused = run("--dry-run", "--out", str(out), home=tmp_path)
    assert refused.returncode == 2 and "already holds files" in refused.stderr
    bad = run("--dry-run", "--deployment", "no-such-deployment", "--out", str(tmp_path / "o2"), home=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")


def test_controller_fields_reach_the_plan(tmp_path):
    ok = run("--dry-run", "--out", str(tmp_path / "o"), "--controller", "noise_blocks=30", "--max-candidates", "1",
             home=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "1 candidates per round" in ok.stdout and "30 noise blocks" in ok.stdout
    bad = run("--dry-run", "--out", str(tmp_path / "o"), "--controller", "no_such_field=1", home=tmp_path)
    assert bad.returncode == 2 and "no_such_field" in bad.stderr
