"""scripts/dflash_recipe.py: one set of sequences, the variants trained from it side by side, one
results file with a row per variant (--smoke: a random tiny target on CPU)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_variants_share_one_data_file(bench_script, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the variants' processes run side by side
    script = bench_script("dflash_recipe")
    assert script.main(["--smoke", "--out", str(tmp_path), "--variant", "base", "--variant", "window128"]) == 0
    doc = json.loads((tmp_path / "dflash_recipe.json").read_text())
    assert [r["variant"] for r in doc["variants"]] == ["base", "window128"]
    assert all(r["rc"] == 0 and r["steps"] == 6 for r in doc["variants"])
    for name in ("base", "window128"):
        assert "data: read" in (tmp_path / f"{name}.log").read_text()  # not generated again
        assert (tmp_path / name / "dflash" / "config.json").is_file()
    assert not (tmp_path / "sequences.pt").exists()
    assert "| window128 | 6 |" in (tmp_path / "dflash_recipe.md").read_text()
