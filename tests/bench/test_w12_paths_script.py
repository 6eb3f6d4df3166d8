"""scripts/w12_paths.py on CPU: the shapes it times, its rows and table from simulated benches."""

import pytest

from specpilot.kernels.configs import Fallback, KernelPath, LaunchConfig, WeightFormat
from specpilot.kernels.search import Trial
from specpilot.models.random_checkpoint import tiny_config

SLOW = LaunchConfig(KernelPath.GEMV, block_n=4, block_k=512)


class W12Bench:
    """W12: the rule's choice (SLOW up to 64 rows, decode at each call above) takes 3 units, every
    searched config 2, decoding once and keeping the copy 1.5 above 64 rows (4 below)."""

    device_name = "NVIDIA H200"
    weight_format = WeightFormat.W12
    sm_count = 132

    def current(self, shape):
        return Fallback.UNPACK_CUBLAS if shape.m > 64 else SLOW

    def floor_us(self, shape):
        return 0.5

    def time(self, problem, config):
        return Trial(config, us=3.0 if config == SLOW else 2.0)

    def time_fallback(self, problem, fallback):
        if fallback is Fallback.DECODED_CUBLAS:
            return 1.5 if problem.m > 64 else 4.0
        return 3.0 if problem.m > 64 else 4.0

    def calls(self, problem, choice):  # what the side-by-side timing runs: 0.1 slower than the search saw
        us = self.time_fallback(problem, choice) if isinstance(choice, Fallback) else self.time(problem, choice).us
        return [us + 0.1]


class CublasBench:
    def calls(self, problem, choice):
        assert problem.fmt is WeightFormat.DENSE and choice is Fallback.UNPACK_CUBLAS
        return [1.6 if problem.m > 64 else 2.2]


def test_rows_ratios_and_the_table(bench_script, monkeypatch):
    """Each shape's ratio is cuBLAS BF16 beside W12's best as `rotated_rounds` times them (here:
    the calls' labels), not the search's own, fastest-of-several figure."""
    paths = bench_script("w12_paths")
    def rounds(arms):  # the calls' labels as the fastest round; cuBLAS's rounds 5% apart
        return {k: v[0] for k, v in arms.items()}, {k: [v[0], 1.05 * v[0], v[0]] for k, v in arms.items()}

    monkeypatch.setattr(paths, "rotated_rounds", rounds)
    from specpilot.config import System

    target = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=2)
    system = System(tree_budget=128, depth=7, topk=8)
    shapes = paths.shapes_for(target, None, system, 1, (8, 129))
    assert {s.m for s in shapes if s.name == "down"} == {129} and {s.m for s in shapes if s.name == "down@8"} == {8}
    assert any(s.name == "lm_head@129" for s in shapes)
    rows, timings = paths.measure(shapes, W12Bench(), CublasBench(), budget_s=60)
    by = {(r["name"], r["M"]): r for r in rows}
    assert by["down", 129]["w12_best"] == {"path": "decoded_cublas"} and by["down", 129]["w12_best_us"] == 1.5
    assert (by["down", 129]["w12_side_us"], by["down", 129]["cublas_bf16_us"]) == (1.6, 1.6)
    assert by["down", 129]["ratio"] == 1.0 and by["down", 129]["cublas_spread"] == pytest.approx(0.05)
    assert "block_n" in by["down@8", 8]["w12_best"] and by["down@8", 8]["ratio"] == 2.2 / 2.1
    text = paths.render(rows, {"gpu": "NVIDIA H200"})
    assert "W12 slower than cuBLAS BF16 on 0 of" in text and "| 1.5 | decoded_cublas | 1.6 | 1.6 | 1.000 |" in text
    tie, beyond = dict(by["down", 129], ratio=0.96), dict(by["down", 129], ratio=0.94)  # 5% spread
    assert "on 2 of 2 shapes; by more than cuBLAS's own rounds differ from each other on 1." in paths.render(
        [tie, beyond], {})
    doc = paths.table_document("NVIDIA H200", "w12", {}, timings, every=True)
    assert {(e["m"], e.get("path")) for e in doc["entries"] if e["m"] == 256} == {(256, "decoded_cublas")}
