"""scripts/w12_paths.py on CPU with fake benches: what a shape's row compares (the timing needs a GPU)."""

from specpilot.kernels.configs import Fallback, WeightFormat
from specpilot.kernels.search import Trial
from specpilot.loop.agents.kernel import ProjectionShape, choice_dict



class FakeBench:
    """A bench whose config takes `config_us` and whose fallbacks take `fallback_us`; `calls` gives
    labels that the fake side-by-side timing reads."""

    def __init__(self, fmt, fallback_us):
        self.weight_format, self.sm_count, self.fallback_us, self.asked = fmt, 1, fallback_us, []

    def current(self, shape):
        return Fallback.UNPACK_CUBLAS

    def floor_us(self, shape):
        return 1.0

    def time(self, problem, config):
        return Trial(config, us=9.0)

    def time_fallback(self, problem, fallback):
        return self.fallback_us[fallback]

    def calls(self, problem, choice):
        self.asked.append((problem, choice))
        return [(self.weight_format, choice)]


def test_each_shapes_ratio_is_the_side_by_side_timing_of_w12s_best_and_cublas(bench_script, monkeypatch):
    """The search's best (the fastest of several timings) names the path; the ratio comes from that
    path and cuBLAS BF16 timed in turns, not from the search's own figure."""
    s = bench_script("w12_paths")
    side_us = {(WeightFormat.DENSE, Fallback.UNPACK_CUBLAS): 10.0, (WeightFormat.W12, Fallback.DECODED_CUBLAS): 10.5}
    monkeypatch.setattr(s, "rotated_rounds", lambda arms: ({k: side_us[v[0]] for k, v in arms.items()}, {}))
    w12 = FakeBench(WeightFormat.W12, {Fallback.UNPACK_CUBLAS: 14.0, Fallback.DECODED_CUBLAS: 6.0})
    bf16 = FakeBench(WeightFormat.DENSE, {Fallback.UNPACK_CUBLAS: 10.0})
    shape = ProjectionShape("o", 129, 256, 128, 1)  # above the kernels' rows: the fallbacks only
    rows, timings = s.measure([shape], w12, bf16, 10.0)
    (row,) = rows
    assert timings[0].best == choice_dict(Fallback.DECODED_CUBLAS) and row["w12_best_us"] == 6.0
    assert (row["w12_side_us"], row["cublas_bf16_us"]) == (10.5, 10.0) and row["ratio"] == 10.0 / 10.5
    assert [c for _, c in w12.asked] == [Fallback.DECODED_CUBLAS] and [c for _, c in bf16.asked] == [Fallback.UNPACK_CUBLAS]
    assert "| 6.0 | decoded_cublas | 10.5 | 10.0 | 0.952 |" in s.render(rows, {})
    assert "W12 slower than cuBLAS BF16 on 1 of 1 shapes." in s.render(rows, {})
