"""scripts/moe_kernels.py on CPU: its byte floor, its table, `--help`, and a `--smoke` run (tiny
shapes under the Triton interpreter, in a fresh process) that writes both files."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "moe_kernels.py"


def test_the_byte_floor_counts_the_distinct_experts_once(bench_script):
    s = bench_script("moe_kernels")
    qwen = s.SHAPES[0]
    assert (qwen.C, qwen.I, qwen.E, qwen.k) == (2048, 768, 128, 8)
    one = s.floor_bytes(qwen, 1, 8)
    assert one == {"expert_weights": 8 * 3 * 2048 * 768 * 2, "x": 2048 * 2, "routing": 8 * 10, "output": 2048 * 2}
    assert s.floor_bytes(qwen, 2, 12)["expert_weights"] == 12 * 3 * 2048 * 768 * 2  # shared experts read once


def test_the_table_gives_each_arm_against_the_floor(bench_script, tmp_path):
    s = bench_script("moe_kernels")
    row = {"shape": {"name": "Qwen3-30B-A3B-like"}, "tokens": 2, "pairs": 16, "kernel_path": True,
           "distinct_experts": 15.5, "floor_bytes_total": 150e6, "floor_us": 50.0,
           "us": {"kernels": 60.0, "grouped": 90.0, "kernels gu8x256 d16x256 w4": 70.0},
           "over_floor": {"kernels": 1.2, "grouped": 1.8, "kernels gu8x256 d16x256 w4": 1.4},
           "relative_error": {"kernels": 1e-3, "grouped": 2e-3}}
    doc = {"date": "d", "smoke": False, "rounds": 3, "replays": 20, "copy_bandwidth_GBps": 3000.0, "max_pairs": 64,
           "rows": [row], "environment": {"gpu": "H100", "git_commit": "abc", "git_dirty": False,
                                          "versions": {"torch": "2.x", "triton": "3.x"}}}
    s.write_md(doc, tmp_path / "m.md")
    text = (tmp_path / "m.md").read_text()
    assert ("| Qwen3-30B-A3B-like | 2 | 16 | 15.5 | 150.00 | 50.0 | 60.0 | 1.2 | 90.0 | 1.8 | 1.50x | 1.0e-03 |"
            in text)
    assert "| Qwen3-30B-A3B-like | 2 | 60.0 | 70.0 |" in text and "3000 GB/s" in text


def test_help_and_a_smoke_run_write_the_json_and_its_table(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(SCRIPT), "--help"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0 and "--smoke" in run.stdout
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "moe_kernels.json").read_text())
    assert [r["tokens"] for r in doc["rows"]] == [1, 3]
    for r in doc["rows"]:
        assert r["floor_us"] > 0 and "kernels" in r["us"] and r["relative_error"]["kernels"] < 1e-2
    assert (tmp_path / "moe_kernels.md").read_text().count("| smoke |") == 2
