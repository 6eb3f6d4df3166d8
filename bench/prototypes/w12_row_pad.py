"""Prototype: the W12 planes with their rows padded in memory (a row stride of Kp + PAD bytes in
the lo plane and Kp/2 + PAD/2 in the hi plane), at the shipped configs (GPU only).

    python bench/prototypes/w12_row_pad.py --out DIR [--pads 128 256 512]

Why: at M=32 the W12 GEMM's warps wait on their TMA weight tiles while DRAM is half busy
(bench/results/w12/ncu_stalls_8b_qkv_m32.md), and putting more requests in flight made it slower
(w12_l2_prefetch.md). A K step reads 64 rows x 128 bytes (lo) and 64 x 64 bytes (hi) whose row
stride is a power of two on the 4096-column projections (4096 and 2048 bytes): if the address
hashing maps such rows onto few memory channels or L2 slices, they queue there. Padding the stride
spreads them; only the addresses change, so the output must be bit-identical. The planes are
re-strided by hand here (W12Weight keeps contiguous planes); the kernels take any 16-byte-aligned
row stride.

Per row: cuBLAS, the shipped config on the shipped layout, and on each padded one, fastest of 3
rotated rounds; M=1 rows run the GEMV where the shipped table picks it. Writes
OUT/w12_row_pad.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

ROWS = [("Qwen3-8B", "qkv", 32), ("Qwen3-8B", "o", 32), ("Qwen3-32B", "qkv", 32), ("Qwen3-8B", "gate_up", 32),
        ("Qwen3-8B", "qkv", 16), ("Qwen3-8B", "qkv", 1), ("Qwen3-8B", "down", 1), ("Qwen3-8B", "gate_up", 1),
        ("Qwen3-8B", "down", 32), ("Qwen3-32B", "o", 32)]


def padded(w, pad: int):
    """`w` with its lo rows `pad` bytes apart beyond Kp and its hi rows pad / 2 (same values)."""
    if pad == 0:
        return w
    out = copy.copy(w)  # the frozen planes replaced below, past W12Weight's contiguity check
    for name, extra in (("lo", pad), ("hi", pad // 2)):
        t = getattr(w, name)
        big = torch.empty(t.shape[0], t.shape[1] + extra, dtype=t.dtype, device=t.device)
        big[:, : t.shape[1]] = t
        object.__setattr__(out, name, big[:, : t.shape[1]])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pads", type=int, nargs="+", default=[128, 256, 512])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "pads": args.pads, "rows": []}
    gpu = torch.cuda.get_device_name()
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    for model, proj, M in ROWS:
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
        ref = run_config(x, sets[0], cfg)
        row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(), "identical": {},
               "strides": {}}
        arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                "shipped": [lambda w=w: run_config(x, w, cfg) for w in sets]}
        for pad in args.pads:
            views = [padded(w, pad) for w in sets]
            row["strides"][pad] = [views[0].lo.stride(0), views[0].hi.stride(0)]
            row["identical"][pad] = torch.equal(run_config(x, views[0], cfg).view(torch.int16), ref.view(torch.int16))
            arms[f"pad {pad}"] = [lambda w=w: run_config(x, w, cfg) for w in views]
        row["us"], row["runs"] = rotated_rounds(arms)
        data["rows"].append(row)
        print(model, proj, M, cfg.label(), {k: round(v, 2) for k, v in row["us"].items()}, row["identical"], flush=True)
        (args.out / "w12_row_pad.json").write_text(json.dumps(data, indent=1) + "\n")
        del sets, dense, ref, arms
        torch.cuda.empty_cache()
    lines = ["# W12 planes with padded row strides (bench/prototypes/w12_row_pad.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs per call, "
             "fastest of 3 rotated rounds, escapes on, the shipped config of each row; pad = extra bytes per lo row "
             "(half that per hi row)", "",
             "| model | proj | M | config | cuBLAS | shipped | " + " | ".join(f"pad {d}" for d in args.pads)
             + " | best / shipped | bit-identical |",
             "|---|---|---|---|---|---|" + "---|" * len(args.pads) + "---|---|"]
    for r in data["rows"]:
        u = r["us"]
        best = min(u[f"pad {d}"] for d in args.pads)
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {u['cublas']:.2f} | {u['shipped']:.2f} | "
                     + " | ".join(f"{u[f'pad {d}']:.2f}" for d in args.pads)
                     + f" | {u['shipped'] / best:.3f}x | {all(r['identical'].values())} |")
    (args.out / "w12_row_pad.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
