"""scripts/round_kernels.py on CPU: the table and the refusal without CUDA (the profiling itself
needs a GPU)."""

import torch

from specpilot.bench.kernel_profile import summarize

KERNELS = [("sm90_xmma_gemm_bf16bf16_bf16f32", 6.0), ("nvjet_tst_64x8_64x16", 4.0),
           ("fmha_cutlassF_bf16_aligned_64x64", 9.0), ("void at::native::sbtopk::gatherTopK<float>", 3.0),
           ("triton_poi_fused_add_mul_0", 1.5), ("Memset (Device)", 0.5), ("void at::native::elementwise", 2.0)]


def test_the_table_reads_the_replay_or_else_the_plain_launches(bench_script, tmp_path):
    s = bench_script("round_kernels")
    seen = summarize(KERNELS, 1)
    none = summarize([], 1)
    doc = {"deployment": "fixture-x16", "tokens": 8, "reps": 1,
           "environment": {"gpu": "H200", "git_commit": "abc", "versions": {"torch": "x"}},
           "systems": [{"system": "stock", "draft_forwards": 5, "tree_nodes": 8, "tokens_per_round": 3.5,
                        "proposal": {"graph_wall_us": 30.0, "plain_wall_us": 80.0, "graph": none, "plain": seen,
                                     "idle_us": 4.0},
                        "verify": {"graph_wall_us": 40.0, "plain_wall_us": 50.0, "graph": seen, "plain": none,
                                   "idle_us": 14.0}}]}
    s.write_md(doc, tmp_path / "k.md")
    text = (tmp_path / "k.md").read_text()
    assert "| stock | proposal | 30.0 (80.0) | 7 | 26.0 | 4.0 | 9.0 (1) | 10.0 (2) | 3.0 (1) |" in text
    assert "| stock | verify | 40.0 (50.0) | 7 | 26.0 | 14.0 |" in text
    assert "`fmha_cutlassF_bf16_aligned_64x64` | attention | 1.0 | 9.0 |" in text


def test_without_cuda_it_says_so_in_one_line(bench_script, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_script("round_kernels").main(["--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == "error: round_kernels.py measures on a CUDA device"
    assert not (tmp_path / "o").exists()
