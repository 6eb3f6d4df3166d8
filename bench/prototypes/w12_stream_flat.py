"""A/B: the flat stream-K W12 GEMM (`specpilot/kernels/gemm_sk.py`) against the tuned standard grid.

    python bench/prototypes/w12_stream_flat.py --out DIR [--ms 1 32]

Why: bench/results/w12/w12_timeline.md shows the standard grid's SMs finishing their last programs
over a spread of 4-17 µs at M=1 (32B qkv: 18.0-23.2 µs; 32B gate_up 80.9-98.4). The flat stream-K
gives every program an equal share of the (row tile, K step) units in one software-pipelined loop.
For every Qwen3-8B/-32B projection at the given M: cuBLAS, the tuned standard config, and the flat
stream-K with a few tiles, stages and programs per SM; each output checked against the reference
bound; CUDA graphs over rotating weight sets, three rotated rounds, fastest kept. Writes
OUT/w12_stream_flat.json and .md.
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

from bench.w12_kernels import MODELS, check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.gemm_sk import gemm_sk  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

VARIANTS = ((64, 256, 4, 3, 2), (64, 256, 4, 4, 2), (64, 128, 4, 4, 2), (64, 128, 4, 4, 3), (64, 128, 4, 3, 3))  # n, k, warps, stages, per SM


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--budget-s", type=float, default=300.0)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    name = torch.cuda.get_device_name()
    data = {"meta": environment(), "rows": []}
    for model in MODELS:
        for proj, N, K in model.projections():
            if time.monotonic() - start > args.budget_s:
                break
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                        "tuned": [lambda w=w: gemm_mod.gemm(x, w, cfg) for w in sets]}
                errors, failed = {}, {}
                for n, k, warps, stages, per_sm in VARIANTS:
                    label = f"sk n{n} k{k} w{warps} s{stages} p{per_sm}"
                    call = lambda w, n=n, k=k, warps=warps, stages=stages, per_sm=per_sm: gemm_sk(  # noqa: E731
                        x, w, n, k, warps, stages, per_sm)
                    try:
                        errors[label] = check_output(call(sets[0]), x, sets[0])
                        arms[label] = [lambda w=w, call=call: call(w) for w in sets]
                    except Exception as err:  # noqa: BLE001 - report and go on
                        failed[label] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                keys = list(arms)
                runs = {k: [] for k in keys}
                warm_clocks()
                for r in range(3):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        runs[k].append(graph_time_us(arms[k]))
                u = {k: min(v) for k, v in runs.items()}
                best = min((k for k in u if k.startswith("sk")), key=u.get, default=None)
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "tuned_config": cfg.label(), "us": u,
                       "runs": runs, "error_over_bound": errors, "failed": failed, "best_sk": best}
                data["rows"].append(row)
                print(model.name, proj, M, cfg.label(), {k: round(v, 2) for k, v in u.items()},
                      "tuned %.3f" % (u["cublas"] / u["tuned"]), "best sk %s %.3f" % (best, u["cublas"] / u[best]) if best else "",
                      "worst err %.3f" % max(errors.values(), default=0), "failed", failed, flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_stream_flat.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Flat stream-K W12 GEMM vs the tuned standard grid (bench/prototypes/w12_stream_flat.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of 3 rotated "
             "rounds; x = cuBLAS / arm", "",
             "| model | proj | M | cuBLAS | tuned (config) | x | best stream-K | x | " + " | ".join(
                 f"sk n{n} k{k} w{w} s{s} p{q}" for n, k, w, s, q in VARIANTS) + " | worst error / bound |",
             "|" + "---|" * (9 + len(VARIANTS))]
    for r in data["rows"]:
        u = r["us"]
        b = r["best_sk"]
        cells = [f"{u[k]:.2f}" if k in u else "failed" for k in (f"sk n{n} k{k} w{w} s{s} p{q}" for n, k, w, s, q in VARIANTS)]
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | {u['tuned']:.2f} ({r['tuned_config']}) | "
                     f"{u['cublas'] / u['tuned']:.3f} | {b} | {u['cublas'] / u[b]:.3f} | " + " | ".join(cells)
                     + f" | {max(r['error_over_bound'].values(), default=0):.3f} |")
    (args.out / "w12_stream_flat.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
