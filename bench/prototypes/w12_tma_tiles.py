"""Prototype: every 4-warp GEMM tile with TMA weight loads on the rows short of the W12 targets,
a quick look for tiles the sweep's phase 4 (the two fastest cp.async configs, with TMA) cannot
reach (GPU only).

    python bench/prototypes/w12_tma_tiles.py --out DIR [--budget-s 120]

Why: TMA frees the registers and threads cp.async addressing took, so a tile that lost with
cp.async may win with TMA; the d856760 sweep only gave TMA to each row's two fastest configs.
Rows: 8B qkv, 32B qkv, 8B o at M = 1 and 32, 8B gate_up at M = 32. Phase A times every 4-warp GEMM
candidate with `tma` at the automatic split and at split 2 and 4, once each, after checking it
against the reference bound (`bench/w12_kernels.time_config`); phase B re-times cuBLAS, the shipped
tuned config and the three fastest of phase A side by side, fastest of 3 rotated rounds. Writes
OUT/w12_tma_tiles.json and .md. Not a tuned table: one look, a lead for the next sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROWS = [("Qwen3-8B", "qkv", 1), ("Qwen3-32B", "qkv", 1), ("Qwen3-8B", "o", 1), ("Qwen3-8B", "qkv", 32),
        ("Qwen3-8B", "o", 32), ("Qwen3-8B", "gate_up", 32), ("Qwen3-32B", "qkv", 32)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=120.0)
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
        tiles = [dataclasses.replace(c, tma=True) for c in kc.gemm_candidates(M) if c.num_warps == 4]
        arms = list(dict.fromkeys(t for c in tiles for t in (c, with_split(c, 2), with_split(c, 4))))
        tried = [time_config(x, sets, cfg, exact, bound) for cfg in arms]
        timed = sorted((t for t in tried if "us" in t), key=lambda t: t["us"])
        best = [kc.LaunchConfig.from_dict(t["config"]) for t in timed[:3]]
        final = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                 "tuned " + tuned.label(): [lambda w=w: run_config(x, w, tuned) for w in sets]}
        final.update({c.label(): [lambda w=w, c=c: run_config(x, w, c) for w in sets] for c in best if c != tuned})
        u, runs = rotated_rounds(final)
        data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "tuned": tuned.label(),
                             "phase_a": tried, "us": u, "runs": runs})
        print(model, proj, M, {k: round(v, 2) for k, v in u.items()},
              "errors:", [t["label"] for t in tried if "error" in t], flush=True)
        (args.out / "w12_tma_tiles.json").write_text(json.dumps(data, indent=1) + "\n")
        del sets, dense, exact, bound
        torch.cuda.empty_cache()
    lines = ["# Every 4-warp GEMM tile with TMA weight loads on the rows short of the targets "
             "(bench/prototypes/w12_tma_tiles.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; phase B: µs per call, "
             "fastest of 3 rotated rounds, escapes on", "",
             "| model | proj | M | arm | µs | cuBLAS / arm |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        for k, v in sorted(r["us"].items(), key=lambda kv: kv[1]):
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {k} | {v:.2f} | {r['us']['cublas'] / v:.3f} |")
    (args.out / "w12_tma_tiles.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
