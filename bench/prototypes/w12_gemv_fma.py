"""Prototype: the GEMV path with codes FMA'd against x at their own columns (no reordering of the
decoded tile), against cuBLAS and the tuned tensor-core GEMM at M = 1 and 2, and the floor a plain
streaming read of the same bytes sets (GPU only).

    python bench/prototypes/w12_gemv_fma.py --out DIR [--budget-s 300] [--ms 1 2]
        [--tiles N,K,W,S ...] [--only Qwen3-8B:qkv ...] [--no-floor]

Why: at M = 1 the small projections (qkv, o) lose 3-6 µs per call to split-K reductions and an
uneven last wave of 64-row GEMM tiles; FMA tiles of 8-32 rows give every SM an even share with no
split. The old GEMV reordered each decoded tile into column order through shared memory (5.1
instructions per W12 weight); this one keeps it in registers (~4 on sm_90, `aot --sass`), with
W12 escapes added from escape blocks loaded before the K loop (the GEMM's scheme; since 7bcb8f8 a
slab of at most G entries goes straight into the accumulators) instead of the CSR correction after
it (three dependent loads at the end of every program; phase B times the fastest config with that
epilogue, and with escapes off, as a bound; the 7bcb8f8 run, w12_gemv_in_acc.md, also timed the
previous one-hot sum through a temporary switch). Earlier runs of this script
also tried a register prefetch of the next K step and W12 groups by TMA: both slower (results
files). Phase A times each candidate below once (after the reference check of
`bench/w12_kernels.time_config`), then the three fastest with programs_per_sm 1 and 4 (how finely K is split when row tiles are few). Phase B times cuBLAS,
the shipped tuned config of each format and the two fastest GEMV configs side by side: fastest of
3 rotated rounds. At the first M, the fastest of six plain read kernels over the W12 and the BF16
bytes of each projection gives the cost of just streaming them in one launch. Writes
OUT/w12_gemv_fma.json and .md. Not a tuned table: a look before the sweep takes these tiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.w12_kernels import (L2_COVER_BYTES, MODELS, environment, graph_time_us, random_weight,  # noqa: E402
                               rotated_rounds, time_config, weight_sets)
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.kernels.gemv import gemv as gemv_fn  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

TILES = {  # M -> (block_n, block_k, num_warps, num_stages)
    1: ((8, 1024, 2, 1), (16, 1024, 4, 1), (32, 512, 4, 1), (16, 512, 4, 1), (8, 512, 2, 1), (32, 1024, 8, 1)),
    2: ((8, 1024, 2, 1), (16, 1024, 4, 1), (32, 512, 4, 1), (16, 512, 4, 1)),
}
READ_VARIANTS = ((1024, 8, 4), (2048, 4, 4), (2048, 8, 4), (4096, 4, 8), (4096, 8, 8), (2048, 16, 8))  # (words, iters, warps)


@triton.jit
def _read(src, out, n_words, WORDS: tl.constexpr, ITERS: tl.constexpr):
    """Program p xors words [p * WORDS * ITERS, (p + 1) * WORDS * ITERS) of src (all loads issued unrolled)."""
    base = tl.program_id(0) * WORDS * ITERS
    acc = tl.zeros([WORDS], tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * WORDS + tl.arange(0, WORDS)
        acc ^= tl.load(src + offs, mask=offs < n_words, other=0)
    tl.store(out + tl.program_id(0), tl.xor_sum(acc, 0))


def read_floor(nbytes: int) -> dict:
    """The fastest of READ_VARIANTS at reading `nbytes` once (rotating buffers, graph-timed): what a
    plain streaming kernel of this size costs, launch, ramp and tail included."""
    words = nbytes // 4
    bufs = [torch.randint(-2**31, 2**31 - 1, (words,), device="cuda", dtype=torch.int32)
            for _ in range(max(4, math.ceil(L2_COVER_BYTES / nbytes)))]
    out = torch.empty(words // 1024 + 1, device="cuda", dtype=torch.int32)
    best = {}
    for w, it, nw in READ_VARIANTS:
        grid = (triton.cdiv(words, w * it),)
        us = graph_time_us([lambda b=b: _read[grid](b, out, words, WORDS=w, ITERS=it, num_warps=nw) for b in bufs])
        if not best or us < best["us"]:
            best = {"us": us, "variant": f"{w} words x {it}, {nw} warps"}
    del bufs
    return best


def gemv(n, k, w, s, p=2) -> LaunchConfig:
    return LaunchConfig(KernelPath.GEMV, block_n=n, block_k=k, num_warps=w, num_stages=s, programs_per_sm=p)


def fastest(tried: list[dict], n: int) -> list[LaunchConfig]:
    timed = sorted((t for t in tried if "us" in t), key=lambda t: t["us"])
    return [LaunchConfig.from_dict(t["config"]) for t in timed[:n]]


def phase_a(x, sets, M, exact, bound) -> list[dict]:
    tried = [time_config(x, sets, gemv(*t), exact, bound) for t in TILES[M]]
    more = [dataclasses.replace(c, programs_per_sm=p) for c in fastest(tried, 3) for p in (1, 4)]
    return tried + [time_config(x, sets, c, exact, bound) for c in more]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--ms", type=int, nargs="+", default=[1, 2])
    p.add_argument("--no-floor", action="store_true", help="skip the read floors")
    p.add_argument("--tiles", nargs="+", metavar="N,K,W,S", help="phase A's tiles at every M instead of TILES")
    p.add_argument("--only", nargs="+", metavar="MODEL:PROJ", help="only these rows, e.g. Qwen3-8B:qkv")
    args = p.parse_args(argv)
    if args.tiles:
        for M in args.ms:
            TILES[M] = tuple(tuple(int(v) for v in t.split(",")) for t in args.tiles)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    gpu = torch.cuda.get_device_name()
    for M in args.ms:
        for model in MODELS:
            for proj, N, K in model.projections():
                if args.only and f"{model.name}:{proj}" not in args.only:
                    continue
                if time.monotonic() - start > args.budget_s:
                    print("budget spent; stopping before", model.name, proj, M, flush=True)
                    break
                dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
                sets = [encode(dense[i % len(dense)]) for i in range(weight_sets(N, K, N * K * 1.5))]
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M}
                arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}
                for fmt, ws, key in ((WeightFormat.W12, sets, "w12"), (WeightFormat.DENSE, dense, "bf16")):
                    exact, bound = error_bound(x, ws[0], x.dtype)
                    tried = phase_a(x, ws, M, exact, bound) if fmt is WeightFormat.W12 or M == 1 else []
                    tuned = kc.choose_config(fmt, M, N, K, gpu)
                    row[key] = {"tuned": tuned.label(), "phase_a": tried}
                    arms[f"{key} tuned {tuned.label()}"] = [lambda w=w, c=tuned: run_config(x, w, c) for w in ws]
                    for c in fastest(tried, 2 if fmt is WeightFormat.W12 else 1):
                        arms[f"{key} {c.label()}"] = [lambda w=w, c=c: run_config(x, w, c) for w in ws]
                    if fmt is WeightFormat.W12 and tried:  # the fastest with the CSR epilogue, and with none
                        best = fastest(tried, 1)[0]
                        for esc in ("epilogue", "off"):
                            arms[f"escapes {esc} {best.label()}"] = [lambda w=w, e=esc: gemv_fn(x, w, best, escapes=e)
                                                                     for w in ws]
                    del exact, bound
                u, runs = rotated_rounds(arms)
                row.update({"us": u, "runs": runs, "bytes": {"bf16": N * K * 2, "w12": sets[0].nbytes_total}})
                if M == args.ms[0] and not args.no_floor:
                    row["read_floor"] = {k: read_floor(b) for k, b in row["bytes"].items()}
                data["rows"].append(row)
                w12_best = min(v for k, v in u.items() if k.startswith("w12 ") and "tuned" not in k)
                w12_tuned = next(v for k, v in u.items() if k.startswith("w12 tuned"))
                print(f"{model.name} {proj} M={M}: cuBLAS {u['cublas']:.2f} | tuned W12 {w12_tuned:.2f} "
                      f"(x{u['cublas'] / w12_tuned:.3f}) | GEMV W12 {w12_best:.2f} (x{u['cublas'] / w12_best:.3f}) "
                      f"| errors {[t['label'] for t in row['w12']['phase_a'] if 'error' in t]}", flush=True)
                (args.out / "w12_gemv_fma.json").write_text(json.dumps(data, indent=1) + "\n")
                del sets, dense
                torch.cuda.empty_cache()
    (args.out / "w12_gemv_fma.md").write_text(render(data))
    print(render(data))
    return 0


def render(data: dict) -> str:
    lines = ["# The FMA GEMV (codes against x at their own columns) vs cuBLAS and the tuned GEMM "
             "(bench/prototypes/w12_gemv_fma.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs per call, "
             "fastest of 3 rotated rounds; W12 with escapes",
             "- read floor: the fastest of six plain streaming-read kernels over the same bytes (W12's, or "
             "BF16's for cuBLAS), graph-timed over rotating buffers: launch, ramp and tail included", "",
             "| model | proj | M | cuBLAS | W12 tuned (config) | W12 GEMV best (config) | tuned / cuBLAS | **GEMV / cuBLAS** "
             "| GEMV TB/s | read floor W12 / BF16 bytes | floor / GEMV | floor / cuBLAS | GEMV CSR escapes / none "
             "| BF16 tuned | BF16 GEMV |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        tuned = next(k for k in u if k.startswith("w12 tuned"))
        gem = min((k for k in u if k.startswith("w12 ") and "tuned" not in k), key=u.get)
        b_tuned = next(k for k in u if k.startswith("bf16 tuned"))
        b_gemv = [k for k in u if k.startswith("bf16 ") and "tuned" not in k]
        floor = r.get("read_floor")
        esc = [next((f"{u[k]:.2f}" for k in u if k.startswith(f"escapes {e} ")), "-") for e in ("epilogue", "off")]
        floors = (f"{floor['w12']['us']:.2f} / {floor['bf16']['us']:.2f} | {floor['w12']['us'] / u[gem]:.3f} "
                  f"| {floor['bf16']['us'] / u['cublas']:.3f}") if floor else "- | - | -"
        lines.append(
            f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | {u[tuned]:.2f} ({tuned[10:]}) "
            f"| {u[gem]:.2f} ({gem[4:]}) | {u['cublas'] / u[tuned]:.3f} | **{u['cublas'] / u[gem]:.3f}** "
            f"| {r['bytes']['w12'] / u[gem] / 1e6:.2f} | {floors} | {esc[0]} / {esc[1]} | {u[b_tuned]:.2f} "
            f"| {(f'{u[b_gemv[0]]:.2f} ({b_gemv[0][5:]})' if b_gemv else '-')} |")
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    raise SystemExit(main())
