"""Prototype: split-K partials reduced through distributed shared memory, each row tile's K splits
one thread-block cluster (GPU only).

    python bench/prototypes/w12_cluster.py --out DIR [--budget-s 240]

Why: the deterministic split-K reduction (`tiles.reduce_split_k`: store the partial to the global
workspace, a fenced atomic on the tile's counter, the last split reading every partial back from
L2) costs 1.6-1.8 µs per call at M = 1 and 16 (bench/results/w12/split_reduce.md), and a program
spends 1.1-1.4 µs after its K loop on split launches against 0.3 µs without (w12_timeline.md);
K is split on 8B qkv/o/down and 32B o/down, the rows short of the targets. With `gemm.AB["cluster"]`
(temporary) the S splits of a tile run as one cluster of S CTAs: each writes its float32 partial to
its own shared memory at the elements' logical offsets, a cluster barrier (release/acquire), rank 0
reads the others' partials (mapa + ld.shared::cluster) and adds 0 + p_0 + ... + p_{S-1} in rank
order -- the workspace path's order, so the outputs must be bit-identical -- and a second barrier
keeps the others' shared memory alive until it has. The kernel is compiled as usual and launched
with cluster dimension S (Triton's launcher, given num_ctas = S in the packed metadata).

Every projection of Qwen3-8B and Qwen3-32B at M = 1 and 32: the tuned config and its split forced
to 2, 4 and 8, each through the workspace and through the cluster, against cuBLAS (`F.linear`),
rotating weight sets, CUDA graphs, fastest of 3 rotated rounds. Writes OUT/w12_cluster.json, .md.
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

from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ORDER = [("Qwen3-8B", "qkv"), ("Qwen3-32B", "qkv"), ("Qwen3-8B", "o"), ("Qwen3-8B", "gate_up"), ("Qwen3-32B", "o"),
         ("Qwen3-8B", "down"), ("Qwen3-32B", "down"), ("Qwen3-32B", "gate_up"), ("Qwen3-8B", "lm_head"),
         ("Qwen3-32B", "lm_head")]  # the rows short of the targets first
SPLITS = (2, 4, 8)


def run(x, w, cfg, cluster: bool):
    gemm_mod.AB["cluster"] = cluster
    try:
        return gemm_mod.gemm(x, w, cfg)
    finally:
        gemm_mod.AB["cluster"] = False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--budget-s", type=float, default=240.0)
    args = p.parse_args(argv)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    gpu = torch.cuda.get_device_name()
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    for model, proj in ORDER:
        if time.monotonic() - start > args.budget_s:
            print("budget spent; stopping before", model, proj, flush=True)
            break
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        for M in args.ms:
            tuned = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            arms, same = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}, {}
            cfgs = {"tuned " + tuned.label(): tuned}
            cfgs.update({f"sk{s}": dataclasses.replace(tuned, split_k=s, fit_wave=False) for s in SPLITS
                         if s != tuned.split_k})
            for tag, cfg in cfgs.items():
                try:
                    ref = run(x, sets[0], cfg, False)
                    arms["workspace " + tag] = [lambda w=w, c=cfg: run(x, w, c, False) for w in sets]
                    out = run(x, sets[0], cfg, True)
                    same[tag] = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
                    if same[tag]:
                        arms["cluster " + tag] = [lambda w=w, c=cfg: run(x, w, c, True) for w in sets]
                except Exception as err:  # noqa: BLE001 - report and go on
                    same[tag] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            torch.cuda.synchronize()
            u, runs = rotated_rounds(arms)
            data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "tuned": tuned.label(),
                                 "us": u, "runs": runs, "bit_identical": same})
            print(model, proj, M, {k: round(v, 2) for k, v in u.items()},
                  "not identical / failed:", {k: v for k, v in same.items() if v is not True}, flush=True)
            (args.out / "w12_cluster.json").write_text(json.dumps(data, indent=1) + "\n")
            del arms
        del sets, dense
        torch.cuda.empty_cache()
    lines = ["# Split-K reduced through a thread-block cluster's shared memory vs the global workspace "
             "(bench/prototypes/w12_cluster.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs per call, fastest "
             "of 3 rotated rounds; skN: the tuned config with its split forced to N", "",
             "| model | proj | M | cuBLAS | config | workspace µs | cluster µs | cuBLAS / best | cluster bit-identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        for tag, ok in r["bit_identical"].items():
            wsu, clu = u.get("workspace " + tag), u.get("cluster " + tag)
            best = min(v for v in (wsu, clu) if v is not None) if (wsu or clu) else float("nan")
            f = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | {tag} | {f(wsu)} | {f(clu)} | "
                         f"{u['cublas'] / best:.3f} | {ok} |")
    (args.out / "w12_cluster.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
