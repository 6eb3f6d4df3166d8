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
