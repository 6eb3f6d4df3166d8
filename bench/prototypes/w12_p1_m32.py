"""Prototype: one-program-per-SM deep-ring Triton configs (n64 k256, 3-5 stages, weights and x by
TMA, K split so that one program per SM fills the GPU) against the shipped config at M = 32, every
projection, side by side with cuBLAS (GPU only).

    python bench/prototypes/w12_p1_m32.py --out DIR [--ms 32 24 17]

Why: `w12_ws.py --probe` (bench/results/w12/w12_ws_probe.md) timed the Triton kernel at n64 k256
s4 sk2 with weights and x by TMA on Qwen3-8B o at M = 32 at 11.99 µs with escapes, against 12.24
for the shipped config in the same run (cuBLAS 13.99). The sweep never timed that plan: the n64
k256 s4 tile's automatic split aims at two programs per SM, which its shared memory does not
allow, and the explicit splits are tried only near a row's fastest. This runs the plan (and its
neighbours) on every projection before any tuned-table change. The split is the automatic one
for one program per SM rounded down (`p1 fw`): rounded up (the first run, at fb768af) it
overshot to a second wave, 16.7 µs on that row. Every arm is checked against the
float64 reference within `error_bound`. Writes OUT/w12_p1_m32.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

PLANS = ((256, 4, True), (256, 4, False), (256, 5, True), (256, 3, True))  # (block_k, stages, tma_x)


def candidates(M: int) -> list[LaunchConfig]:
    out = []
    for bk, st, tma_x in PLANS:
        out.append(LaunchConfig(KernelPath.GEMM, 64, bk, num_warps=4, num_stages=st, programs_per_sm=1, fit_wave=True,
                                tma=True, tma_x=tma_x and M >= kc.TMA_X_MIN_M))
    return list(dict.fromkeys(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[32])
    p.add_argument("--only", nargs="+", metavar="MODEL/PROJ", help="only these rows, e.g. Qwen3-8B/o")
    p.add_argument("--rounds", type=int, default=3, help="rotated timing rounds (fastest counts)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    name = torch.cuda.get_device_name()
    for shape in MODELS:
        model = shape.name
        for proj, N, K in shape.projections():
            if args.only and f"{model}/{proj}" not in args.only:
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                exact, bound = error_bound(x, sets[0], torch.bfloat16)
                shipped = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}
                labels, errors = {"shipped": shipped.label()}, {}
                for tag, cfg in [("shipped", shipped)] + [(c.label(), c) for c in candidates(M)]:
                    if tag != "shipped" and cfg == shipped:
                        continue
                    try:
                        y = gemm_mod.gemm(x, sets[0], cfg)
                        errors[tag] = float(((y.double() - exact).abs() / bound).max())
                        arms[tag] = [lambda w=w, c=cfg: gemm_mod.gemm(x, w, c) for w in sets]
                    except Exception as err:  # noqa: BLE001 - report and go on
                        errors[tag] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                u, runs = rotated_rounds(arms, args.rounds)
                data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "us": u, "runs": runs,
                                     "error_over_bound": errors, "labels": labels})
                best = min((k for k in u if k not in ("cublas", "shipped")), key=u.get)
                print(model, proj, M, "cublas %.2f shipped %.2f (%s) best %s %.2f" % (
                    u["cublas"], u["shipped"], shipped.label(), best, u[best]),
                    {k: round(v, 2) for k, v in u.items()}, "errors/bound:", errors, flush=True)
                del exact, bound
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_p1_m32.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# One-program-per-SM deep-ring Triton configs vs the shipped config (bench/prototypes/w12_p1_m32.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of "
             f"{args.rounds} rotated rounds over rotating weight sets, escapes on; ratio = cuBLAS / arm; p1: K split so that about "
             "one program per SM runs", "",
             "| model | proj | M | cuBLAS | shipped | shipped x | best candidate | µs | x | worst error / bound |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        cands = [k for k in u if k not in ("cublas", "shipped")]
        best = min(cands, key=u.get)
        worst = max((v for v in r["error_over_bound"].values() if isinstance(v, float)), default=float("nan"))
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | {u['shipped']:.2f} "
                     f"({r['labels']['shipped']}) | {u['cublas'] / u['shipped']:.3f} | {best} | {u[best]:.2f} | "
                     f"{u['cublas'] / u[best]:.3f} | {worst:.3f} |")
    (args.out / "w12_p1_m32.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
