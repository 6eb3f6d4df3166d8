"""scripts/hybrid_checks.py on CPU: the tree-vs-path check on a tiny random hybrid target finds its
GDN layers, equal conv inputs and states (the interpreter runs the kernels, bit-exact by
construction; the torch reference agrees to rounding), and the table renders."""

import types

import pytest
import torch

from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_hybrid_config, write_random_hybrid


@pytest.fixture(autouse=True)
def reference_path(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_tree_vs_path_check_and_render(bench_script, tmp_path):
    s = bench_script("hybrid_checks")
    target = load_model(write_random_hybrid(tmp_path / "t", tiny_hybrid_config(), seed=1))
    result = s.ulp_section(types.SimpleNamespace(target=target), [5, 6, 7, 8, 9, 10, 11], [4, 9])
    for n, row in result.items():
        assert row["gdn_layers"] == 3 and row["conv_bit_equal"]
        assert row["max_ulps"] <= 1 and row["argmax_agree_share"] == 1.0
    tree = s.random_tree(40, depth=8, seed=0, device="cpu", vocab=100)
    assert tree.max_depth <= 8 and (tree.parents[0, 1:] < torch.arange(1, 40)).all()
    text = s.render({"device": "cpu", "deployment": "x", "commit": "", "torch": torch.__version__,
                     "bandwidth_tb_s": 1.0, "ulp": result,
                     "ar": {"cublas+sdpa": {"ms_per_step": 2.0, "floor_ms": 1.6, "fraction_of_floor": 0.8,
                                            "same_tokens_as_first": True}}})
    assert "80.0%" in text and "| 9 | 3 |" in text


def test_ulps_orders_bit_patterns(bench_script):
    s = bench_script("hybrid_checks")
    a = torch.tensor([1.0, -1.0, 0.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, -1.0078125, -0.0], dtype=torch.bfloat16)  # one bf16 ulp away; -0 vs +0
    assert s.ulps(a, b).tolist() == [1, 1, 0]
