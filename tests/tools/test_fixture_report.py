"""tools/fixture_report.py runs every section on the smoke fixture (CPU, tiny counts)."""

from __future__ import annotations

import json

import fixture_report
import pytest

pytestmark = pytest.mark.slow


def test_report_on_the_smoke_fixture(smoke_run, tmp_path):
    deployment = tmp_path / "x4.toml"  # x16 of the smoke model is fine, but x4/x2 keeps it quick
    deployment.write_text('name = "smoke-x4"\ntarget = "fixture"\ntarget_expand = 4\ndrafter_expand = 2\n')
    out = tmp_path / "report"
    rc = fixture_report.main(["--out", str(out), "--fixture", str(smoke_run), "--deployment", str(deployment),
                              "--device", "cpu", "--n-prompts", "1", "--max-new", "8", "--samples", "1",
                              "--sample-tokens", "8", "--decode-tokens", "4", "--decode-reps", "1"])
    report = json.loads((out / "fixture_report.json").read_text())
    assert rc == 0 and report["errors"] == {}
    assert set(report["heldout"]) >= {"target_x1", "target_x4", "drafter_x1", "drafter_x2"}
    for source, v in report["heldout"]["target_x1"].items():  # float32: expansion keeps the loss
        assert abs(report["heldout"]["target_x4"][source]["loss"] - v["loss"]) <= 1e-3
    assert report["samples"]["x4_identical_outputs_float32"] == report["samples"]["outputs"]
    for variant in report["acceptance"]["variants"].values():
        for row in variant["sets"].values():
            assert row["chain"]["equal_to_ar"] == row["tree"]["equal_to_ar"] == 1  # lossless on CPU
            assert row["chain"]["mean_accepted_length"] >= 1.0
    assert report["decode"]["target_x4"]["ar"]["tokens"] == 4
    md = (out / "fixture_report.md").read_text()
    assert "## Mean accepted length" in md and "## Held-out perplexity" in md
