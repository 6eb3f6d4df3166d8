"""Prototype: the W12 GEMM prefetching its weight bytes into L2 a few K steps ahead of its
pipelined loads (GPU only; timed against the shipped kernel at the shipped configs).

    python bench/prototypes/w12_l2_prefetch.py --out DIR [--distances 2 4 8]

Why: at M=32 on Qwen3-8B qkv the shipped config's warps spend a third of their stall samples
waiting for the K loop's TMA weight tiles while DRAM is only half busy
(bench/results/w12/ncu_stalls_8b_qkv_m32.md, logs/ncu_8b_qkv_m32.txt): too few weight bytes in
flight for DRAM's latency. Deeper pipelines cost shared memory and programs per SM (the sweep's
s4/s6 tiles lost); an L2 prefetch (`prefetch.global.L2`, one 128-byte line per lane, 2 instructions
per thread and K step) puts more requests in flight without holding shared memory or registers,
so the TMA loads find their lines in L2. The temporary switch `gemm.AB["l2_prefetch"]` (K steps
ahead, 0 = off) selects the kernel variant at launch.

Per row: cuBLAS, the shipped config, and the shipped config with each prefetch distance, fastest
of 3 rotated rounds (each arm's graph captured with its own setting); every prefetch arm checked
bit-identical to the shipped config's output first (a prefetch changes no arithmetic). Writes
OUT/w12_l2_prefetch.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROWS = [("Qwen3-8B", "qkv", 32), ("Qwen3-32B", "qkv", 32), ("Qwen3-8B", "o", 32), ("Qwen3-8B", "gate_up", 32),
        ("Qwen3-8B", "down", 32), ("Qwen3-32B", "gate_up", 32), ("Qwen3-8B", "qkv", 16), ("Qwen3-32B", "o", 1),
        ("Qwen3-32B", "gate_up", 1), ("Qwen3-8B", "qkv", 64)]


def with_prefetch(distance: int, fn):
    gemm_mod.AB["l2_prefetch"] = distance
    try:
        return fn()
    finally:
        gemm_mod.AB["l2_prefetch"] = 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--distances", type=int, nargs="+", default=[2, 4, 8])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "distances": args.distances, "rows": []}
    gpu = torch.cuda.get_device_name()
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    for model, proj, M in ROWS:
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
        row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label()}
        if cfg.path is not kc.KernelPath.GEMM:
            row["skipped"] = "the shipped config is a GEMV"
            data["rows"].append(row)
            continue
        ref = run_config(x, sets[0], cfg)
        row["identical"] = {d: torch.equal(with_prefetch(d, lambda: run_config(x, sets[0], cfg)).view(torch.int16),
                                           ref.view(torch.int16)) for d in args.distances}
        arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                "shipped": [lambda w=w: run_config(x, w, cfg) for w in sets]}
        for dist in args.distances:
            arms[f"prefetch {dist}"] = [lambda w=w, dist=dist: with_prefetch(dist, lambda: run_config(x, w, cfg))
                                        for w in sets]
        row["us"], row["runs"] = rotated_rounds(arms)
        data["rows"].append(row)
        print(model, proj, M, cfg.label(), {k: round(v, 2) for k, v in row["us"].items()}, row["identical"], flush=True)
        (args.out / "w12_l2_prefetch.json").write_text(json.dumps(data, indent=1) + "\n")
        del sets, dense, ref
        torch.cuda.empty_cache()
    lines = ["# W12 GEMM with an L2 prefetch of its weights K steps ahead (bench/prototypes/w12_l2_prefetch.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs per call, "
             "fastest of 3 rotated rounds, escapes on, the shipped config of each row", "",
             "| model | proj | M | config | cuBLAS | shipped | " + " | ".join(f"prefetch {d}" for d in args.distances)
             + " | best / shipped | bit-identical |",
             "|---|---|---|---|---|---|" + "---|" * len(args.distances) + "---|---|"]
    for r in data["rows"]:
        if "us" not in r:
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r.get('skipped', '-')} |")
            continue
        u = r["us"]
        best = min(u[f"prefetch {d}"] for d in args.distances)
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {u['cublas']:.2f} | {u['shipped']:.2f} | "
                     + " | ".join(f"{u[f'prefetch {d}']:.2f}" for d in args.distances)
                     + f" | {u['shipped'] / best:.3f}x | {all(r['identical'].values())} |")
    (args.out / "w12_l2_prefetch.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
