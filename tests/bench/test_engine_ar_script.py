"""scripts/engine_ar.py (the GPU driver): its report, without a GPU."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver(bench_script):
    return bench_script("engine_ar")


def kernel_rows(with_lm_head: bool) -> dict:
    row = {"cublas": {"ms_per_step": 5.6}, "triton_bf16": {"ms_per_step": 5.4, "same_tokens_as_cublas": False},
           "w12": {"ms_per_step": 4.9, "same_tokens_as_cublas": True}}
    if with_lm_head:
        row["w12_lm_head"] = {"ms_per_step": 4.8, "same_tokens_as_cublas": False}
    return {"1": row}


def test_kernel_table_shows_the_w12_lm_head_variant(driver):
    meta = {"model": "m", "date": "d", "gpu": "g", "torch": "t", "commit": "c", "errors": {}}
    text = driver.render({**meta, "kernels": kernel_rows(True)})
    line = next(li for li in text.splitlines() if li.startswith("| 1 |"))
    assert line == "| 1 | 5.600 | 5.400 | 4.900 | 1.143× | 4.800 | 1.167× | False / True / False |"


def test_kernel_table_reads_runs_made_before_the_lm_head_variant(driver):
    committed = REPO / "results" / "engine" / "engine_ar_kernels.json"
    meta = {"model": "m", "date": "d", "gpu": "g", "torch": "t", "commit": "c", "errors": {}}
    res = json.loads(committed.read_text()) if committed.is_file() else {**meta, "kernels": kernel_rows(False)}
    text = driver.render(res)
    assert "AR decode ms/step by projection kernel" in text
    assert all(li.count("|") == 9 for li in text.splitlines() if li.startswith(("| 1 |", "| 8 |", "| 32 |")))


def test_attention_table_gives_each_variant_its_share_of_the_floor_and_token_agreement(driver):
    meta = {"model": "m", "date": "d", "gpu": "g", "torch": "t", "commit": "c", "errors": {}}
    row = {"cublas+sdpa": {"ms_per_step": 5.0, "same_tokens_as_baseline": True},
           "cublas+split_kv": {"ms_per_step": 4.0, "same_tokens_as_baseline": False},
           "triton_bf16+sdpa": {"ms_per_step": 4.5, "same_tokens_as_baseline": True},
           "triton_bf16+split_kv": {"ms_per_step": 3.6, "same_tokens_as_baseline": True}}
    text = driver.render({**meta, "floor_ms": {"all_parameters": 3.6, "streamed_per_token": 3.3},
                          "attention": {"128": row}})
    line = next(li for li in text.splitlines() if li.startswith("| 128 |"))
    assert line == "| 128 | 5.000 (72.0%) | 4.000 (90.0%) | 4.500 (80.0%) | 3.600 (100.0%) | False / True / True |"


def test_steps_table_gives_each_configuration_both_floors_tokens_and_its_kernel_families(driver):
    from specpilot.bench.kernel_profile import summarize

    meta = {"model": "m", "date": "d", "gpu": "g", "torch": "t", "commit": "c", "errors": {}}
    kernels = [("nvjet_tst_64x8_64x16", 30.0), ("fmha_cutlassF_bf16", 10.0), ("triton_poi_fused_add_0", 5.0)]
    none = summarize([], 1)

    def row(ms, own, same, graph):
        step = {"graph_wall_us": 50.0, "plain_wall_us": 90.0, "idle_us": 5.0,
                "graph": summarize(kernels, 1) if graph else none, "plain": summarize(kernels[:1], 1)}
        return {"ms_per_step": ms, "own_floor_ms": own, "same_tokens_as_baseline": same, "step": step}

    steps = {"cublas+sdpa": row(5.0, 3.3, True, True), "w12+split_kv+compiled": row(4.0, 2.4, False, False)}
    text = driver.render({**meta, "floor_ms": {"all_parameters": 3.6, "streamed_per_token": 3.3}, "steps": steps})
    lines = {li.split(" |")[0]: li for li in text.splitlines() if li.startswith("| cublas+sdpa") or li.startswith("| w12")}
    assert lines["| cublas+sdpa"] == ("| cublas+sdpa | 5.000 | 72.0% | 66.0% | True | 50 | 3 | 5 | 10 (1) | 30 (1) | - "
                                      "| 5 (1) | - | - |")
    # the profiler saw nothing inside this replay: the plain launches' kernels
    assert lines["| w12+split_kv+compiled"] == ("| w12+split_kv+compiled | 4.000 | 90.0% | 60.0% | False | 50 | 1 | 5 | "
                                                "- | 30 (1) | - | - | - | - |")


def test_step_configurations_have_distinct_names_and_the_baseline_runs_first(driver):
    names = [driver.step_name(*s) for s in driver.STEPS]
    assert len(set(names)) == len(names)
    assert names[0] == "cublas+sdpa"  # eager cuBLAS + SDPA: what the other rows' tokens are compared with
    assert {"triton_bf16+split_kv+compiled+pdl", "w12+split_kv+compiled+pdl"} <= set(names)
