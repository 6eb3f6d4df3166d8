"""Diagnostic: where the W12 GEMM's extra time at M = 32 (over M = 1) goes.

    python bench/prototypes/w12_m32_parts.py --out DIR

For six Qwen3 projections, with the tuned M = 32 config of each, times in CUDA graphs over
rotating weight sets: cuBLAS at M = 32; W12 at M = 32 (as shipped) and with escapes off; W12 at
M = 1 and M = 16 launched with the M = 32 row block (BLOCK_M = 32: the same shared-memory buffers,
registers and MMA instructions, but x rows past M are masked, so no x^T traffic for them); and
W12 at M = 1 with its own tuned config. The gap between "M=1 at bm32" and "M=32" is what streaming
x^T tiles (and gathering 32 rows of escapes) costs; between "M=1 tuned" and "M=1 at bm32" what
the larger tile costs by itself. Three rotated rounds, fastest of each. Writes OUT/w12_m32_parts.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

SHAPES = {("Qwen3-8B", "qkv"), ("Qwen3-8B", "o"), ("Qwen3-8B", "gate_up"), ("Qwen3-8B", "down"),
          ("Qwen3-32B", "o"), ("Qwen3-32B", "down")}


def arm(x, sets, cfg, block_m=None, escapes="auto"):
    def call(w):
        gemm_mod.AB["block_m"] = block_m
        try:
            return gemm_mod.gemm(x, w, cfg, escapes=escapes)
        finally:
            gemm_mod.AB.clear()
    return [lambda w=w: call(w) for w in sets]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    data = {"meta": environment(), "rows": []}
    for model in MODELS:
        for proj, N, K in model.projections():
            if (model.name, proj) not in SHAPES:
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            xs = {m: torch.randn(m, K, device="cuda", dtype=torch.bfloat16) for m in (1, 16, 32)}
            c32 = kc.choose_config(kc.WeightFormat.W12, 32, N, K, name)
            c1 = kc.choose_config(kc.WeightFormat.W12, 1, N, K, name)
            same = {}  # do the bm32 launches of M = 1 and 16 equal their own launches bit for bit?
            for m in (1, 16):
                y = arm(xs[m], sets[:1], c32, 32)[0]()
                ref = gemm_mod.gemm(xs[m], sets[0], c32)
                same[m] = bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
            arms = {
                "cublas M=32": [lambda d=d: F.linear(xs[32], d) for d in dense],
                "w12 M=32": arm(xs[32], sets, c32),
                "w12 M=32 escapes off": arm(xs[32], sets, c32, escapes="off"),
                "w12 M=16 at bm32": arm(xs[16], sets, c32, 32),
                "w12 M=1 at bm32": arm(xs[1], sets, c32, 32),
                "w12 M=1 at bm32 escapes off": arm(xs[1], sets, c32, 32, escapes="off"),
                "w12 M=1 M=32 config at bm16": arm(xs[1], sets, c32),
                "w12 M=1 tuned": arm(xs[1], sets, c1),
            }
            keys = list(arms)
            runs = {k: [] for k in keys}
            warm_clocks()
            for r in range(3):
                for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                    runs[k].append(graph_time_us(arms[k]))
            row = {"model": model.name, "proj": proj, "N": N, "K": K, "config_m32": c32.label(),
                   "config_m1": c1.label(), "bm32_bit_identical": same, "us": {k: min(v) for k, v in runs.items()}, "runs": runs}
            data["rows"].append(row)
            print(row["model"], row["proj"], row["config_m32"], {k: round(v, 2) for k, v in row["us"].items()}, flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_m32_parts.json").write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
