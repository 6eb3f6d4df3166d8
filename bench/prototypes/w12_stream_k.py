"""Does the stream-K grid beat the tuned standard grid? Side by side with cuBLAS, one run.

    python bench/prototypes/w12_stream_k.py --out DIR [--ms 1 32]

For each Qwen3-8B / 32B projection and M it times, over rotating weight sets in CUDA graphs as
bench/w12_kernels.py does: cuBLAS (`F.linear`), the W12 config the shipped tuned table picks
(standard grid), and that tile on the stream-K grid with 1-4 programs per SM (`stream_k.py`).
Every arm is timed ROUNDS times in rotated order and reports its fastest; every stream-K output is
checked against the error bound first. Writes OUT/stream_k.json and prints a table.
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

from bench.w12_kernels import (  # noqa: E402
    MODELS, check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets,
)
from specpilot.kernels.configs import WeightFormat, choose_config  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROUNDS = 3
PROGRAMS_PER_SM = (2, 3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
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
                tuned = choose_config(WeightFormat.W12, M, N, K, name)
                base = dataclasses.replace(tuned, split_k=0)
                arms = {"cublas": [lambda w=w: F.linear(x, w) for w in dense],
                        "tuned " + tuned.label(): [lambda w=w: run_config(x, w, tuned) for w in w12]}
                exact, bound = error_bound(x, w12[0], x.dtype)
                errors = {}
                for pps in PROGRAMS_PER_SM:
                    cfg = dataclasses.replace(base, stream_k=True, programs_per_sm=pps)
                    errors[cfg.label()] = check_output(run_config(x, w12[0], cfg), x, w12[0], exact, bound)
                    arms[cfg.label()] = [lambda w=w, c=cfg: run_config(x, w, c) for w in w12]
                del exact, bound
                warm_clocks()
                keys = list(arms)
                times = {k: [] for k in keys}
                for r in range(ROUNDS):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        times[k].append(graph_time_us(arms[k]))
                best = {k: min(v) for k, v in times.items()}
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "us": best, "runs": times,
                       "error_over_bound": errors}
                data["rows"].append(row)
                cub = best["cublas"]
                print(f"{model.name} {proj} M={M}: " + ", ".join(f"{k} {v:.2f} (x{cub / v:.3f})" for k, v in best.items()),
                      flush=True)
                (args.out / "stream_k.json").write_text(json.dumps(data, indent=1) + "\n")
            del dense, w12
            torch.cuda.empty_cache()
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
