"""Prototype: narrow GEMM tiles (16 and 32 weight rows per program) on the rows short of the W12
targets, against the tuned config and cuBLAS (GPU only).

    python bench/prototypes/w12_narrow.py --out DIR [--budget-s 300]

Why: the short rows are the small matrices (8B qkv 96 row tiles of 64, 8B o 64, 32B qkv 160), so
the tuned n64 configs split K 3-4 ways to fill 132 SMs, and the split reduction costs 1.6-1.8 µs
per call (bench/results/w12/split_reduce.md). 16-row tiles give 4x the row tiles (8B qkv: 384, about
three per SM) with each program streaming the same bytes as an n64 tile split four ways, and no
reduction. No sweep has tried them: tl.dot with 16 or 32 rows is Ampere-style mma.sync instead of
wgmma, which costs nothing where the MMA is idle (M = 1), but each program stages its own x^T tile
per K step, as large as the weight tile, so the L2 traffic grows at M = 32.
Phase A times every narrow arm once (16 or 32 rows, K step 256/512, 2 or 4 warps, 3-4 stages,
cp.async or TMA, automatic split, split 1 and 2) after checking it against the reference bound
(`bench/w12_kernels.time_config`); phase B re-times cuBLAS, the shipped tuned config and the three
fastest narrow arms side by side, fastest of 3 rotated rounds. Writes OUT/w12_narrow.json and .md.
Uses shipped code only (the tiles are legal `LaunchConfig`s); a lead for the sweep's candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import (MODELS, environment, random_weight, rotated_rounds, time_config,  # noqa: E402
                               weight_sets, with_split)
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROWS = [("Qwen3-8B", "qkv", 1), ("Qwen3-32B", "qkv", 1), ("Qwen3-8B", "o", 1), ("Qwen3-8B", "down", 1),
        ("Qwen3-8B", "gate_up", 1), ("Qwen3-8B", "o", 32), ("Qwen3-8B", "qkv", 32), ("Qwen3-32B", "qkv", 32),
        ("Qwen3-8B", "down", 32)]
TILES = {1: ((16, 256, 4, 4), (16, 512, 4, 3), (16, 256, 2, 4), (16, 512, 2, 3), (32, 256, 4, 4), (32, 512, 4, 3),
             (32, 256, 4, 3)),
         32: ((32, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 4), (16, 256, 4, 3))}


def arms(M: int) -> list[LaunchConfig]:
    base = [LaunchConfig(KernelPath.GEMM, block_n=n, block_k=k, num_warps=w, num_stages=s, tma=t)
            for n, k, w, s in TILES[M] for t in (False, True)]
    return list(dict.fromkeys(a for c in base for a in (c, with_split(c, 1), with_split(c, 2))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=300.0)
    args = p.parse_args(argv)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    gpu = torch.cuda.get_device_name()
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    for model, proj, M in ROWS:
        if time.monotonic() - start > args.budget_s:
            print("budget spent; stopping before", model, proj, M, flush=True)
            break
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        exact, bound = error_bound(x, sets[0], x.dtype)
        tuned = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
        tried = [time_config(x, sets, cfg, exact, bound) for cfg in arms(M)]
        timed = sorted((t for t in tried if "us" in t), key=lambda t: t["us"])
        best = [LaunchConfig.from_dict(t["config"]) for t in timed[:3]]
        final = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                 "tuned " + tuned.label(): [lambda w=w: run_config(x, w, tuned) for w in sets]}
        final.update({c.label(): [lambda w=w, c=c: run_config(x, w, c) for w in sets] for c in best if c != tuned})
        u, runs = rotated_rounds(final)
        data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "tuned": tuned.label(),
                             "phase_a": tried, "us": u, "runs": runs})
        print(model, proj, M, f"{time.monotonic() - start:.0f}s", {k: round(v, 2) for k, v in u.items()},
              "errors:", [t["label"] for t in tried if "error" in t], flush=True)
        (args.out / "w12_narrow.json").write_text(json.dumps(data, indent=1) + "\n")
        del sets, dense, exact, bound
        torch.cuda.empty_cache()
    lines = ["# Narrow GEMM tiles (16 and 32 rows) on the rows short of the targets (bench/prototypes/w12_narrow.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; phase B: µs per call, "
             "fastest of 3 rotated rounds, escapes on", "",
             "| model | proj | M | arm | µs | cuBLAS / arm |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        for k, v in sorted(r["us"].items(), key=lambda kv: kv[1]):
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {k} | {v:.2f} | {r['us']['cublas'] / v:.3f} |")
        ph = sorted((t for t in r["phase_a"] if "us" in t), key=lambda t: t["us"])
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | phase A: {len(ph)} timed, "
                     f"{sum('error' in t for t in r['phase_a'])} errors; fastest {ph[0]['label'] if ph else '-'} | "
                     f"{ph[0]['us'] if ph else float('nan'):.2f} | |")
    (args.out / "w12_narrow.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
