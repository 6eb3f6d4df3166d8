"""Split-K launches: escape blocks per split (each split adds its columns' entries before its
partial) against whole-row blocks gathered before the reduction and added by the last split.

    python bench/prototypes/w12_split_escapes.py --out DIR [--ms 1 16]

For each Qwen3-8B / 32B projection and M, with the config the shipped tuned table picks, it
times side by side (rotating weight sets in CUDA graphs, ROUNDS rotated rounds, fastest of each):
cuBLAS (`F.linear`), `per_split`, `last`, and escapes off (wrong: what escapes cost at all). Both
exact arms are checked against the error bound first. Uses the temporary switch
`gemm._SPLIT_ESCAPES`. Writes OUT/split_escapes.json and prints a table.
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
    gemm_mod._SPLIT_ESCAPES = mode
    try:
        return gemm_mod.gemm(x, w, cfg, escapes=escapes)
    finally:
        gemm_mod._SPLIT_ESCAPES = "last"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 16])
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
                y_split, y_last = call(x, w12[0], cfg, "per_split"), call(x, w12[0], cfg, "last")
                modes = {k: gemm_mod.plan_launch(x, w12[0], cfg)[1].value for k in ("last",)}
                checks = {"per_split": check_output(y_split, x, w12[0], exact, bound),
                          "last": check_output(y_last, x, w12[0], exact, bound), "esc_mode_last": modes["last"]}
                del exact, bound
                arms = {"cublas": [lambda w=w: F.linear(x, w) for w in dense]}
                for arm, mode, esc in (("per_split", "per_split", "auto"), ("last", "last", "auto"),
                                       ("escapes_off", "last", "off")):
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
                (args.out / "split_escapes.json").write_text(json.dumps(data, indent=1) + "\n")
            del dense, w12
            torch.cuda.empty_cache()
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
