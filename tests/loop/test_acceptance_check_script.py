"""scripts/acceptance_check.py: the acceptance model fitted on the stock shape against measured shapes."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_fits_on_the_stock_shape_and_measures_every_other(bench_script, tmp_path, monkeypatch):
    script = bench_script("acceptance_check")
    from specpilot.loop.acceptance import TreeShape

    monkeypatch.setattr(script, "SHAPES", (TreeShape(5, 4, 16), TreeShape(3, 1, 3)))
    assert script.main(["--out", str(tmp_path), "--n-prompts", "1", "--tokens", "12", "--drafters", "model"]) == 0
    doc = json.loads((tmp_path / "acceptance_check.json").read_text())
    fitted, *others = [r for r in doc["rows"] if r.get("fitted")] + [r for r in doc["rows"] if not r.get("fitted")]
    assert fitted["shape"] == "depth 5, topk 4, 7 nodes" and len(fitted["accept_at_depth"]) == 5
    assert [r["shape"] for r in others] == ["depth 5, topk 4, 16 nodes", "depth 3, topk 1, 3 nodes"]
    for r in others:
        assert 1 <= r["measured"] <= r["depth"] + 1 and 1 <= r["predicted"] <= r["depth"] + 1
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1)
        assert r["geometric_error"] == pytest.approx(r["geometric"] / r["measured"] - 1)
    # widening from the fitted 7 nodes to 16 at the same depth: the geometric model (r = 1) credits more
    assert others[0]["geometric"] > others[0]["predicted"]
    md = (tmp_path / "acceptance_check.md").read_text()
    assert "| depth 3, topk 1, 3 nodes |" in md and "at r = 1" in md
