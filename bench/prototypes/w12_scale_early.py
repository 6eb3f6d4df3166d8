"""A/B of the W12 GEMM's row scale: loaded after the K loop (session 4-5) or before it.

    python bench/prototypes/w12_scale_early.py --out DIR

The per-row scale 2^(e0 - 112) comes from the weight's `base` bytes, which are cold in L2 (the
benchmark rotates weight sets, and so does a model's decode step). Loaded after the loop, that is
one more DRAM round trip at the end of every program; issued before it, the bytes arrive under
the loop. This times both (module switch `specpilot.kernels.gemm.SCALE_EARLY`) with the shipped
tuned configs next to cuBLAS, in four rotated rounds, each arm first checked against the
reference. Writes OUT/scale_early.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import gemm as gemm_module  # noqa: E402
from specpilot.kernels.configs import WeightFormat, choose_config  # noqa: E402
from specpilot.kernels.dispatch import device_name  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import decode, encode  # noqa: E402

SHAPES = [("Qwen3-8B", "qkv", 6144, 4096), ("Qwen3-8B", "o", 4096, 4096), ("Qwen3-8B", "gate_up", 24576, 4096),
          ("Qwen3-8B", "down", 4096, 12288), ("Qwen3-32B", "qkv", 10240, 5120), ("Qwen3-32B", "o", 5120, 8192),
          ("Qwen3-8B", "lm_head", 151936, 4096)]
ROUNDS = 4


def call(x, w, cfg, early: bool):
    gemm_module.SCALE_EARLY = early
    try:
        return gemm_module.gemm(x, w, cfg)
    finally:
        gemm_module.SCALE_EARLY = True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = environment()
    rows = []
    for model, proj, N, K in SHAPES:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [decode(w) for w in sets]
        for M in (1, 32):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            cfg = choose_config(WeightFormat.W12, M, N, K, device_name(x.device))
            exact, bound = error_bound(x, sets[0], x.dtype)
            arms = [("cublas", [lambda d=d: F.linear(x, d) for d in dense])]
            for early in (False, True):
                worst = check_output(call(x, sets[0], cfg, early), x, sets[0], exact, bound)
                assert worst <= 1.0, f"{proj} M={M} early={early}: {worst:.3g}x the error bound"
                arms.append(("before loop" if early else "after loop",
                             [lambda w=w, e=early: call(x, w, cfg, e) for w in sets]))
            warm_clocks()
            runs: dict[str, list] = {}
            for r in range(ROUNDS):
                for label, calls in arms[r % len(arms):] + arms[:r % len(arms)]:
                    runs.setdefault(label, []).append(graph_time_us(calls))
            row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(), "runs": runs,
                   "min_us": {k: min(v) for k, v in runs.items()}}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("proj", "N", "M", "min_us")}), flush=True)
        del sets, dense
        torch.cuda.empty_cache()
    (args.out / "scale_early.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# W12 GEMM: row scale loaded after the K loop vs before it", "",
             f"- {meta['date']} · {meta['gpu']} · triton {meta['triton']} · commit {meta['git_commit']}",
             f"- µs per call, fastest of {ROUNDS} rotated rounds; tuned configs", "",
             "| shape | M | config | cuBLAS | after loop | before loop | before / after | cuBLAS / before |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u = r["min_us"]
        lines.append(f"| {r['model']} {r['proj']} {r['N']}x{r['K']} | {r['M']} | {r['config']} | {u['cublas']:.2f} "
                     f"| {u['after loop']:.2f} | {u['before loop']:.2f} | {u['before loop'] / u['after loop']:.3f} "
                     f"| {u['cublas'] / u['before loop']:.3f} |")
    (args.out / "scale_early.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
