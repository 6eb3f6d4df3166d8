"""Do the 128-row W12 tiles lose at M = 16-64 only to a partial second wave?

    python bench/prototypes/w12_n128_waves.py --out DIR [--ms 16 32 64]

Nsight Compute on Qwen3-32B down at M = 32 (bench/results/logs/ncu_32b_down_m32.txt): the 8-warp
n128 tiles run two programs per SM (264 slots), but the automatic split (about two programs per
SM, rounded up) launched 40 row tiles x 7 splits = 280 programs, so 16 ran in a second wave
(SM active cycles: max 125K against an average of 101K). The sweep only tries explicit splits
on each row's fastest config, so such tiles were never timed with a split that fits one wave.
For the Qwen3-8B and -32B decoder projections at the given M, CUDA graphs over rotating weight
sets, three rotated rounds of: cuBLAS, W12 with the tuned config, and n128 k128 w8 s3 and n128
k256 w8 s2 with the automatic split and with the largest split that fits 264 programs. Writes
OUT/w12_n128_waves.json and .md.
"""

from __future__ import annotations

import argparse
import re
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.gemm import gemm  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

TILES = ((128, 128, 8, 3), (128, 256, 8, 2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[16, 32, 64])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    slots = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    data = {"meta": environment(), "rows": []}
    for model in MODELS:
        for proj, N, K in model.projections():
            if proj == "lm_head":
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                cfgs = {"tuned": kc.choose_config(kc.WeightFormat.W12, M, N, K, name)}
                for n, k, w, s in TILES:
                    base = LaunchConfig(KernelPath.GEMM, block_n=n, block_k=k, num_warps=w, num_stages=s)
                    cfgs[base.label() + " auto"] = base
                    tiles = -(-N // n)
                    split = max(1, min(kc.MAX_SPLIT_K, slots // tiles))
                    cfgs[base.label() + f" sk{split} (one wave)"] = dataclasses.replace(base, split_k=split)
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}
                errors = {}
                for label, c in cfgs.items():
                    errors[label] = check_output(gemm(x, sets[0], c), x, sets[0])
                    arms[label] = [lambda w=w, c=c: gemm(x, w, c) for w in sets]
                keys = list(arms)
                runs = {k: [] for k in keys}
                warm_clocks()
                for r in range(3):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        runs[k].append(graph_time_us(arms[k]))
                u = {k: min(v) for k, v in runs.items()}
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "tuned": cfgs["tuned"].label(),
                       "errors_over_bound": errors, "us": u, "runs": runs}
                data["rows"].append(row)
                print(model.name, proj, M, cfgs["tuned"].label(), {k: round(v, 2) for k, v in u.items()},
                      "max err/bound %.2f" % max(errors.values()), flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_n128_waves.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "w12_n128_waves.md").write_text(render(data))
    return 0


def render(data: dict) -> str:
    """One row per projection and M; a split's column is the same for every row, its factor per row."""
    def col(label: str) -> str:
        return re.sub(r" sk\d+ \(one wave\)", " one-wave split", label)
    keys = list(dict.fromkeys(col(k) for r in data["rows"] for k in r["us"] if k != "cublas"))
    lines = ["# W12 128-row tiles with a split that fits one wave (bench/prototypes/w12_n128_waves.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; "
             "µs (ratio vs cuBLAS), fastest of 3 rotated rounds; one wave = at most 2 programs per SM (264)",
             "", "| model | proj | M | cuBLAS | " + " | ".join(keys) + " | one-wave splits |", "|" + "---|" * (5 + len(keys))]
    for r in data["rows"]:
        u = {col(k): v for k, v in r["us"].items()}
        splits = ", ".join(re.search(r"sk\d+", k).group(0) for k in r["us"] if "one wave" in k)
        cells = [f"{u[k]:.2f} ({u['cublas'] / u[k]:.3f})" for k in keys]
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | " + " | ".join(cells) + f" | {splits} |")
    lines += ["", "tuned: " + "; ".join(f"{r['model']} {r['proj']} M={r['M']}: {r['tuned']}" for r in data["rows"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
