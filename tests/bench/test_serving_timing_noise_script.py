"""scripts/serving_timing_noise.py on CPU: A/A blocks per variant, both runs of a request doing the
same work, one workspace for every request under `one-pool`."""

import json


def test_variants_time_the_same_work_twice(bench_script, tmp_path, capsys):
    script = bench_script("serving_timing_noise")
    code = script.main(["--deployment", "fixture", "--blocks", "2", "--requests", "2", "--max-new-tokens", "4",
                        "--device", "cpu", "--variant", "per-request", "--variant", "one-pool", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "serving_timing_noise.json").read_text())
    assert [v["variant"] for v in report["variants"]] == ["per-request", "one-pool"]
    assert report["created"] and "git_commit" in report["provenance"]  # the results index reads these
    for v in report["variants"]:
        assert len(v["log_ratios"]) == 2 and len(v["requests"]) == 4 and v["noise_floor"] >= 0
        for r in v["requests"]:
            assert r["first"]["rounds"] == r["second"]["rounds"] > 0  # EOS ignored: the same rounds
            assert 0 < r["first"]["prefill"] < r["first"]["wall"]
    pooled = {r["first"]["capacity"] for r in report["variants"][1]["requests"]}
    assert len(pooled) == 1 and pooled.pop() >= max(r["first"]["capacity"] for r in report["variants"][0]["requests"])
    assert "one-pool" in capsys.readouterr().out
