"""A simulated kernel bench (CPU): known timings per config and shape, so the tuner's and the kernel
agent's choices can be checked exactly (tests/kernels/test_shape_tuning.py, tests/loop/agents/test_kernel.py)."""

from specpilot.kernels import configs as kc
from specpilot.kernels.configs import Fallback, KernelPath, LaunchConfig, WeightFormat
from specpilot.kernels.search import Trial

SLOW = LaunchConfig(KernelPath.GEMV, block_n=4, block_k=512)  # today's choice: no candidate of the search
FAST = kc.candidates(8)[1]  # a candidate of every shape at M = 8
BROKEN = kc.candidates(8)[0]


class SimulatedBench:
    """Today's config is SLOW everywhere; FAST is 2x faster on 'down' only; BROKEN fails the check;
    every other config the search tries is as fast as SLOW; decode then cuBLAS is 3x faster on the
    (n, k) sizes of `unpack_fast` and 2x slower elsewhere (the bench's weights are plain: one path)."""

    device_name = "NVIDIA H200"
    weight_format = WeightFormat.DENSE
    sm_count = 132

    def __init__(self, unpack_fast=()):
        self.timed = []
        self.unpack_fast = set(unpack_fast)

    def time_fallback(self, problem, fallback):
        assert fallback is Fallback.UNPACK_CUBLAS
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0
        return base / 3 if (problem.n, problem.k) in self.unpack_fast else base * 2

    def current(self, shape):
        return SLOW

    def floor_us(self, shape):
        return shape.n * shape.k * 2 / 4e6  # 4 TB/s

    def time(self, problem, config):
        self.timed.append(((problem.n, problem.k), config))
        if config == BROKEN:
            return Trial(config, worst_error_over_bound=3.0, error="exceeds the error bound")
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0  # launch-bound: far above the floor
        return Trial(config, us=base / 2 if (config == FAST and (problem.n, problem.k) == (256, 1024)) else base)


class W12Bench(SimulatedBench):
    """W12 weights: today's choice is the rule's (SLOW up to 64 rows, decode at each call above);
    keeping the weight decoded is 3x faster than decoding at each call, and than SLOW, at every size."""

    weight_format = WeightFormat.W12

    def current(self, shape):
        return Fallback.UNPACK_CUBLAS if shape.m > 64 else SLOW

    def time_fallback(self, problem, fallback):
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0
        return base / 3 if fallback is Fallback.DECODED_CUBLAS else base
