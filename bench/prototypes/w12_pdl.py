"""Prototype: programmatic dependent launch (PDL) for the W12 GEMM, with the first K steps' weight
bytes prefetched into L2 before the program waits for the previous kernel (GPU only).

    python bench/prototypes/w12_pdl.py --out DIR [--budget-s 240]

Why: a graph-timed call spends 1.4-2.0 µs outside every program (bench/results/w12/w12_timeline.md),
and at M=1 the SMs finish their last program 4-17 µs apart. With PDL (`gemm.AB`, temporary) a
program first lets the next launch start (griddepcontrol.launch_dependents), prefetches its first
`prefetch` K steps of weight bytes into L2 (cp.async.bulk.prefetch.L2: weights are never written
by a kernel it may overlap), then waits (griddepcontrol.wait) for the previous kernel to finish and
flush; nothing before the wait reads x or writes memory. The SASS keeps that order (PREEXIT,
UBLKPF.L2, ACQBULK, then the first LDG/LDGSTS).

Two settings, every projection of Qwen3-8B and Qwen3-32B at M = 1 and 32, each arm at the tuned
config of the shipped table, rotating weight sets, CUDA graphs, fastest of 3 rotated rounds:
- back to back: the same projection called over and over, as bench/w12_kernels.py times it. With
  PDL a call overlaps the previous call of the same kernel; cuBLAS (`F.linear`) gets no PDL.
- after a producer: every call preceded by a copy into x (x.copy_, the stand-in for the RMSNorm or
  activation that writes a projection's input in a decode step), as in the engine. The copy is
  launched without PDL, so a PDL GEMM overlaps only the copy's end and its own launch; µs is per
  (copy + projection) pair and "net" subtracts the copy timed alone in the same rounds.
Correctness: each PDL arm's output is compared bit for bit with the same config without PDL, eagerly
and from a replayed graph of four (copy of a different x, projection) pairs, so a projection that
read x before the copy finished would show up.
Writes OUT/w12_pdl.json and .md.
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

from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ORDER = [("Qwen3-8B", "qkv"), ("Qwen3-32B", "qkv"), ("Qwen3-8B", "o"), ("Qwen3-8B", "gate_up"), ("Qwen3-32B", "o"),
         ("Qwen3-8B", "down"), ("Qwen3-32B", "down"), ("Qwen3-32B", "gate_up"), ("Qwen3-8B", "lm_head"),
         ("Qwen3-32B", "lm_head")]  # the rows short of the targets first


def call(x, w, cfg, pdl: bool, prefetch: int):
    gemm_mod.AB.update(pdl=pdl, prefetch=prefetch)
    try:
        return run_config(x, w, cfg)
    finally:
        gemm_mod.AB.update(pdl=False, prefetch=0)


def graph_check(x, srcs, w, cfg, prefetch: int, ref: list) -> bool:
    """Replay a graph of (copy srcs[i] into x, PDL projection) pairs; every output bit-identical to `ref`?"""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in srcs:
            x.copy_(s)
            call(x, w, cfg, True, prefetch)
    torch.cuda.current_stream().wait_stream(side)
    graph, outs = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        for s in srcs:
            x.copy_(s)
            outs.append(call(x, w, cfg, True, prefetch))
    graph.replay()
    torch.cuda.synchronize()
    return all(torch.equal(o.view(torch.int16), r.view(torch.int16)) for o, r in zip(outs, ref))


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
            cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
            dcfg = kc.choose_config(kc.WeightFormat.DENSE, M, N, K, gpu)
            st = cfg.num_stages
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            srcs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
            src = srcs[0]
            w12 = {"w12": (False, 0), "w12 pdl": (True, 0), "w12 pdl pf2": (True, 2), f"w12 pdl pf{st}": (True, st)}
            same = {}
            for name, (pdl, pf) in w12.items():
                if not pdl:
                    continue
                try:
                    ref = [call(s, sets[0], cfg, False, 0) for s in srcs]
                    eager = all(torch.equal(call(s, sets[0], cfg, True, pf).view(torch.int16), r.view(torch.int16))
                                for s, r in zip(srcs, ref))
                    same[name] = eager and graph_check(x, srcs, sets[0], cfg, pf, ref)
                except Exception as err:  # noqa: BLE001 - report and go on
                    same[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}
            for name, (pdl, pf) in w12.items():
                if same.get(name, True) is True:
                    arms[name] = [lambda w=w, a=pdl, b=pf: call(x, w, cfg, a, b) for w in sets]
            arms["bf16 kernel"] = [lambda d=d: call(x, d, dcfg, False, 0) for d in dense]
            arms[f"bf16 kernel pdl pf{dcfg.num_stages}"] = [lambda d=d: call(x, d, dcfg, True, dcfg.num_stages)
                                                           for d in dense]
            arms["copy"] = [lambda: x.copy_(src)] * len(sets)
            arms["copy + cublas"] = [lambda d=d: (x.copy_(src), F.linear(x, d)) for d in dense]
            for name in ("w12", "w12 pdl", f"w12 pdl pf{st}"):
                if name in arms:
                    pdl, pf = w12[name]
                    arms["copy + " + name] = [lambda w=w, a=pdl, b=pf: (x.copy_(src), call(x, w, cfg, a, b)) for w in sets]
            u, runs = rotated_rounds(arms)
            row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                   "bf16_config": dcfg.label(), "us": u, "runs": runs, "bit_identical": same}
            data["rows"].append(row)
            print(model, proj, M, cfg.label(), {k: round(v, 2) for k, v in u.items()},
                  "not identical / failed:", {k: v for k, v in same.items() if v is not True}, flush=True)
            (args.out / "w12_pdl.json").write_text(json.dumps(data, indent=1) + "\n")
        del sets, dense
        torch.cuda.empty_cache()
    (args.out / "w12_pdl.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "w12_pdl.md").write_text(render(data))
    return 0


def render(data) -> str:
    m = data["meta"]
    lines = ["# W12 GEMM with programmatic dependent launch and L2 prefetch (bench/prototypes/w12_pdl.py)", "",
             f"- {m['date']}, {m['gpu']}, commit {m['git_commit']}; tuned configs; µs per call, fastest of 3 rotated "
             "rounds; cuBLAS (`F.linear`) never gets PDL", "",
             "## Back to back (as bench/w12_kernels.py times it; a PDL call overlaps the previous call)", "",
             "| model | proj | M | config | arm | µs | cuBLAS / arm | bit-identical to no PDL |", "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        for k, v in u.items():
            if k != "cublas" and not k.startswith("copy"):
                lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {k} | {v:.2f} | "
                             f"{u['cublas'] / v:.3f} | {r['bit_identical'].get(k, '')} |")
    lines += ["", "## After a producer (x.copy_ before every call, launched without PDL; net = pair - copy alone)", "",
              "| model | proj | M | copy µs | arm | pair µs | net µs | cuBLAS net / arm net |", "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        c = u["copy"]
        base = u["copy + cublas"] - c
        for k, v in u.items():
            if k.startswith("copy + "):
                lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {c:.2f} | {k[7:]} | {v:.2f} | {v - c:.2f} | "
                             f"{base / (v - c):.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
