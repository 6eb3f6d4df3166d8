"""A/B: split only the last, partial wave of row tiles along K (temporary switch `gemm.AB["tail"]`).

    python bench/prototypes/w12_tail_split.py --out DIR [--ms 1 16 32]

Why: in-kernel timelines (bench/results/w12/w12_timeline.md) show the standard grid's SMs ending
their last program far apart when the row tiles do not fill whole waves: Qwen3-32B qkv has 160
tiles of 64 rows for 132 SMs, so 28 SMs run two and end 4.3 µs after the median one. A flat
stream-K balanced that but cost 4% per K step (w12_stream_flat.md). Here the kernel and its loop
stay as they are; only the grid changes: the first t0 = W x SMs tiles (W whole waves) run whole,
one program each, and the R remaining tiles are split s2 ways along K (s2 ~ SMs / R), so the
leftover work spreads over every SM as short programs beside the long ones, reduced as split-K.
For each Qwen3-8B/-32B projection with at least one whole wave of tiles and a remainder, at the
given M: cuBLAS, the tuned config, and the tuned config with a few (t0, s2); outputs checked
against the reference bound; CUDA graphs over rotating weight sets, three rotated rounds.
Writes OUT/w12_tail_split.json and .md.
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
from specpilot.w12.layout import padded_columns  # noqa: E402


def tail_plans(tiles: int, k_steps: int, sms: int) -> list[tuple[int, int]]:
    waves, rest = divmod(tiles, sms)
    if waves < 1 or rest == 0:
        return []
    t0 = waves * sms
    cap = min(kc.MAX_SPLIT_K, k_steps // 2)
    splits = {min(cap, s) for s in (round(sms / rest), -(-2 * sms // rest), 2)}
    return [(t0, s) for s in sorted(splits) if s >= 2]


def arm(x, sets, cfg, tail=None):
    def call(w):
        if tail is not None:
            gemm_mod.AB["tail"] = tail
        try:
            return gemm_mod.gemm(x, w, cfg)
        finally:
            gemm_mod.AB.clear()
    return [lambda w=w: call(w) for w in sets]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    data = {"meta": environment(), "rows": []}
    for model in MODELS:
        for proj, N, K in model.projections():
            todo = []
            for M in args.ms:
                cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                plans = [] if cfg.gather_t else tail_plans(-(-N // cfg.block_n), -(-padded_columns(K) // cfg.block_k), sms)
                if plans:
                    todo.append((M, cfg, plans))
            if not todo:
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M, cfg, plans in todo:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense], "tuned": arm(x, sets, cfg)}
                errors = {}
                for t0, s2 in plans:
                    label = f"tail t0={t0} s2={s2}"
                    arms[label] = arm(x, sets, cfg, (t0, s2))
                    errors[label] = check_output(arms[label][0](), x, sets[0])
                keys = list(arms)
                runs = {k: [] for k in keys}
                warm_clocks()
                for r in range(3):
                    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                        runs[k].append(graph_time_us(arms[k]))
                u = {k: min(v) for k, v in runs.items()}
                best = min((k for k in u if k.startswith("tail")), key=u.get)
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                       "tiles": -(-N // cfg.block_n), "us": u, "runs": runs, "error_over_bound": errors, "best_tail": best}
                data["rows"].append(row)
                print(model.name, proj, M, cfg.label(), {k: round(v, 2) for k, v in u.items()},
                      "tuned %.3f best %s %.3f" % (u["cublas"] / u["tuned"], best, u["cublas"] / u[best]),
                      "worst err %.3f" % max(errors.values()), flush=True)
            del sets, dense
            torch.cuda.empty_cache()
    (args.out / "w12_tail_split.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Splitting only the last partial wave of row tiles (bench/prototypes/w12_tail_split.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs, fastest of 3 rotated "
             "rounds; x = cuBLAS / arm", "",
             "| model | proj | M | tuned config | row tiles | cuBLAS | tuned | x | tail variants (µs) | best tail | x | worst error / bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        tails = "; ".join(f"{k[5:]}: {v:.2f}" for k, v in u.items() if k.startswith("tail"))
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {r['tiles']} | {u['cublas']:.2f} | {u['tuned']:.2f} | "
                     f"{u['cublas'] / u['tuned']:.3f} | {tails} | {r['best_tail'][5:]} | {u['cublas'] / u[r['best_tail']]:.3f} | "
                     f"{max(r['error_over_bound'].values()):.3f} |")
    (args.out / "w12_tail_split.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
