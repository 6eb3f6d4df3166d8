"""One call each of cuBLAS and the W12 kernel (escape blocks, and escapes off) on one shape, inside
cudaProfilerStart/Stop, for Nsight Compute (the shipped config: the GEMM, or at M <= 8 possibly the
GEMV), then one call of the W12 GEMM with each extra config given as
BLOCK_N:BLOCK_K:WARPS:STAGES[:RESIDENT]:

    ncu --clock-control none --profile-from-start off --section WarpStateStats --section SourceCounters \\
        -o REPORT python bench/prototypes/w12_ncu.py N K M [128:256:8:2 ...]
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import random_weight  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat, choose_config  # noqa: E402
from specpilot.kernels.dispatch import device_name  # noqa: E402
from specpilot.kernels.dispatch import run_config as gemm  # noqa: E402  (the config's own path: maybe a GEMV)
from specpilot.w12 import decode, encode  # noqa: E402


N, K, M = (int(a) for a in sys.argv[1:4])
extra = []
for spec in sys.argv[4:]:
    n, k, warps, stages, *res = (int(v) for v in spec.split(":"))
    extra.append(LaunchConfig(KernelPath.GEMM, block_n=n, block_k=k, num_warps=warps, num_stages=stages,
                              resident=res[0] if res else 2))
w = encode(random_weight(N, K))
d = decode(w)
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
cfg = choose_config(WeightFormat.W12, M, N, K, device_name(x.device))
print("config", cfg.label(), flush=True)
print("extra", [c.label() for c in extra], flush=True)
for _ in range(3):  # compile and warm
    F.linear(x, d), gemm(x, w, cfg), gemm(x, w, cfg, escapes="off")
    for c in extra:
        gemm(x, w, c)
torch.cuda.synchronize()
torch.cuda.profiler.start()
F.linear(x, d)
gemm(x, w, cfg)
gemm(x, w, cfg, escapes="off")
for c in extra:
    gemm(x, w, c)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
