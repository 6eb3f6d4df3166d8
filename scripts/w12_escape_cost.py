"""What the W12 GEMM's escape correction costs: the same kernel and config timed with and without it.

    python scripts/w12_escape_cost.py --out DIR

For a few Qwen3 projections at M = 1 and 32, with the config the dispatcher picks (the shipped
tuned table), times the W12 GEMM as it runs (escape blocks: the escapes added in the K loop), the
previous epilogue correction (16 CSR escapes per step after the loop), each first checked against
the reference within the error bound, and the kernel with the correction switched off
(`gemm(..., escapes="off")`: a wrong result, timed only), and cuBLAS (`F.linear` on the decoded
BF16 weights) for scale; on random
weights as in scripts/w12_kernels.py (~0.3-0.9 escapes per row) and with one more zero per row.
Same timing as that script (CUDA-graph replays over rotating weight sets, median), in three
rounds, each variant once per round in a rotated order; each keeps its fastest round. Writes OUT/w12_escape_cost.json
and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.w12_kernels import environment  # noqa: E402
from specpilot.kernels.configs import WeightFormat, choose_config  # noqa: E402
from specpilot.kernels.dispatch import device_name  # noqa: E402
from specpilot.kernels.gemm import gemm, plan_launch  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.kernels.timing import check_output, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.w12 import decode, encode  # noqa: E402

VARIANTS = [("blocks", {"escapes": "blocks"}), ("epilogue", {"escapes": "epilogue"}), ("off", {"escapes": "off"})]
ROUNDS = 3
SHAPES = [("Qwen3-8B", "qkv", 6144, 4096), ("Qwen3-8B", "down", 4096, 12288), ("Qwen3-8B", "lm_head", 151936, 4096),
          ("Qwen3-32B", "gate_up", 51200, 5120)]


def launch_blocks(weight, x, cfg):
    """The escape blocks a launch of `cfg` on `weight` uses."""
    return plan_launch(x, weight, cfg, escapes="blocks")[2]


def empty_blocks(weight, x, cfg):
    """A copy of `weight` (same planes) whose escape blocks for `cfg` are all padding: a wrong
    result, timed only -- what the blocks' code costs without its loads of x."""
    from dataclasses import replace

    copy = type(weight).from_planes(weight.shape, weight.planes())
    blocks = launch_blocks(copy, x, cfg)  # cached on the copy, where the launch will find it
    for key, cached in list(copy.derived.items()):
        if cached is blocks:
            copy.derived[key] = replace(blocks, values=torch.zeros_like(blocks.values))
    return copy


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    meta = environment()
    rows = []
    for model, proj, N, K in SHAPES:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dirty = []
        for w in sets:
            d = decode(w)
            d[torch.arange(N, device="cuda"), torch.randint(0, K, (N,), device="cuda")] = 0.0
            dirty.append(encode(d))
        dense = {"random": [decode(w) for w in sets], "plus_one_zero_per_row": [decode(w) for w in dirty]}
        for M in (1, 32):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            cfg = choose_config(WeightFormat.W12, M, N, K, device_name(x.device))
            row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label()}
            for name, ws in (("random", sets), ("plus_one_zero_per_row", dirty)):
                exact, bound = error_bound(x, ws[0], x.dtype)
                warm_clocks()
                timed = {}
                for label, kw in VARIANTS:
                    if kw["escapes"] != "off":
                        worst = check_output(gemm(x, ws[0], cfg, **kw), x, ws[0], exact, bound)
                        if worst > 1.0:
                            timed[label] = {"error": f"{worst:.3g}x the error bound"}
                # ROUNDS rounds, each in another order (clocks drift over a run): the fastest is kept
                arms = [(label, [lambda w=w, kw=kw: gemm(x, w, cfg, **kw) for w in ws]) for label, kw in VARIANTS]
                arms.append(("cublas", [lambda d=d: F.linear(x, d) for d in dense[name]]))
                # the blocks' code on the same weights with every entry padding: no gather traffic
                empty = [empty_blocks(w, x, cfg) for w in ws]
                arms.append(("blocks_empty", [lambda w=w: gemm(x, w, cfg, escapes="blocks") for w in empty]))
                for r in range(ROUNDS):
                    for label, calls in arms[r % len(arms):] + arms[:r % len(arms)]:
                        if "error" not in timed.get(label, {}):
                            timed.setdefault(label, {"runs": []})["runs"].append(graph_time_us(calls))
                for d in timed.values():
                    if "runs" in d:
                        d["us"] = min(d["runs"])
                blocks = launch_blocks(ws[0], x, cfg)
                row[name] = {"escapes_per_row": ws[0].num_escapes / N, "slot": blocks.slot,
                             "block_bytes_share": blocks.nbytes / ws[0].nbytes_total, **timed}
                del exact, bound
            rows.append(row)
            print(json.dumps(row), flush=True)
        del sets, dirty, dense
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "w12_escape_cost.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    names = [label for label, _ in VARIANTS]
    lines = ["# W12 GEMM: cost of the escape correction", "",
             f"- {meta['date']} · {meta['gpu']} · triton {meta['triton']} · commit {meta['git_commit']}",
             "- µs per call; `blocks` is the default (entries loaded before the K loop, added after it), "
             "`epilogue` the CSR correction after the loop; `off` skips the correction (wrong result, timed "
             "only); slot = entries per (row block, K split); block bytes = escape blocks / W12 planes", "",
             "| shape | M | config | weights | escapes/row | slot | block bytes | " + " | ".join(names)
             + " | cuBLAS | blocks, all padding | blocks vs off | epilogue vs off | cuBLAS / blocks |",
             "|---|---|---|---|---|---|---|" + "---|" * (len(names) + 5)]
    for r in rows:
        for kind in ("random", "plus_one_zero_per_row"):
            d = r[kind]
            cells = [f"{d[n]['us']:.2f}" if "us" in d[n] else d[n]["error"] for n in names]
            cost = [d[n]["us"] / d["off"]["us"] - 1 if "us" in d[n] else float("nan") for n in ("blocks", "epilogue")]
            lines.append(f"| {r['model']} {r['proj']} {r['N']}x{r['K']} | {r['M']} | {r['config']} | {kind} "
                         f"| {d['escapes_per_row']:.2f} | {d['slot']} | {d['block_bytes_share']:.2%} | "
                         + " | ".join(cells) + f" | {d['cublas']['us']:.2f} | {d['blocks_empty']['us']:.2f} "
                         f"| {cost[0]:+.1%} | {cost[1]:+.1%} "
                         f"| {d['cublas']['us'] / d['blocks']['us']:.3f} |")
    (args.out / "w12_escape_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
