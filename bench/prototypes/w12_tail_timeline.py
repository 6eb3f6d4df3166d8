"""Why the tail split was slow (bench/results/w12/w12_tail_split.md): per-program %globaltimer stamps
of the tuned standard grid and of the tail-split grids, on the rows where it lost most.

    python bench/prototypes/w12_tail_timeline.py --out DIR

Uses the temporary switches `gemm.AB["tail"]` and `gemm.AB["timeline"]`. Writes
OUT/w12_tail_timeline.json (raw stamps, ns) and .md (summary per arm).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import environment, graph_time_us, random_weight, warm_clocks, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROWS = (("Qwen3-32B", "qkv", 10240, 5120, 1, ((132, 2), (132, 5))), ("Qwen3-8B", "gate_up", 24576, 4096, 1, ((264, 2),)))


def run_arm(x, sets, cfg, tail, n_programs):
    def call(w):
        return gemm_mod.gemm(x, w, cfg)
    calls = [lambda w=w: call(w) for w in sets]
    gemm_mod.AB.clear()
    if tail:
        gemm_mod.AB["tail"] = tail
    try:
        us = graph_time_us(calls)
        buf = torch.zeros(n_programs, 4, dtype=torch.int64, device="cuda")
        gemm_mod.AB["timeline"] = buf
        graph_time_us(calls, passes=2, replays=3)
    finally:
        gemm_mod.AB.clear()
    return us, buf.tolist()


def summary(rows):
    t0 = min(r[0] for r in rows)
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r[3], []).append(r)
    counts = [len(v) for v in by_sm.values()]
    last = sorted(max(q[2] for q in v) - t0 for v in by_sm.values())
    dur = [r[2] - r[0] for r in rows]
    us = lambda v: round(v / 1e3, 3)  # noqa: E731
    return {"programs": len(rows), "sms_used": len(by_sm), "programs_per_sm": {c: counts.count(c) for c in sorted(set(counts))},
            "span_us": us(max(r[2] for r in rows) - t0), "last_start_us": us(max(r[0] for r in rows) - t0),
            "duration_us_median": us(statistics.median(dur)), "duration_us_max": us(max(dur)),
            "sm_last_end_us": [us(last[0]), us(statistics.median(last)), us(last[-1])],
            "max_concurrent_per_sm": max(max(sum(1 for q in v if q[0] <= r[0] < q[2]) for r in v) for v in by_sm.values())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    data = {"meta": environment(), "rows": []}
    for model, proj, N, K, M, tails in ROWS:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
        run, _, _ = gemm_mod.plan_launch(x, sets[0], cfg)
        tiles = run.grid[0]
        warm_clocks()
        row = {"model": model, "proj": proj, "M": M, "config": cfg.label(), "grid": list(run.grid),
               "cublas_us": graph_time_us([lambda d=d: F.linear(x, d) for d in dense]), "arms": {}}
        for tail in (None,) + tails:
            if tail is None:
                n = run.grid[0] * run.grid[1]
            else:
                k_steps = -(-run.ops.Kp // cfg.block_k)
                steps2 = -(-k_steps // tail[1])
                n = tail[0] + (tiles - tail[0]) * -(-k_steps // steps2)
            us, raw = run_arm(x, sets, cfg, tail, n)
            label = "standard" if tail is None else f"tail t0={tail[0]} s2={tail[1]}"
            t0 = min(r[0] for r in raw)
            row["arms"][label] = {"us": us, "summary": summary(raw),
                                  "stamps_ns": [[r[0] - t0, r[1] - r[0], r[2] - r[1], r[3]] for r in raw]}
            print(model, proj, M, label, "%.2f µs" % us, row["arms"][label]["summary"], flush=True)
        data["rows"].append(row)
        del sets, dense
        torch.cuda.empty_cache()
    (args.out / "w12_tail_timeline.json").write_text(json.dumps(data) + "\n")
    lines = ["# Tail-split grids vs the standard grid, per-program timelines (bench/prototypes/w12_tail_timeline.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}", "",
             "| model | proj | M | config | cuBLAS µs | arm | µs/call | summary |", "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        for k, a in r["arms"].items():
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r['cublas_us']:.2f} | {k} | {a['us']:.2f} | {a['summary']} |")
    (args.out / "w12_tail_timeline.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
