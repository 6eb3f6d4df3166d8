"""Prototype: the shipped tuned configs that gather escapes from a transposed x (`gather_t`), timed
across their whole M bucket (GPU only).

    python bench/prototypes/w12_bucket_span.py --out DIR

Why: the tuned table is keyed by M bucket (next power of two) and each bucket's config was swept
at the bucket's bound only. `w12_p1_m32.py --only Qwen3-8B/lm_head` (bench/results/w12/
w12_p1_m32_bucket.md) found the shipped M=32 config of the 8B lm_head, a gather_t one, 21% slower
at M = 20 than at 32 (291.4 against 240.5 µs) while a config without it held 233-244 µs across
17-32. This times every gather_t entry of the shipped table at five M values of its bucket: as
shipped, the same with gather_t off, and (bucket 32) the one-per-SM candidate. Every arm is
checked against the float64 reference within `error_bound`. Writes OUT/w12_bucket_span.json, .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
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

CANDIDATE_32 = LaunchConfig(KernelPath.GEMM, 64, 256, num_warps=4, num_stages=3, programs_per_sm=1, fit_wave=True,
                            tma=True, tma_x=True)


def span(bucket: int) -> list[int]:
    """Five row counts of the bucket (bucket/2, bucket]."""
    lo = bucket // 2
    return sorted({lo + 1, lo + bucket // 8, lo + bucket // 4, lo + 3 * bucket // 8, bucket})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--x-arms", action="store_true",
                   help="instead of gather_t off and the candidate: the shipped config with x's tiles by plain loads "
                        "(tma_x off), and with x padded with zero rows to the kernel's block of rows (sliced after)")
    p.add_argument("--all-tma-x", action="store_true",
                   help="instead: every tuned entry with x by TMA (W12 and BF16), four M of its bucket below its bound, "
                        "with x's box as `tma.x_descriptor` now decides against always (the first code, patched in)")
    p.add_argument("--render-x", type=Path, metavar="JSON",
                   help="no GPU: write OUT/w12_bucket_span_x.md from an --x-arms run's JSON (the run at 525a9da wrote "
                        "the JSON only)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render_x:
        (args.out / "w12_bucket_span_x.md").write_text(render_x(json.loads(args.render_x.read_text())))
        return 0
    data = {"meta": environment(), "rows": []}
    if args.all_tma_x:
        return all_tma_x(args, data)
    name = torch.cuda.get_device_name()
    table = kc.tuned_table(kc.device_slug(name))
    names = {(N, K): (shape.name, proj) for shape in MODELS for proj, N, K in shape.projections()}
    entries = sorted((m, n, k) for (fmt, m, n, k), c in table.items() if fmt == "w12" and c.gather_t)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for m, n, k in entries:
        by_shape.setdefault((n, k), []).append(m)
    for (N, K), buckets in by_shape.items():
        model, proj = names.get((N, K), ("?", "?"))
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        for bucket in buckets:
            for M in span(bucket):
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                exact, bound = error_bound(x, sets[0], torch.bfloat16)
                shipped = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                plans = {"shipped": shipped}
                if args.x_arms:
                    plans["shipped, tma_x off"] = replace(shipped, tma_x=False)
                    plans["shipped, x padded"] = shipped
                else:
                    plans["shipped, gather_t off"] = replace(shipped, gather_t=False)
                    if bucket == 32:
                        plans["candidate " + CANDIDATE_32.label()] = CANDIDATE_32
                arms, errors = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}, {}
                bm = kc.block_m(KernelPath.GEMM, M)
                for tag, cfg in plans.items():
                    try:
                        if tag.endswith("x padded"):
                            def call(w, c=cfg, bm=bm):  # pad x with zero rows to the kernel's block, slice y
                                xp = torch.zeros(bm, K, device="cuda", dtype=x.dtype)
                                xp[:M] = x
                                return gemm_mod.gemm(xp, w, c)[:M]
                            y = call(sets[0])
                            errors[tag] = float(((y.double() - exact).abs() / bound).max())
                            arms[tag] = [lambda w=w, f=call: f(w) for w in sets]
                            continue
                        y = gemm_mod.gemm(x, sets[0], cfg)
                        errors[tag] = float(((y.double() - exact).abs() / bound).max())
                        arms[tag] = [lambda w=w, c=cfg: gemm_mod.gemm(x, w, c) for w in sets]
                    except Exception as err:  # noqa: BLE001 - report and go on
                        errors[tag] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                u, runs = rotated_rounds(arms)
                data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "bucket": bucket, "M": M, "us": u,
                                     "runs": runs, "error_over_bound": errors, "shipped": shipped.label()})
                print(model, proj, bucket, M, {k: round(v, 2) for k, v in u.items()}, errors, flush=True)
                del exact, bound
        del sets, dense
        torch.cuda.empty_cache()
    if args.x_arms:
        (args.out / "w12_bucket_span_x.json").write_text(json.dumps(data, indent=1) + "\n")
        (args.out / "w12_bucket_span_x.md").write_text(render_x(data))
        return 0
    (args.out / "w12_bucket_span.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Shipped gather_t configs across their M bucket (bench/prototypes/w12_bucket_span.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of 3 "
             "rotated rounds over rotating weight sets, escapes on; ratio = cuBLAS / arm", "",
             "| model | proj | bucket | M | cuBLAS | shipped | x | gather_t off | x | candidate | x | worst error / bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        cand = next((k for k in u if k.startswith("candidate")), None)
        worst = max((v for v in r["error_over_bound"].values() if isinstance(v, float)), default=float("nan"))
        cells = [f"{u[k]:.2f} | {u['cublas'] / u[k]:.3f}" if k in u else "- | -"
                 for k in ("shipped", "shipped, gather_t off", cand)]
        lines.append(f"| {r['model']} | {r['proj']} | {r['bucket']} | {r['M']} | {u['cublas']:.2f} | "
                     + " | ".join(cells) + f" | {worst:.3f} |")
    lines += ["", "shipped configs: " + "; ".join(sorted({f"{r['model']} {r['proj']} M<={r['bucket']}: {r['shipped']}"
                                                          for r in data["rows"]}))]
    (args.out / "w12_bucket_span.md").write_text("\n".join(lines) + "\n")
    return 0


def render_x(data: dict) -> str:
    """The Markdown table of an --x-arms run: x by TMA (as shipped), by plain loads, and padded."""
    m = data["meta"]
    lines = ["# Shipped tma_x configs across their M bucket: x by TMA, by plain loads, and padded "
             "(bench/prototypes/w12_bucket_span.py --x-arms)", "",
             f"- {m['date']}, {m['gpu']}, commit {m['git_commit']}; µs, fastest of 3 rotated rounds over rotating "
             "weight sets, escapes on; ratio = cuBLAS / arm",
             "- shipped: the bucket's tuned config (all five load x by TMA, `tmax`); tma_x off: the same config with "
             "x's tiles by masked loads; x padded: x copied into a zeroed [block_m, K] buffer first (two more small "
             "kernels inside the timed graph) and y sliced",
             "- box rows past x: block_m - M, the rows of x's TMA box that TMA fills with zeros", "",
             "| model | proj | bucket | M | box rows past x | cuBLAS | shipped | x | tma_x off | x | x padded | x | "
             "worst error / bound |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        worst = max(v for v in r["error_over_bound"].values() if isinstance(v, float))
        cells = " | ".join(f"{u[k]:.2f} | {u['cublas'] / u[k]:.3f}" for k in ("shipped", "shipped, tma_x off",
                                                                              "shipped, x padded"))
        lines.append(f"| {r['model']} | {r['proj']} | {r['bucket']} | {r['M']} | "
                     f"{kc.block_m(KernelPath.GEMM, r['M']) - r['M']} | {u['cublas']:.2f} | {cells} | {worst:.3f} |")
    lines += ["", "shipped configs: " + "; ".join(sorted({f"{r['model']} {r['proj']} M<={r['bucket']}: {r['shipped']}"
                                                          for r in data["rows"]}))]
    return "\n".join(lines) + "\n"


def _box_always(x, block_m, config):
    """`tma.x_descriptor` before it declined x with fewer rows than the box."""
    from specpilot.kernels import tma

    if not config.tma_x or x.element_size() != 2 or tma._no_tma(x):
        return None
    box = [block_m, config.block_k]
    return tma._descriptor(x, box) if tma._box_ok(x, box) else None


def all_tma_x(args, data) -> int:
    name = torch.cuda.get_device_name()
    table = kc.tuned_table(kc.device_slug(name))
    names = {(N, K): (shape.name, proj) for shape in MODELS for proj, N, K in shape.projections()}
    entries = sorted((n, k, m, fmt) for (fmt, m, n, k), c in table.items() if c.tma_x)
    fixed = gemm_mod.x_descriptor
    for N, K in dict.fromkeys((n, k) for n, k, _, _ in entries):
        model, proj = names.get((N, K), ("?", "?"))
        sets = {"w12": [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))],
                "dense": [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]}
        for n, k, bucket, fmt in entries:
            if (n, k) != (N, K):
                continue
            ws = sets[fmt]
            for M in span(bucket)[:-1]:  # at the bucket's bound the box fits: nothing changed there
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                cfg = kc.choose_config(kc.WeightFormat(fmt), M, N, K, name)
                exact, bound = error_bound(x, ws[0], torch.bfloat16)

                def call(w, always, c=cfg, x=x):
                    gemm_mod.x_descriptor = _box_always if always else fixed
                    try:
                        return gemm_mod.gemm(x, w, c)
                    finally:
                        gemm_mod.x_descriptor = fixed
                errors = {}
                for tag, always in (("x_descriptor now", False), ("box always", True)):
                    errors[tag] = float(((call(ws[0], always).double() - exact).abs() / bound).max())
                # the patch is applied while the graphs are captured: each arm replays its own launches
                arms = {"x_descriptor now": [lambda w=w: call(w, False) for w in ws],
                        "box always": [lambda w=w: call(w, True) for w in ws]}
                u, runs = rotated_rounds(arms)
                data["rows"].append({"model": model, "proj": proj, "format": fmt, "N": N, "K": K, "bucket": bucket,
                                     "M": M, "config": cfg.label(), "us": u, "runs": runs, "error_over_bound": errors})
                print(model, proj, fmt, bucket, M, cfg.label(), {k: round(v, 2) for k, v in u.items()}, flush=True)
                del exact, bound
        del sets
        torch.cuda.empty_cache()
    (args.out / "w12_tma_x_rule.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# x's TMA box as `tma.x_descriptor` decides, against always (bench/prototypes/w12_bucket_span.py "
             "--all-tma-x)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; every tuned entry "
             "with x by TMA, at the row counts of its bucket below the bound; µs, fastest of 3 rotated rounds; "
             "gain = always / now", "",
             "| model | proj | format | bucket | M | config | always | now | gain | worst error / bound |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    gains = []
    for r in data["rows"]:
        u = r["us"]
        g = u["box always"] / u["x_descriptor now"]
        gains.append(g)
        lines.append(f"| {r['model']} | {r['proj']} | {r['format']} | {r['bucket']} | {r['M']} | {r['config']} | "
                     f"{u['box always']:.2f} | {u['x_descriptor now']:.2f} | {g:.3f} | "
                     f"{max(r['error_over_bound'].values()):.3f} |")
    if gains:
        import math
        lines += ["", f"{len(gains)} rows: geometric-mean gain {math.exp(sum(map(math.log, gains)) / len(gains)):.3f}, "
                  f"worst {min(gains):.3f}, best {max(gains):.3f}; faster on {sum(g > 1.01 for g in gains)}, "
                  f"slower on {sum(g < 0.99 for g in gains)}, within 1% on the rest"]
    (args.out / "w12_tma_x_rule.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
