"""Deep-pipeline W12 GEMM tiles at one program per SM, against the tuned config and cuBLAS, M = 1.

    python bench/prototypes/w12_deep.py --out DIR

Why: on Qwen3-32B qkv (10240 x 5120) cuBLAS runs 80 CTAs of 128 rows with a 12-stage pipeline, one
per SM, on 80 of 132 SMs, and reaches 3.7 TB/s (`bench/results/logs/ncu_10240_5120_1_m1.txt`);
the W12 sweep's tiles (2-6 stages, two or three programs per SM) leave its 160 row tiles uneven
over the SMs (active cycles 88-112% of the mean) and reach 3.1. The sweep never tries stages
beyond 6 or a single deep program per SM. This times such tiles (128 or 64 rows, 5-10 stages,
shared memory for one program per SM) with K splits that keep every program in one wave, on the
four projections short of 1.25x at M = 1 in the 0b5699d sweep. Each output is checked against the
reference bound. CUDA graphs over rotating weight sets, three rotated rounds, fastest kept.
Writes OUT/w12_deep.json and .md. No kernel change: configs only.
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

from bench.w12_kernels import check_output, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.w12 import encode  # noqa: E402
from specpilot.w12.layout import padded_columns  # noqa: E402

ROWS = (("Qwen3-32B", "qkv", 10240, 5120), ("Qwen3-8B", "qkv", 6144, 4096),
        ("Qwen3-8B", "gate_up", 24576, 4096), ("Qwen3-8B", "o", 4096, 4096))
DEEP = ((128, 128, 8, 6), (128, 128, 8, 7), (128, 128, 4, 5), (64, 128, 4, 10), (64, 256, 4, 6), (256, 128, 8, 4))


def deep_configs(N: int, K: int, sms: int) -> list[LaunchConfig]:
    out = []
    for n, k, w, s in DEEP:
        tiles = -(-N // n)
        steps = -(-padded_columns(K) // k)
        splits = {1, sms // tiles, 2 * sms // tiles} if tiles <= 2 * sms else {1}
        for sk in sorted(x for x in splits if 1 <= x <= min(kc.MAX_SPLIT_K, steps // 2 or 1)):
            out.append(LaunchConfig(KernelPath.GEMM, n, k, split_k=sk, num_warps=w, num_stages=s))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=400.0)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    data = {"meta": environment(), "rows": []}
    M = 1
    for model, proj, N, K in ROWS:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        tuned = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
        arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                "tuned " + tuned.label(): [lambda w=w: gemm_mod.gemm(x, w, tuned) for w in sets]}
        errors, failed = {}, {}
        for cfg in deep_configs(N, K, sms):
            if time.monotonic() - start > args.budget_s:
                break
            try:
                errors[cfg.label()] = check_output(gemm_mod.gemm(x, sets[0], cfg), x, sets[0])
                arms[cfg.label()] = [lambda w=w, c=cfg: gemm_mod.gemm(x, w, c) for w in sets]
            except Exception as err:  # noqa: BLE001 - a config that does not compile or fit is reported
                failed[cfg.label()] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        u, runs = rotated_rounds(arms)
        row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "us": u, "runs": runs,
               "error_over_bound": errors, "failed": failed}
        data["rows"].append(row)
        best = min((k for k in u if k != "cublas"), key=u.get)
        print(model, proj, {k: round(v, 2) for k, v in u.items()}, "best", best, "%.3f" % (u["cublas"] / u[best]),
              "failed", failed, flush=True)
        del sets, dense
        torch.cuda.empty_cache()
    (args.out / "w12_deep.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Deep-pipeline W12 tiles, one program per SM, M = 1 (bench/prototypes/w12_deep.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of 3 rotated rounds; "
             "ratio = cuBLAS / arm", "", "| model | proj | arm | µs | ratio | error / bound |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        for k, v in sorted(r["us"].items(), key=lambda kv: kv[1]):
            err = r["error_over_bound"].get(k)
            lines.append(f"| {r['model']} | {r['proj']} | {k} | {v:.2f} | {r['us']['cublas'] / v:.3f} | "
                         f"{'' if err is None else f'{err:.3f}'} |")
        for k, why in r["failed"].items():
            lines.append(f"| {r['model']} | {r['proj']} | {k} | failed: {why} | | |")
    (args.out / "w12_deep.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
