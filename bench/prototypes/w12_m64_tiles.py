"""Prototype: 256-row weight tiles for the GEMM at 48-64 rows (GPU only).

    python bench/prototypes/w12_m64_tiles.py --out DIR [--ms 64 48]

Why: at M=64 the W12 GEMM (and our BF16 kernel) runs below cuBLAS on five projections
(bench/results/w12/w12_kernels_shipped_4.md: 8B o 0.787x, 32B qkv 0.815x). Each program reads its
K range of x once per weight-row tile, so with 64-row tiles x crosses from L2 N/64 times: on 8B o
at M=64 that is 32 MB of x against 25 MB of W12 weights per call. A 256-row tile (8 warps, ~225
registers: one program per SM, `resident` 1) reads x a quarter as often. Arms per row, escapes on,
weights and x by TMA: cuBLAS; the shipped config; n128 k128 w8 s3 at its one-wave split; n256 k128
w8 s2/s3 with one program per SM at the split that fits one wave (and the same with the register
cap of two per SM, which spills ~108 bytes). Each arm is checked against the float64 reference
bound. The lowered minimum of `resident` is patched in for this run only. Writes
OUT/w12_m64_tiles.json and .md.
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
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.kernels.launch import sm_count  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROWS = ["Qwen3-8B/o", "Qwen3-8B/qkv", "Qwen3-8B/gate_up", "Qwen3-32B/qkv", "Qwen3-32B/down"]


def one_wave(n: int, N: int, K: int, per_sm: int, sms: int) -> int:
    """The largest K split (<= 8, >= 2 K steps of 128 each) whose programs fit one wave of `per_sm` per SM."""
    tiles = -(-N // n)
    return max(1, min(kc.MAX_SPLIT_K, (per_sm * sms) // tiles, K // 256))


def plans(N: int, K: int, sms: int) -> dict[str, LaunchConfig]:
    kc.MIN_PROGRAMS_PER_SM = 1  # this run only: `resident` 1 (one 8-warp program per SM, 248 registers)
    out = {"n128 s3 fw": LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True,
                                         tma=True, tma_x=True)}
    for s in (2, 3):
        sk = one_wave(256, N, K, 1, sms)
        out[f"n256 s{s} r1"] = LaunchConfig(KernelPath.GEMM, 256, 128, num_warps=8, num_stages=s,
                                                       split_k=sk, resident=1, tma=True, tma_x=True)
    sk = one_wave(256, N, K, 2, sms)
    out["n256 s2 r2"] = LaunchConfig(KernelPath.GEMM, 256, 128, num_warps=8, num_stages=2, split_k=sk,
                                                resident=2, tma=True, tma_x=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[64, 48])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    name = torch.cuda.get_device_name()
    sms = sm_count(torch.device("cuda"))
    for shape in MODELS:
        for proj, N, K in shape.projections():
            if f"{shape.name}/{proj}" not in ROWS:
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                exact, bound = error_bound(x, sets[0], torch.bfloat16)
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}
                configs = {"shipped": kc.choose_config(kc.WeightFormat.W12, M, N, K, name), **plans(N, K, sms)}
                errors = {}
                for tag, cfg in configs.items():
                    try:
                        y = run_config(x, sets[0], cfg)
                        errors[tag] = float(((y.double() - exact).abs() / bound).max())
                        if errors[tag] <= 1.0:
                            arms[tag] = [lambda w=w, c=cfg: run_config(x, w, c) for w in sets]
                    except Exception as err:  # noqa: BLE001 - report and go on
                        errors[tag] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                u, runs = rotated_rounds(arms)
                data["rows"].append({"model": shape.name, "proj": proj, "N": N, "K": K, "M": M, "us": u, "runs": runs,
                                     "error_over_bound": errors, "configs": {k: c.label() for k, c in configs.items()}})
                print(shape.name, proj, M, {k: round(v, 2) for k, v in u.items()}, flush=True)
                del exact, bound
            del sets, dense
            torch.cuda.empty_cache()
            (args.out / "w12_m64_tiles.json").write_text(json.dumps(data, indent=1) + "\n")
            (args.out / "w12_m64_tiles.md").write_text(render(data))
    return 0


def render(data: dict) -> str:
    m = data["meta"]
    keys = sorted({k for r in data["rows"] for k in r["us"] if k != "cublas"}, key=lambda k: (k != "shipped", k))
    lines = ["# 256-row weight tiles at 48-64 rows (bench/prototypes/w12_m64_tiles.py)", "",
             f"- {m['date']}, {m['gpu']}, commit {m['git_commit']}; µs, fastest of 3 rotated rounds over rotating "
             "weight sets, escapes on, weights and x by TMA; x = cuBLAS / arm; r1 = one program per SM (248 "
             "registers), r2 = the cap of two (spills); with the minimum of `resident` patched to 1 for the run, config "
             "labels show r2 for the usual cap of two per SM", "",
             "| model | proj | M | cuBLAS | " + " | ".join(f"{k} | x" for k in keys) + " | shipped config |",
             "|---|---|---|---|" + "---|---|" * len(keys) + "---|"]
    splits = "; ".join(sorted({f"{r['model']} {r['proj']}: " + ", ".join(f"{k} = {v}" for k, v in r["configs"].items())
                               for r in data["rows"]}))
    for r in data["rows"]:
        u = r["us"]
        cells = " | ".join(f"{u[k]:.2f} | {u['cublas'] / u[k]:.3f}" if k in u else "- | -" for k in keys)
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | {cells} | {r['configs']['shipped']} |")
    errs = [f"{r['model']} {r['proj']} M={r['M']} {k}: {v}" for r in data["rows"]
            for k, v in r["error_over_bound"].items() if not isinstance(v, float) or v > 1.0]
    lines += ["", "errors / over the bound: " + ("; ".join(errs) if errs else "none"), "", "configs: " + splits]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
