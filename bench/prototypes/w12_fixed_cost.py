"""Where the W12 GEMM's time goes on small projections: per-call µs against the number of K steps.

    python bench/prototypes/w12_fixed_cost.py --out DIR

For N = 6144 rows (Qwen3-8B qkv) and K = 256 .. 8192 at M = 1 and 32 it times, in CUDA graphs over
rotating weight sets as bench/w12_kernels.py does, cuBLAS (`F.linear`), the W12 GEMM with one
K split (n64 k256 w4 s3, one program per row block) and the same with escapes off, plus an empty
Triton kernel (the launch floor of a graph node). A straight-line fit of µs against bytes gives
each kernel's fixed cost per call (intercept) and its streaming rate (slope). Writes
OUT/fixed_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.gemm import gemm  # noqa: E402
from specpilot.w12 import decode, encode  # noqa: E402

N = 6144
KS = (256, 512, 1024, 2048, 4096, 8192)
CFG = LaunchConfig(KernelPath.GEMM, block_n=64, block_k=256, num_warps=4, num_stages=3, split_k=1)


@triton.jit
def _empty(y_ptr):
    tl.store(y_ptr + tl.program_id(0), 0.0)


def fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    y = torch.empty(1024, device="cuda")
    rows = {"meta": environment(), "empty_kernel_us": {}, "points": []}
    for grid in (96, 384):
        rows["empty_kernel_us"][grid] = graph_time_us([lambda g=grid: _empty[(g,)](y)] * 8)
    for K in KS:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [decode(w) for w in sets]
        for M in (1, 32):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            warm_clocks()
            arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                    "w12": [lambda w=w: gemm(x, w, CFG) for w in sets],
                    "w12_no_escapes": [lambda w=w: gemm(x, w, CFG, escapes="off") for w in sets]}
            best = {k: min(graph_time_us(c) for _ in range(3)) for k, c in arms.items()}
            pt = {"K": K, "M": M, "bytes_w12": sets[0].nbytes_total, "bytes_bf16": N * K * 2, **best}
            rows["points"].append(pt)
            print(json.dumps(pt), flush=True)
        del sets, dense
    for M in (1, 32):
        pts = [p for p in rows["points"] if p["M"] == M]
        for k, b in (("cublas", "bytes_bf16"), ("w12", "bytes_w12"), ("w12_no_escapes", "bytes_w12")):
            c, s = fit([p[b] for p in pts], [p[k] for p in pts])
            rows.setdefault("fits", []).append({"M": M, "kernel": k, "fixed_us": c, "tbps": 1e-6 / s})
            print(f"M={M} {k:15s} fixed {c:6.2f} us, streaming {1e-6 / s:5.2f} TB/s")
    print("empty kernel (graph node):", rows["empty_kernel_us"])
    (args.out / "fixed_cost.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
