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
    no_final = run("--dry-run", "--out", str(tmp_path / "o"), "--no-final", home=tmp_path)
    assert no_final.returncode == 0 and "no final measurement" in no_final.stdout
    assert "final: 5 prompts/set" in ok.stdout
    bad = run("--dry-run", "--out", str(tmp_path / "o"), "--controller", "no_such_field=1", home=tmp_path)
    assert bad.returncode == 2 and "no_such_field" in bad.stderr


def test_the_logs_of_dead_workers_are_packed_beside_the_report(tmp_path, monkeypatch, bench_script):
    """Only logs the workers folder still holds (a dead worker's) and written during the run."""
    import os
    import tarfile

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    script = bench_script("loop_fixture")
    from specpilot import env

    old = env.worker_logs() / "pair-old" / "candidate.log"
    old.parent.mkdir()
    old.write_text("an earlier run")
    os.utime(old, (1000.0, 1000.0))
    out = tmp_path / "out"
    out.mkdir()
    assert script.pack_worker_logs(out, since=2000.0) is None and not (out / "workers.tar.gz").exists()
    dead = env.worker_logs() / "shared-x" / "shared0.log"
    dead.parent.mkdir()
    dead.write_text("Traceback: out of memory")
    packed = script.pack_worker_logs(out, since=2000.0)
    with tarfile.open(packed) as tar:
        assert tar.getnames() == ["shared-x/shared0.log"]
        assert tar.extractfile("shared-x/shared0.log").read() == b"Traceback: out of memory"


def test_a_resumed_run_merges_its_memory_json_into_the_memory(tmp_path, monkeypatch, bench_script):
    """Another machine's call left OUT/memory.json: --resume merges it (once; again adds nothing),
    a run without one has nothing to merge, and an unreadable one is an error."""
    import json

    from specpilot.errors import SpecPilotError
    from specpilot.memory.store import Memory

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "memory"))
    from memory_fixtures import CONFIG, evaluation, fingerprint, spec

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    script = bench_script("loop_fixture")
    with Memory(tmp_path / "there.sqlite") as there:
        there.record_evaluation(fingerprint(), evaluation(spec("deep", depth=8)), CONFIG, round="r1")
        exported = there.export()
    out = tmp_path / "out"
    out.mkdir()
    assert script.import_memory(out / "memory.json", None) == ""
    (out / "memory.json").write_text(json.dumps(exported))
    db = tmp_path / "here.sqlite"
    assert "1 evaluation(s)" in script.import_memory(out / "memory.json", str(db))
    assert "0 evaluation(s)" in script.import_memory(out / "memory.json", str(db))
    with Memory(db) as here:
        assert [e.candidate.name for e in here.entries()] == ["deep"]
    (out / "memory.json").write_text("{")
    with pytest.raises(SpecPilotError, match="cannot be read as a memory export"):
        script.import_memory(out / "memory.json", str(db))
