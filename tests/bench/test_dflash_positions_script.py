"""scripts/dflash_positions.py: the loop split and the per-offset accuracy of the shipped drafter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dflash_positions.py"


def _module():
    spec = importlib.util.spec_from_file_location("dflash_positions", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_looping_marks_ngrams_seen_before():
    mod = _module()
    seq = [1, 2, 3, 9, 1, 2, 3, 4]
    assert mod.looping(seq, 3) == [False, False, False, False, True, False, False, False]
    assert mod.looping([5, 5, 5, 5], 2) == [False, True, True, False]


@pytest.mark.slow
def test_shipped_drafter_on_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--n-prompts", "1", "--tokens", "24", "--device", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "dflash_positions.json").read_text())
    assert doc["prompts"] == 5 and doc["block_size"] == 16
    assert doc["all"]["anchors"] == doc["looping"]["anchors"] + doc["fresh"]["anchors"] == 5 * (24 - 16 + 2)
    for key in ("all", "root_ablated"):
        acc = doc[key]["offset_accuracy"]
        assert len(acc) == 15 and all(0 <= a <= 1 for a in acc)
        assert 1 <= doc[key]["chain_accepted_length"] <= 16
