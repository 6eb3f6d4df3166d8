"""scripts/gdn_kernels.py on CPU: its trees, its byte floor, its table, and a `--smoke` run (tiny
shapes under the Triton interpreter, in a fresh process) that writes both files."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gdn_kernels.py"


def test_best_first_trees_are_rooted_ordered_and_reproducible(bench_script):
    s = bench_script("gdn_kernels")
    for n in (1, 16, 128):
        parents = s.best_first_tree(n, seed=3)
        assert len(parents) == n and parents[0] == -1 and parents.count(-1) == 1
        assert all(0 <= p < i for i, p in enumerate(parents) if i)
        assert parents == s.best_first_tree(n, seed=3)
    deep = s.depths_of(s.best_first_tree(128, seed=0))
    assert 1 < max(deep) < 127  # neither a star nor a chain
    assert s.depths_of([-1, 0, 1, 0]) == [0, 1, 2, 1]


def test_the_byte_floor_counts_states_window_inputs_weights_and_output(bench_script):
    s = bench_script("gdn_kernels")
    qwen = s.SHAPES[1]
    assert (qwen.Hk, qwen.Hv, qwen.Dk, qwen.Dv, qwen.Cc) == (16, 48, 128, 128, 2 * 16 * 128 + 48 * 128)
    state = 48 * 128 * 128 * 4
    decode = s.floor_bytes(qwen, s.Workload("decode", 1, False))
    assert decode == {"state_read": state, "states_written": state, "conv_window": 3 * qwen.Cc * 2,
                      "inputs": (qwen.Cc + 96) * 2, "conv_weight": qwen.Cc * 4 * 2, "output": 48 * 128 * 2}
    tree = s.floor_bytes(qwen, s.Workload("tree 64", 64, True))
    assert tree["states_written"] == 64 * state and tree["inputs"] == 64 * decode["inputs"]


def test_the_table_gives_each_arm_against_the_floor(bench_script, tmp_path):
    s = bench_script("gdn_kernels")
    row = {"shape": {"name": "fixture-x16"}, "workload": "tree 16", "tokens": 16, "max_depth": 5,
           "floor_bytes_total": 20e6, "floor_us": 8.0,
           "us": {"kernels": 16.0, "reference": 400.0, "kernels bv8 w1": 12.0},
           "over_floor": {"kernels": 2.0, "reference": 50.0, "kernels bv8 w1": 1.5},
           "relative_error": {"kernels": {"output": 1e-3, "states": 2e-7}}}
    doc = {"date": "d", "smoke": False, "rounds": 3, "replays": 20, "copy_bandwidth_GBps": 2500.0,
           "default_block_v": 16, "rows": [row],
           "environment": {"gpu": "H100", "git_commit": "abc", "git_dirty": False,
                           "versions": {"torch": "2.x", "triton": "3.x"}}}
    s.write_md(doc, tmp_path / "g.md")
    text = (tmp_path / "g.md").read_text()
    assert ("| fixture-x16 | tree 16 | 16 | 5 | 20.00 | 8.0 | 16.0 | 2.0 | 400.0 | 50.0 | 25.0x | 1.0e-03, 2.0e-07 |"
            in text)
    assert "| fixture-x16 | tree 16 | 16.0 | 12.0 |" in text and "2500 GB/s" in text


def test_a_smoke_run_writes_the_json_and_its_table(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--sweep", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "gdn_kernels.json").read_text())
    assert [r["workload"] for r in doc["rows"]] == ["decode", "chain verify", "tree 5"]
    assert doc["environment"]["versions"]["torch"] and "triton" in doc["environment"]["versions"]
    for r in doc["rows"]:
        assert r["floor_us"] > 0 and set(r["us"]) >= {"kernels", "reference"}
        for arm, err in r["relative_error"].items():  # every kernel blocking checked against the reference
            assert err["states"] < 1e-5 and err["output"] < 1e-2, (arm, err)
    table = (tmp_path / "gdn_kernels.md").read_text()
    assert table.count("| smoke |") == 6  # the main table and the blockings'
