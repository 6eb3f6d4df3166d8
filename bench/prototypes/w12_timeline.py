"""Where a W12 GEMM call's time goes, program by program: %globaltimer stamps from inside the kernel.

    python bench/prototypes/w12_timeline.py --out DIR

Why: at M=1 the small projections (qkv, o) lose 5-7 µs per call beyond streaming their bytes at
the rate the lm_heads reach, and the same-grid BF16 kernel loses less (bench/results/w12/
w12_kernels.md). Nsight Compute gives totals; this gives each program's start, the moment its K
loop was done (the latest thread), its end (after its output store) and its SM, from the temporary
switch `gemm.AB["timeline"]`. Arms per shape, the same tuned W12 config throughout: W12, W12 with
escapes off (wrong results, timed only), and our BF16 kernel on plain weights; plus cuBLAS for the
per-call time. Each arm runs back to back in a CUDA graph over rotating weight sets, as in the
sweep; the stamps are the last call's. Writes OUT/w12_timeline.json (raw stamps, ns from the
call's first start) and .md (summary).
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

SHAPES = (("Qwen3-32B", "qkv", 10240, 5120, 1), ("Qwen3-8B", "qkv", 6144, 4096, 1), ("Qwen3-8B", "o", 4096, 4096, 1),
          ("Qwen3-8B", "gate_up", 24576, 4096, 1), ("Qwen3-32B", "gate_up", 51200, 5120, 1),
          ("Qwen3-8B", "o", 4096, 4096, 32), ("Qwen3-32B", "down", 5120, 25600, 32))


def stamps(calls, n_programs: int) -> list[list[int]]:
    """[start, loop done, end, sm] per program of the last of `calls` replayed in a CUDA graph."""
    buf = torch.zeros(n_programs, 4, dtype=torch.int64, device="cuda")
    gemm_mod.AB["timeline"] = buf
    try:
        graph_time_us(calls, passes=2, replays=3)
    finally:
        gemm_mod.AB.clear()
    return buf.tolist()


def summary(rows: list[list[int]]) -> dict:
    t0 = min(r[0] for r in rows)
    start = [r[0] - t0 for r in rows]
    loop = [r[1] - r[0] for r in rows]
    tail = [r[2] - r[1] for r in rows]
    end = [r[2] - t0 for r in rows]
    by_sm: dict[int, list[int]] = {}
    for r in rows:
        by_sm.setdefault(r[3], []).append(r[2] - t0)
    last = sorted(max(v) for v in by_sm.values())
    counts = sorted(len(v) for v in by_sm.values())
    us = lambda v: round(v / 1e3, 3)  # noqa: E731
    return {"programs": len(rows), "sms_used": len(by_sm), "programs_per_sm": {c: counts.count(c) for c in set(counts)},
            "span_us": us(max(end)), "last_start_us": us(max(start)), "first_end_us": us(min(end)),
            "loop_us_median": us(statistics.median(loop)), "loop_us_max": us(max(loop)),
            "after_loop_us_median": us(statistics.median(tail)), "after_loop_us_max": us(max(tail)),
            "sm_last_end_us_min": us(last[0]), "sm_last_end_us_median": us(statistics.median(last)),
            "sm_last_end_us_max": us(last[-1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    data = {"meta": environment(), "rows": []}
    for model, proj, N, K, M in SHAPES:
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
        run, _, _ = gemm_mod.plan_launch(x, sets[0], cfg)
        n_programs = run.grid[0] * run.grid[1]
        arms = {"w12": [lambda w=w: gemm_mod.gemm(x, w, cfg) for w in sets],
                "w12 escapes off": [lambda w=w: gemm_mod.gemm(x, w, cfg, escapes="off") for w in sets],
                "bf16 kernel": [lambda d=d: gemm_mod.gemm(x, d, cfg) for d in dense]}
        warm_clocks()
        us = {"cublas": graph_time_us([lambda d=d: F.linear(x, d) for d in dense])}
        us.update({k: graph_time_us(v) for k, v in arms.items()})
        raw = {k: stamps(v, n_programs) for k, v in arms.items()}
        row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(), "grid": list(run.grid),
               "us": us, "summary": {k: summary(v) for k, v in raw.items()},
               "stamps_ns": {k: [[r[0] - min(q[0] for q in v), r[1] - r[0], r[2] - r[1], r[3]] for r in v]
                             for k, v in raw.items()}}
        data["rows"].append(row)
        print(model, proj, M, cfg.label(), {k: round(v, 2) for k, v in us.items()}, flush=True)
        for k, s in row["summary"].items():
            print("   ", k, s, flush=True)
        del sets, dense
        torch.cuda.empty_cache()
    (args.out / "w12_timeline.json").write_text(json.dumps(data) + "\n")
    cols = ["span_us", "last_start_us", "loop_us_median", "loop_us_max", "after_loop_us_median", "after_loop_us_max",
            "first_end_us", "sm_last_end_us_min", "sm_last_end_us_median", "sm_last_end_us_max"]
    lines = ["# W12 GEMM program timelines (bench/prototypes/w12_timeline.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; graph µs per call, "
             "then %globaltimer stamps of one call (µs from its first program's start)", "",
             "| model | proj | M | config | grid | arm | µs/call | programs/SM | " + " | ".join(cols) + " |",
             "|" + "---|" * (8 + len(cols))]
    for r in data["rows"]:
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r['grid']} | cublas | {r['us']['cublas']:.2f} |"
                     + " |" * (1 + len(cols)))
        for k, s in r["summary"].items():
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r['grid']} | {k} | {r['us'][k]:.2f} | "
                         f"{s['programs_per_sm']} | " + " | ".join(str(s[c]) for c in cols) + " |")
    (args.out / "w12_timeline.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
