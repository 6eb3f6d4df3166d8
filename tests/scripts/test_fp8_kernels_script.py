"""scripts/fp8_kernels.py on CPU: its shapes and byte floor, and a `--smoke` run (tiny shapes and a
tiny random model under the Triton interpreter, in a fresh process) that writes both files, with
every FP8 arm within fp32 rounding of its reference and the FP8 AR tokens equal to their
reference path's."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fp8_kernels.py"


def test_shapes_and_floor(bench_script):
    s = bench_script("fp8_kernels")
    fixture = {p.name: (p.N, p.K) for p in s.SHAPES if p.model == "fixture-x16"}
    assert fixture == {"qkv": (8192, 4096), "o": (4096, 4096), "gate_up": (32768, 4096), "down": (4096, 16384)}
    p = s.Projection("m", "p", 256, 512)
    assert s.fp8_bytes(p, 4, 1) == 256 * 512 + 256 * 4 + 4 * 512 * 2 + 4 * 256 * 2
    assert s.MS == (1, 4, 16, 32, 64, 128)


def test_a_smoke_run_writes_the_json_and_its_table(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path), "--commit", "abc"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "fp8_kernels.json").read_text())
    assert doc["errors"] == {} and doc["commit"] == "abc"
    assert [(r["projection"], r["M"]) for r in doc["kernel_rows"]] == [(a, m) for a in "ab" for m in (1, 5, 17)]
    for r in doc["kernel_rows"]:
        assert set(r["us"]) == {"fp8 channel", "fp8 block128", "w8a8 triton", "bf16 cublas"}
        assert "w8a8 scaled_mm" in r["skipped"]  # no GPU: said why, not timed
        assert r["relative_error"]["fp8 channel"] < 1e-5 and r["relative_error"]["fp8 block128"] < 1e-5
        assert 1e-4 < r["relative_error"]["w8a8 triton"] < 0.1  # quantized activations: a different function
    e2e = doc["end_to_end"]
    assert e2e["projections_quantized"] == {"channel": 8, "block128": 8}
    assert e2e["tokens_equal_own_reference"] == {"bf16": True, "fp8 channel": True, "fp8 block128": True}
    assert set(e2e["tokens_per_second"]) == {"bf16", "fp8 channel", "fp8 channel reference", "fp8 block128",
                                             "fp8 block128 reference"}
    table = (tmp_path / "fp8_kernels.md").read_text()
    assert table.count("| smoke |") == 6 and "| fp8 channel |" in table and "1.6x BF16 AR" in table
