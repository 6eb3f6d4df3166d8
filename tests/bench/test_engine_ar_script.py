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
