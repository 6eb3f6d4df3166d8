"""scripts/w12_refine.py (GPU re-timing of tuned configs against twins): what it re-times, when it adopts, what it writes."""

import dataclasses
import json

import pytest

from specpilot.kernels.configs import KernelPath, LaunchConfig


@pytest.fixture(scope="module")
def refine(bench_script):
    return bench_script("w12_refine")


PLAIN = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True)
WITH_TMA = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=3, tma=True)
GEMV = LaunchConfig(KernelPath.GEMV, 16, 512)


def table(*rows):
    return {"device": "NVIDIA H200", "entries": [{"format": f, "m": m, "n": n, "k": k, "config": c.to_dict()}
                                                 for f, m, n, k, c in rows]}


def test_the_tma_twin_is_offered_to_gemm_entries_without_weight_tma(refine):
    t = table(("w12", 64, 151936, 5120, PLAIN), ("w12", 32, 151936, 5120, WITH_TMA), ("w12", 1, 151936, 5120, GEMV),
              ("dense", 64, 151936, 5120, PLAIN))
    plain_tma = dataclasses.replace(PLAIN, tma=True)
    assert refine.candidates(t, "tma") == [(("w12", 64, 151936, 5120), PLAIN, plain_tma),
                                           (("dense", 64, 151936, 5120), PLAIN, plain_tma)]
    assert refine.candidates(t, "tma", {("dense", 64, 151936, 5120)}) == [(("dense", 64, 151936, 5120), PLAIN, plain_tma)]


def test_the_n128_twin_is_offered_to_w12_entries_of_the_64_row_bucket_only(refine):
    t = table(("w12", 64, 24576, 4096, WITH_TMA), ("w12", 64, 6144, 4096, refine.N128), ("w12", 32, 24576, 4096, PLAIN),
              ("dense", 64, 24576, 4096, WITH_TMA))
    assert refine.candidates(t, "n128") == [(("w12", 64, 24576, 4096), WITH_TMA, refine.N128)]
    assert refine.N128.tma and refine.N128.tma_x and refine.N128.fit_wave
    with pytest.raises(ValueError, match="no twin kind"):
        refine.twin_of("bigger", ("w12", 64, 1, 1), PLAIN)


def test_the_twin_is_adopted_only_when_faster_by_the_margin_and_in_most_rounds(refine):
    assert refine.decide({"tuned": [10.0, 10.2, 10.1], "twin": [9.7, 9.9, 9.6]}, 0.02)
    assert not refine.decide({"tuned": [10.0, 10.2, 10.1], "twin": [9.9, 9.95, 9.9]}, 0.02)  # 1% is not 2%
    assert not refine.decide({"tuned": [10.0, 10.2, 10.1], "twin": [9.5, 10.3, 10.2]}, 0.02)  # one lucky round


def test_the_written_table_replaces_only_the_adopted_entries(refine):
    t = table(("w12", 64, 151936, 5120, PLAIN), ("w12", 64, 6144, 4096, PLAIN))
    out = refine.replaced(t, {("w12", 64, 151936, 5120): dataclasses.replace(PLAIN, tma=True)}, "run x")
    cfgs = [LaunchConfig.from_dict(e["config"]) for e in out["entries"]]
    assert cfgs[0].tma and cfgs[0].block_n == 128 and not cfgs[1].tma
    assert out["merged_from"][0] == "run x" and t["entries"][0]["config"]["tma"] is False  # the input is untouched


def test_a_file_that_is_no_tuned_table_is_a_one_line_error(refine, tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"entries": [{"format": "w12", "m": 1, "n": 1, "k": 1, "config": {"path": "gemm"}}]}))
    with pytest.raises(SystemExit, match="not a tuned-config table"):
        refine.load_table(bad)
    with pytest.raises(SystemExit, match="not a tuned-config table"):
        refine.load_table(tmp_path / "missing.json")
