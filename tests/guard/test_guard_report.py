"""scripts/guard_report.py end to end on CPU with random checkpoints (the GPU run uses the fixture)."""

from __future__ import annotations

import json

import pytest


def test_report_on_random_checkpoints(checkpoints, tmp_path, bench_script):
    pytest.importorskip("specpilot.bench.prompts")
    module = bench_script("guard_report")
    out = tmp_path / "report"
    assert module.main(["--target", str(checkpoints["target"]), "--drafter", str(checkpoints["drafter"]),
                        "--device", "cpu", "--out", str(out), "--sets", "gsm8k", "mbpp", "--n-prompts", "2",
                        "--max-new-tokens", "24", "--fault-after", "4", "--resamples", "500"]) == 0
    report = json.loads((out / "guard_report.json").read_text())
    systems = {s["name"]: s for s in report["systems"]}
    assert list(systems) == ["ar", "speculative", "fault-logit-bias", "fault-accept-unverified"]
    assert systems["ar"]["forcing"]["mismatches"] == 0 and systems["ar"]["verdict"] is None
    assert systems["speculative"]["verdict"]["passed"] and systems["speculative"]["vs_ar"]["identical"] == 4
    assert not systems["fault-logit-bias"]["verdict"]["passed"]
    assert systems["fault-logit-bias"]["fault"] == "logit-bias:2:every=7:after=4"
    assert report["prompts"] == 4 and report["dtype"] == "float32" and "git_commit" in report["provenance"]
    md = (out / "guard_report.md").read_text()
    assert md.startswith("# Token-forcing guard report") and "| speculative |" in md
    assert sorted(p.name for p in (out / "outputs").iterdir()) == sorted(f"{n}.jsonl" for n in systems)
