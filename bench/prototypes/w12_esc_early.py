"""A/B: W12 escape blocks gathered inside the K loop, once, against after it.

    python bench/prototypes/w12_esc_early.py --out DIR [--ms 1 2 8 16 32]

Escape blocks as shipped: every program loads its slab of entries before the K loop and, after
it, gathers x at their columns and adds a one-hot dot -- a round trip at the end of every program,
and at M = 32 a burst of (entries x M) sector reads (bench/results/w12/w12_m32_parts.json: 0.5-3.6
µs). "early": the loop's second step (the entries have arrived by then) issues the gather once,
under a branch, with inline-PTX loads (Triton's pipeliner would otherwise turn it into a
per-step async copy, and LLVM would hoist its addresses out of the loop: +34-66 registers); the
dot stays after the loop, so the gather overlaps the weight stream without a pipeline refill.
(Tried before and slower: a chunk per step, `w12_esc_loop.md`; two half loops, `w12_esc_early.md`.)
For the Qwen3-8B and -32B decoder projections at the given M, tuned configs, CUDA graphs over
rotating weight sets, three rotated rounds of: cuBLAS, W12, W12 early, W12 with escapes off (a
floor, wrong results). The early arm's output is checked bit-identical to W12's (the same sums in
the same order). Writes OUT/w12_esc_early.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12 import encode  # noqa: E402


def arm(x, sets, cfg, early=0, escapes="auto"):
    def call(w):
        gemm_mod.AB["early"] = early
        try:
            return gemm_mod.gemm(x, w, cfg, escapes=escapes)
        finally:
            gemm_mod.AB.clear()
    return [lambda w=w: call(w) for w in sets]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2, 8, 16, 32])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    data = {"meta": environment(), "rows": []}
    for model in MODELS:
        for proj, N, K in model.projections():
            if proj == "lm_head":
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                run, mode, found = gemm_mod.plan_launch(x, sets[0], cfg)
                y0, y1 = arm(x, sets[:1], cfg)[0](), arm(x, sets[:1], cfg, 3)[0]()
                same = bool(torch.equal(y0.view(torch.int16), y1.view(torch.int16)))
                err = check_output(y0, x, sets[0])
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense], "w12": arm(x, sets, cfg),
                        "w12 early": arm(x, sets, cfg, 3), "w12 escapes off": arm(x, sets, cfg, escapes="off")}
                keys = list(arms)
                runs = {k: [] for k in keys}
                warm_clocks()
                for r in range(3):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        runs[k].append(graph_time_us(arms[k]))
                u = {k: min(v) for k, v in runs.items()}
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                       "slot": found.slot if found else None, "steps_per_split": run.steps_per_split,
                       "splits": run.grid[1], "early_bit_identical": same, "error_over_bound": err, "us": u, "runs": runs}
                data["rows"].append(row)
                print(model.name, proj, M, cfg.label(), "slot", row["slot"], "steps", run.steps_per_split, "same", same,
                      {k: round(v, 2) for k, v in u.items()}, "ratio blocks %.3f early %.3f" % (u["cublas"] / u["w12"], u["cublas"] / u["w12 early"]), flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_esc_early.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [f"# W12 escape gather issued inside the K loop (2nd step) vs after it (bench/prototypes/w12_esc_early.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of 3 rotated rounds",
             "", "| model | proj | M | config | slot | steps/split | bit-identical | cuBLAS | W12 | W12 early | escapes off | W12/cuBLAS | early/cuBLAS |",
             "|" + "---|" * 13]
    for r in data["rows"]:
        u = r["us"]
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r['slot']} | {r['steps_per_split']} | "
                     f"{r['early_bit_identical']} | {u['cublas']:.2f} | {u['w12']:.2f} | {u['w12 early']:.2f} | {u['w12 escapes off']:.2f} | "
                     f"{u['cublas'] / u['w12']:.3f} | {u['cublas'] / u['w12 early']:.3f} |")
    (args.out / "w12_esc_early.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
