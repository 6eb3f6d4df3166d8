"""scripts/serving_round_profile.py on CPU: one unit per system, its rounds, and the profile table."""

import json


def test_profiles_each_system(bench_script, tmp_path, capsys):
    script = bench_script("serving_round_profile")
    code = script.main(["--deployment", "fixture", "--concurrency", "2", "--max-new-tokens", "6", "--device", "cpu",
                        "--system", "stock", "--system", "ar", "--top", "5", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "serving_round_profile.json").read_text())
    assert [s["system"] for s in report["systems"]] == ["stock", "ar"]
    for s in report["systems"]:
        assert len(s["seconds"]) == 3 and s["rounds"] >= 1 and 0 < s["tokens"] <= 4 * 6
        assert s["ms_per_round"] > 0 and "aten::" in s["profile"]
    stock, ar = report["systems"]
    assert ar["rounds"] >= stock["rounds"]  # AR commits one token a round
    assert '"system": "stock"' in capsys.readouterr().out
