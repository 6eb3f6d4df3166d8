"""The escape blocks' gather of x from row-major x (one 32-byte sector per value) against a
transposed copy x^T [K, M] made by `x.t().contiguous()` inside the call (a column's M values side by side).

    python bench/prototypes/w12_gather_t.py --out DIR [--ms 8 16 32 64]

For each Qwen3-8B / 32B projection and M, with the config the shipped tuned table picks, it
times side by side (rotating weight sets in CUDA graphs, ROUNDS rotated rounds, fastest of each):
cuBLAS (`F.linear`), `rows` (shipped), `transposed` (the copy's kernel included) and escapes off
(wrong: what escapes cost at all). Both exact arms are checked against the error bound and
against each other first. Uses the temporary switch `gemm._GATHER_T_MIN_M`. Writes
OUT/gather_t.json and prints a table.
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

from bench.w12_kernels import (  # noqa: E402
    MODELS, check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets,
)
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.configs import WeightFormat, choose_config  # noqa: E402
from specpilot.kernels.launch import prepare_launch  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROUNDS = 4


def call(x, w, cfg, mode: str, escapes: str = "auto"):
    gemm_mod._GATHER_T_MIN_M = 1 if mode == "transposed" else 1 << 30
    try:
        return gemm_mod.gemm(x, w, cfg, escapes=escapes)
    finally:
        gemm_mod._GATHER_T_MIN_M = 1 << 30


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[8, 16, 32, 64])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    data = {"meta": environment(), "rows": []}
    start = time.monotonic()
    for model in MODELS:
        for proj, N, K in model.projections():
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            w12 = [encode(dense[i % len(dense)]) for i in range(weight_sets(N, K, N * K * 1.5))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                cfg = choose_config(WeightFormat.W12, M, N, K, name)
                split = prepare_launch(x, w12[0], cfg, cfg.path, 64, None).grid[1]
                exact, bound = error_bound(x, w12[0], x.dtype)
                y_rows, y_t = call(x, w12[0], cfg, "rows"), call(x, w12[0], cfg, "transposed")
                checks = {"rows": check_output(y_rows, x, w12[0], exact, bound),
                          "transposed": check_output(y_t, x, w12[0], exact, bound),
                          "bitwise_equal": bool(torch.equal(y_rows.view(torch.int16), y_t.view(torch.int16))),
                          "esc_mode": gemm_mod.plan_launch(x, w12[0], cfg)[1].value}
                del exact, bound
                arms = {"cublas": [lambda w=w: F.linear(x, w) for w in dense]}
                for arm, mode, esc in (("rows", "rows", "auto"), ("transposed", "transposed", "auto"),
                                       ("escapes_off", "rows", "off")):
                    arms[arm] = [lambda w=w, md=mode, e=esc: call(x, w, cfg, md, e) for w in w12]
                warm_clocks()
                keys = list(arms)
                times = {k: [] for k in keys}
                for r in range(ROUNDS):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        times[k].append(graph_time_us(arms[k]))
                best = {k: min(v) for k, v in times.items()}
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                       "split_k": split, "us": best, "runs": times, "checks": checks}
                data["rows"].append(row)
                cub = best["cublas"]
                print(f"{model.name} {proj} M={M} {cfg.label()} (x{split}): "
                      + ", ".join(f"{k} {v:.2f} (x{cub / v:.3f})" for k, v in best.items()) + f" {checks}", flush=True)
                (args.out / "gather_t.json").write_text(json.dumps(data, indent=1) + "\n")
            del dense, w12
            torch.cuda.empty_cache()
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
