"""A/B: the W12 GEMM with an L2 prefetch of its first K steps and programmatic dependent launch.

    python bench/prototypes/w12_pdl.py --out DIR [--ms 1 32] [--rounds 3]

For the Qwen3-8B and -32B decoder projections (no lm_heads) at the given M, with the tuned config
of each row, times in CUDA graphs over rotating weight sets (as bench/w12_kernels.py does):
- back to back: cuBLAS (`F.linear`); W12 as shipped; W12 + prefetch (each row of the program's
  first PREFETCH K steps asked of L2 with one bulk prefetch before anything else); W12 + PDL
  (launched with programmatic dependent launch, `griddepcontrol.wait` at the top); W12 + PDL +
  prefetch (the prefetch runs before the wait, so it overlaps the previous kernel's end);
- after a producer: each call preceded by an elementwise kernel that writes x (as an RMSNorm
  would in a decoder layer; not PDL-aware), for cuBLAS, W12 and W12 + PDL + prefetch, and the
  producer alone. This is the context the engine runs them in: back to back, PDL would also let
  W12 kernels overlap one another, which no decoder layer does.
Every arm's output is checked bit-identical to W12 as shipped. Rounds rotate the arm order; each
arm reports its fastest round. Writes OUT/w12_pdl.json and OUT/w12_pdl.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

PREFETCH = 4


def w12_arm(x, sets, cfg, prefetch: int, pdl: bool, producer=None):
    def call(w):
        if producer is not None:
            producer()
        gemm_mod.AB.update(prefetch=prefetch, pdl=pdl)
        try:
            return gemm_mod.gemm(x, w, cfg)
        finally:
            gemm_mod.AB.update(prefetch=0, pdl=False)
    return [lambda w=w: call(w) for w in sets]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    data = {"meta": {**environment(), "prefetch_steps": PREFETCH, "ms": args.ms}, "rows": []}
    for model in MODELS:
        for proj, N, K in model.projections():
            if proj == "lm_head":
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                src = x.clone()
                producer = lambda: torch.add(src, 0.0, out=x)  # noqa: E731 - writes x, as a norm would
                cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                ref = gemm_mod.gemm(x, sets[0], cfg)
                same = {}
                for label, pf, pdl in (("prefetch", PREFETCH, False), ("pdl", 0, True), ("pdl+prefetch", PREFETCH, True)):
                    y = w12_arm(x, sets[:1], cfg, pf, pdl)[0]()
                    same[label] = bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
                arms = {
                    "cublas": [lambda d=d: F.linear(x, d) for d in dense],
                    "w12": w12_arm(x, sets, cfg, 0, False),
                    "w12 prefetch": w12_arm(x, sets, cfg, PREFETCH, False),
                    "w12 pdl": w12_arm(x, sets, cfg, 0, True),
                    "w12 pdl+prefetch": w12_arm(x, sets, cfg, PREFETCH, True),
                    "producer": [producer] * len(sets),
                    "producer + cublas": [lambda d=d: (producer(), F.linear(x, d)) for d in dense],
                    "producer + w12": w12_arm(x, sets, cfg, 0, False, producer),
                    "producer + w12 pdl+prefetch": w12_arm(x, sets, cfg, PREFETCH, True, producer),
                }
                keys = list(arms)
                runs = {k: [] for k in keys}
                warm_clocks()
                for r in range(args.rounds):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        runs[k].append(graph_time_us(arms[k]))
                best = {k: min(v) for k, v in runs.items()}
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                       "bit_identical": same, "us": best, "runs": runs}
                data["rows"].append(row)
                print(json.dumps({k: row[k] for k in ("model", "proj", "M", "config", "bit_identical")}),
                      {k: round(v, 2) for k, v in best.items()}, flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_pdl.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "w12_pdl.md").write_text(render(data))
    print(render(data))
    return 0


def render(data: dict) -> str:
    m = data["meta"]
    lines = [f"# W12 GEMM: L2 prefetch and programmatic dependent launch (bench/prototypes/w12_pdl.py)", "",
             f"- {m['date']}, {m['gpu']}, torch {m['torch']}, triton {m['triton']}, commit {m['git_commit']}",
             f"- prefetch: the first {m['prefetch_steps']} K steps of each row; µs per call, fastest of the rounds",
             "", "| model | proj | M | config | cuBLAS | W12 | +prefetch | +PDL | +PDL+prefetch | W12/cuBLAS | "
             "+PDL+prefetch/cuBLAS | producer | prod+cuBLAS | prod+W12 | prod+W12 PDL+pf | in context: W12 | PDL+pf | bit-identical |",
             "|" + "---|" * 18]
    for r in data["rows"]:
        u = r["us"]
        pc, pw, pp = u["producer + cublas"], u["producer + w12"], u["producer + w12 pdl+prefetch"]
        lines.append(
            f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {u['cublas']:.2f} | {u['w12']:.2f} | "
            f"{u['w12 prefetch']:.2f} | {u['w12 pdl']:.2f} | {u['w12 pdl+prefetch']:.2f} | "
            f"{u['cublas'] / u['w12']:.3f} | {u['cublas'] / u['w12 pdl+prefetch']:.3f} | {u['producer']:.2f} | "
            f"{pc:.2f} | {pw:.2f} | {pp:.2f} | {(pc - u['producer']) / (pw - u['producer']):.3f} | "
            f"{(pc - u['producer']) / (pp - u['producer']):.3f} | {all(r['bit_identical'].values())} |")
    lines += ["", "In context: (producer + cuBLAS - producer) / (producer + W12 arm - producer), the projection's "
              "share of a producer-then-projection pair, as a speedup over cuBLAS's."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
