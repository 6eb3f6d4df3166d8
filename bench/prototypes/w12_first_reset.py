"""A/B of the W12 GEMM's K loop: the session-4 loop against one whose first MMA ignores the accumulator.

    python bench/prototypes/w12_first_reset.py --out DIR [--smi]

Why: ptxas serialized every wgmma of the escape-block GEMM (info C7515, "non wgmma instructions
defining accumulator registers": the zeros the loop-skipping path gives the accumulator), so each
HGMMA of the K loop waited for the previous one. With `FIRST_RESETS` the first step's MMA reads
`where(step == step0, 0, acc)`, which Triton turns into the MMA's use-accumulator flag: no zeros
reach the MMA, ptxas keeps one wait per K step. This times both loops (module switch
`specpilot.kernels.gemm.FIRST_RESETS`) with the shipped tuned configs next to cuBLAS, in rounds
with the arms rotated; every arm is first checked against the reference. With --smi it logs
nvidia-smi clocks and power every 200 ms beside the timings (first rounds of earlier runs were up
to 12% slower than later ones for the W12 kernel but not for cuBLAS). Writes OUT/first_reset.json/.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import gemm as gemm_module  # noqa: E402
from specpilot.kernels.configs import LaunchConfig, WeightFormat, choose_config  # noqa: E402
from specpilot.kernels.dispatch import device_name  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import decode, encode  # noqa: E402

SHAPES = [("Qwen3-8B", "qkv", 6144, 4096), ("Qwen3-8B", "o", 4096, 4096), ("Qwen3-8B", "gate_up", 24576, 4096),
          ("Qwen3-8B", "down", 4096, 12288), ("Qwen3-8B", "lm_head", 151936, 4096),
          ("Qwen3-32B", "qkv", 10240, 5120), ("Qwen3-32B", "gate_up", 51200, 5120), ("Qwen3-32B", "down", 5120, 25600)]
EXTRA = {1: [], 32: [LaunchConfig.from_dict({"path": "gemm", "block_n": 64, "block_k": 256, "num_warps": 4, "num_stages": 3}),
                     LaunchConfig.from_dict({"path": "gemm", "block_n": 128, "block_k": 128, "num_warps": 4, "num_stages": 3})]}
ROUNDS = 4


def call(x, w, cfg, resets: bool):
    gemm_module.FIRST_RESETS = resets
    try:
        return gemm_module.gemm(x, w, cfg)
    finally:
        gemm_module.FIRST_RESETS = True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smi", action="store_true")
    p.add_argument("--shapes", type=int, default=len(SHAPES))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    smi = None
    if args.smi:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
                                "clocks_event_reasons.active", "--format=csv", "-lms", "200"],
                               stdout=open(args.out / "smi.csv", "w"), stderr=subprocess.STDOUT)
    t0 = time.time()
    meta = environment()
    rows = []
    for model, proj, N, K in SHAPES[:args.shapes]:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [decode(w) for w in sets]
        for M in (1, 32):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            tuned = choose_config(WeightFormat.W12, M, N, K, device_name(x.device))
            cfgs = list(dict.fromkeys([tuned] + EXTRA[M]))
            exact, bound = error_bound(x, sets[0], x.dtype)
            arms = [("cublas", [lambda d=d: F.linear(x, d) for d in dense])]
            errors = {}
            for cfg in cfgs:
                for resets in (False, True):
                    label = f"{cfg.label()} {'reset' if resets else 's4'}"
                    worst = check_output(call(x, sets[0], cfg, resets), x, sets[0], exact, bound)
                    if worst > 1.0:
                        errors[label] = f"{worst:.3g}x the error bound"
                        continue
                    arms.append((label, [lambda w=w, c=cfg, r=resets: call(x, w, c, r) for w in sets]))
            warm_clocks()
            runs: dict[str, list] = {}
            for r in range(ROUNDS):
                for label, calls in arms[r % len(arms):] + arms[:r % len(arms)]:
                    runs.setdefault(label, []).append((round(time.time() - t0, 2), graph_time_us(calls)))
            row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "tuned": tuned.label(), "errors": errors,
                   "runs": runs, "min_us": {k: min(u for _, u in v) for k, v in runs.items()}}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("proj", "N", "M", "min_us", "errors")}), flush=True)
        del sets, dense
        torch.cuda.empty_cache()
    if smi:
        smi.terminate()
    (args.out / "first_reset.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# W12 GEMM K loop: session-4 (`s4`) vs first MMA resets the accumulator (`reset`)", "",
             f"- {meta['date']} · {meta['gpu']} · triton {meta['triton']} · commit {meta['git_commit']}",
             f"- µs per call, fastest of {ROUNDS} rotated rounds (CUDA-graph replays over rotating weight sets, median)", "",
             "| shape | M | arm | µs | cuBLAS / arm | runs (µs) |", "|---|---|---|---|---|---|"]
    for r in rows:
        cu = r["min_us"]["cublas"]
        for k, us in r["min_us"].items():
            lines.append(f"| {r['model']} {r['proj']} {r['N']}x{r['K']} | {r['M']} | {k} | {us:.2f} | {cu / us:.3f} | "
                         + " ".join(f"{u:.1f}" for _, u in r["runs"][k]) + " |")
    (args.out / "first_reset.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
