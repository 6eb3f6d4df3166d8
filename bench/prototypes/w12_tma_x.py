"""Prototype: the GEMM's x^T tiles loaded by TMA as well as the weight tiles (GPU only).

    python bench/prototypes/w12_tma_x.py --out DIR [--budget-s 150]

Why: at M = 32 streaming the x^T tiles costs 0.8-4.5 µs per call (bench/results/w12/w12_m32_parts.json):
a [BK, 32] BF16 tile per K step is 16 KB against the weight tile's 24 KB, loaded by per-thread
cp.async. With `gemm.AB["tma_x"]` (temporary) each step's x tile is one TMA box [BM, BK] of x (zeros
past M and K), transposed in shared memory for the MMA. Same values, same sums: the outputs must
be bit-identical. Every projection at M = 1 and 32, at the shipped tuned config and with its
weight loads by TMA too, against cuBLAS (`F.linear`), fastest of 3 rotated rounds. Writes
OUT/w12_tma_x.json and .md.
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

from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12 import encode  # noqa: E402


def run(x, w, cfg, tma_x: bool):
    gemm_mod.AB["tma_x"] = tma_x
    try:
        return gemm_mod.gemm(x, w, cfg)
    finally:
        gemm_mod.AB["tma_x"] = False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--budget-s", type=float, default=150.0)
    args = p.parse_args(argv)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    gpu = torch.cuda.get_device_name()
    order = [("Qwen3-8B", "qkv"), ("Qwen3-32B", "qkv"), ("Qwen3-8B", "o"), ("Qwen3-8B", "gate_up"), ("Qwen3-32B", "o"),
             ("Qwen3-8B", "down"), ("Qwen3-32B", "down"), ("Qwen3-32B", "gate_up"), ("Qwen3-8B", "lm_head"),
             ("Qwen3-32B", "lm_head")]
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    for model, proj in order:
        if time.monotonic() - start > args.budget_s:
            print("budget spent; stopping before", model, proj, flush=True)
            break
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        for M in args.ms:
            tuned = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
            cfgs = {"tuned": tuned, "tuned, weights by TMA": dataclasses.replace(tuned, tma=True)}
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            arms, same = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}, {}
            ref = run(x, sets[0], tuned, False).view(torch.int16)
            for tag, cfg in cfgs.items():
                if tag != "tuned" and cfg == tuned:
                    continue
                arms[tag] = [lambda w=w, c=cfg: run(x, w, c, False) for w in sets]
                try:
                    same[tag + " + x by TMA"] = bool(torch.equal(run(x, sets[0], cfg, True).view(torch.int16), ref))
                    if same[tag + " + x by TMA"]:
                        arms[tag + " + x by TMA"] = [lambda w=w, c=cfg: run(x, w, c, True) for w in sets]
                except Exception as err:  # noqa: BLE001 - report and go on
                    same[tag + " + x by TMA"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            u, runs = rotated_rounds(arms)
            data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "tuned": tuned.label(),
                                 "us": u, "runs": runs, "bit_identical": same})
            print(model, proj, M, tuned.label(), {k: round(v, 2) for k, v in u.items()}, same, flush=True)
            (args.out / "w12_tma_x.json").write_text(json.dumps(data, indent=1) + "\n")
            del arms
        del sets, dense
        torch.cuda.empty_cache()
    lines = ["# x^T tiles by TMA in the W12 GEMM (bench/prototypes/w12_tma_x.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs per call, fastest "
             "of 3 rotated rounds; escapes on (the shipped path)", "",
             "| model | proj | M | tuned config | arm | µs | cuBLAS / arm | bit-identical to tuned |", "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        for k, v in r["us"].items():
            if k != "cublas":
                lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['tuned']} | {k} | {v:.2f} | "
                             f"{r['us']['cublas'] / v:.3f} | {r['bit_identical'].get(k, '')} |")
    (args.out / "w12_tma_x.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
