"""What the split-K reduction costs the W12 GEMM at small M, and whether a decoupled one is cheaper.

    python bench/prototypes/w12_split_reduce.py --out DIR [--ms 1 16]

For each Qwen3-8B / 32B projection and M, with the config the shipped tuned table picks, it
times side by side (rotating weight sets in CUDA graphs, ROUNDS rotated rounds, fastest of each):
cuBLAS (`F.linear`); the kernel with the counter reduction (`tiles.reduce_split_k`, shipped);
with the decoupled one (`tiles.reduce_split_k_decoupled`: the last split waits for the others'
partials instead of storing its own first); with no reduction (every split stores its partial
as the output: wrong, a lower bound on the reduction's cost); and the shipped kernel with escapes
off (wrong too: what the escape blocks cost). The two exact arms are checked against the error
bound and against each other first. Uses the temporary switch `gemm._REDUCE`. Writes
OUT/split_reduce.json and prints a table.
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

ROUNDS = 3


def call(x, w, cfg, reduce: str, escapes: str = "auto"):
    gemm_mod._REDUCE = reduce
    try:
        return gemm_mod.gemm(x, w, cfg, escapes=escapes)
    finally:
        gemm_mod._REDUCE = "counter"


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
                y_counter = call(x, w12[0], cfg, "counter")
                checks = {"counter": check_output(y_counter, x, w12[0], exact, bound)}
                for other in ("reset_relaxed", "release", "relaxed"):  # and 50 more launches each: a race would show
                    ys = [call(x, w12[0], cfg, other) for _ in range(51)]
                    checks[other] = check_output(ys[0], x, w12[0], exact, bound)
                    checks[other + "_bitwise_equal"] = all(torch.equal(y_counter.view(torch.int16), y.view(torch.int16))
                                                          for y in ys)
                del exact, bound
                arms = {"cublas": [lambda w=w: F.linear(x, w) for w in dense]}
                for arm, reduce, esc in (("counter", "counter", "auto"), ("reset_relaxed", "reset_relaxed", "auto"),
                                         ("release", "release", "auto"), ("relaxed", "relaxed", "auto"),
                                         ("no_reduction", "none", "auto"), ("escapes_off", "counter", "off")):
                    arms[arm] = [lambda w=w, r=reduce, e=esc: call(x, w, cfg, r, e) for w in w12]
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
                (args.out / "split_reduce.json").write_text(json.dumps(data, indent=1) + "\n")
            del dense, w12
            torch.cuda.empty_cache()
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
