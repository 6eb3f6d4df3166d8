"""A/B: split-K reduced by pairwise atomic exchange against the counter-and-partials reduction.

    python bench/prototypes/w12_split_pairs.py --out DIR [--ms 1 8 16 32]

Shipped (`tiles.reduce_split_k`): every split stores its partial, a barrier and an acq_rel ticket
order it, and the last split reads all partials back -- three dependent L2 round trips and a
fence, 1.6-1.8 µs per call at M = 1 (bench/results/w12/split_reduce.md). "pairs"
(`tiles.reduce_split_k_pairs`): the splits form a binary tree, and at each level the two
surviving programs of a pair swap their values through one slot per element with a relaxed
atomic exchange; whoever gets the sentinel back drops out, the other adds (float32 addition
commutes: deterministic) -- one round trip per level. For the Qwen3-8B and -32B decoder
projections at the given M, tuned configs, CUDA graphs over rotating weight sets, three rotated
rounds of: cuBLAS, W12 as shipped, W12 pairs, and W12 pairs with split_k 2, 4 and 8 forced.
Checks: each pairs arm within the reference bound, bit-identical over two launches, its slots
all back to the sentinel. Writes OUT/w12_split_pairs.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, check_output, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.workspace import SplitKWorkspace  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

WS = None


def arm(x, sets, cfg, pairs=False):
    def call(w):
        gemm_mod.AB["pairs"] = pairs
        try:
            return gemm_mod.gemm(x, w, cfg, workspace=WS if pairs else None)
        finally:
            gemm_mod.AB.clear()
    return [lambda w=w: call(w) for w in sets]


def main(argv=None) -> int:
    global WS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 8, 16, 32])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    WS = SplitKWorkspace.allocate("cuda")
    WS.partials.view(torch.int32).fill_(-1)
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
                run, _, _ = gemm_mod.plan_launch(x, sets[0], cfg)
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense], "w12": arm(x, sets, cfg)}
                checks = {}
                variants = {"pairs": cfg, **{f"pairs sk{s}": dataclasses.replace(cfg, split_k=s) for s in (2, 4, 8)}}
                for label, c in variants.items():
                    y1, y2 = arm(x, sets[:1], c, True)[0](), arm(x, sets[:1], c, True)[0]()
                    torch.cuda.synchronize()
                    checks[label] = {"error_over_bound": check_output(y1, x, sets[0]),
                                     "deterministic": bool(torch.equal(y1.view(torch.int16), y2.view(torch.int16))),
                                     "slots_reset": bool((WS.partials.view(torch.int32) == -1).all())}
                    arms[label] = arm(x, sets, c, True)
                keys = list(arms)
                runs = {k: [] for k in keys}
                warm_clocks()
                for r in range(3):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        runs[k].append(graph_time_us(arms[k]))
                u = {k: min(v) for k, v in runs.items()}
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                       "splits": run.grid[1], "checks": checks, "us": u, "runs": runs}
                data["rows"].append(row)
                best = min((k for k in keys if k.startswith("pairs")), key=lambda k: u[k])
                print(model.name, proj, M, cfg.label(), "splits", run.grid[1], {k: round(v, 2) for k, v in u.items()},
                      "| w12 %.3f pairs %.3f best %s %.3f" % (u["cublas"] / u["w12"], u["cublas"] / u["pairs"], best,
                                                            u["cublas"] / u[best]),
                      "| ok" if all(c["deterministic"] and c["slots_reset"] and c["error_over_bound"] <= 1
                                    for c in checks.values()) else f"| CHECK FAILED {checks}", flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_split_pairs.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# W12 split-K by pairwise atomic exchange vs counter and partials (bench/prototypes/w12_split_pairs.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of 3 rotated rounds",
             "", "| model | proj | M | tuned config | splits | cuBLAS | W12 | pairs | pairs sk2 | pairs sk4 | pairs sk8 | "
             "W12/cuBLAS | pairs/cuBLAS | best pairs/cuBLAS | checks |", "|" + "---|" * 15]
    for r in data["rows"]:
        u = r["us"]
        best = min((k for k in u if k.startswith("pairs")), key=lambda k: u[k])
        ok = all(c["deterministic"] and c["slots_reset"] and c["error_over_bound"] <= 1 for c in r["checks"].values())
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r['splits']} | {u['cublas']:.2f} | "
                     f"{u['w12']:.2f} | {u['pairs']:.2f} | {u['pairs sk2']:.2f} | {u['pairs sk4']:.2f} | {u['pairs sk8']:.2f} | "
                     f"{u['cublas'] / u['w12']:.3f} | {u['cublas'] / u['pairs']:.3f} | {u['cublas'] / u[best]:.3f} ({best}) | "
                     f"{'ok' if ok else 'FAILED'} |")
    (args.out / "w12_split_pairs.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
