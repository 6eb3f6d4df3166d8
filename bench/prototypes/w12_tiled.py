"""Prototype: W12 planes stored tile-contiguous, so each K step of a program reads one sequential run
of bytes instead of 64 row segments 4-50 KB apart (GPU timing; the re-layout runs anywhere).

    python bench/prototypes/w12_tiled.py --out DIR [--budget-s 240]

Why: fitted over K, the W12 GEMM streams at 3.1 TB/s against cuBLAS's 3.6 TB/s on 6144 rows
(bench/results/w12/fixed_cost.json), and the lone program's K step is latency-bound
(w12_timeline.md). Today a program's step reads, for each of its 64 rows, BK lo bytes and BK/2 hi
bytes at the row's stride (Kp bytes): 128 segments of 128-256 bytes. Stored tile-contiguous for the
launch's (BLOCK_N, BLOCK_K) -- the data and the decode unchanged, only the addresses -- the same
step reads 16 KB + 8 KB sequentially ("tiled", `gemm.AB["tiled"] = 1`) or one 24 KB run with the
tile's lo then hi bytes ("joint", 2). The sums are the same in the same order: the outputs must be
bit-identical to the standard layout.

Every projection of Qwen3-8B and Qwen3-32B at M = 1 and 32, at the shipped tuned config, W12 in the
three layouts against cuBLAS (`F.linear`), rotating weight sets, CUDA graphs, fastest of 3 rotated
rounds. Writes OUT/w12_tiled.json and .md.
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

from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12.weight import W12Weight  # noqa: E402

LAYOUTS = {"standard": 0, "tiled": 1, "joint": 2}


def relayout(w: W12Weight, block_n: int, block_k: int, mode: int) -> W12Weight:
    """`w` with its lo/hi planes stored tile-contiguous for (block_n, block_k) (mode 1 or 2, see
    `gemm.AB`); needs N % block_n == 0 and Kp % block_k == 0."""
    N, Kp = w.lo.shape
    if N % block_n or Kp % block_k:
        raise ValueError(f"[{N}, {Kp}] does not tile by ({block_n}, {block_k})")
    lo = w.lo.view(N // block_n, block_n, Kp // block_k, block_k).permute(0, 2, 1, 3)  # [tn, tk, BN, BK]
    hi = w.hi.view(N // block_n, block_n, Kp // block_k, block_k // 2).permute(0, 2, 1, 3)
    if mode == 1:
        return dataclasses.replace(w, lo=lo.contiguous().view(N, Kp), hi=hi.contiguous().view(N, Kp // 2))
    joint = torch.cat([lo.reshape(*lo.shape[:2], -1), hi.reshape(*hi.shape[:2], -1)], dim=2)  # [tn, tk, BN*BK*3/2]
    flat = joint.contiguous().view(-1)
    return dataclasses.replace(w, lo=flat[: N * Kp].view(N, Kp), hi=flat[N * Kp:].view(N, Kp // 2))


def run(x, w, cfg, mode: int):
    gemm_mod.AB["tiled"] = mode
    try:
        return gemm_mod.gemm(x, w, cfg)
    finally:
        gemm_mod.AB["tiled"] = 0


def main(argv=None) -> int:
    from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets
    from specpilot.kernels import configs as kc
    from specpilot.w12 import encode

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--budget-s", type=float, default=240.0)
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
            cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            arms, same = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}, {}
            ref = run(x, sets[0], cfg, 0).view(torch.int16)
            for name, mode in LAYOUTS.items():
                try:
                    ws = sets if mode == 0 else [relayout(w, cfg.block_n, cfg.block_k, mode) for w in sets]
                    same[name] = bool(torch.equal(run(x, ws[0], cfg, mode).view(torch.int16), ref))
                    if same[name]:
                        arms["w12 " + name] = [lambda w=w, m=mode: run(x, w, cfg, m) for w in ws]
                except Exception as err:  # noqa: BLE001 - report and go on
                    same[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            u, runs = rotated_rounds(arms)
            data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                                 "us": u, "runs": runs, "bit_identical": same})
            print(model, proj, M, cfg.label(), {k: round(v, 2) for k, v in u.items()},
                  "not identical / failed:", {k: v for k, v in same.items() if v is not True}, flush=True)
            (args.out / "w12_tiled.json").write_text(json.dumps(data, indent=1) + "\n")
            del arms
        del sets, dense
        torch.cuda.empty_cache()
    lines = ["# W12 planes stored tile-contiguous vs the standard layout (bench/prototypes/w12_tiled.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; tuned configs; "
             "µs per call, fastest of 3 rotated rounds", "",
             "| model | proj | M | config | cuBLAS | standard | tiled | joint | cuBLAS / standard | cuBLAS / best tiled |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        t = [u[k] for k in ("w12 tiled", "w12 joint") if k in u]
        cell = lambda k: f"{u[k]:.2f}" if k in u else str(r["bit_identical"].get(k[4:]))  # noqa: E731
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {u['cublas']:.2f} | {cell('w12 standard')} | "
                     f"{cell('w12 tiled')} | {cell('w12 joint')} | {u['cublas'] / u['w12 standard']:.3f} | "
                     f"{(u['cublas'] / min(t)) if t else float('nan'):.3f} |")
    (args.out / "w12_tiled.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
