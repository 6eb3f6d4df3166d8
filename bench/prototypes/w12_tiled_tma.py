"""Prototype: the W12 planes stored tile by tile, loaded by TMA (GPU; the check runs on CPU too).

    python bench/prototypes/w12_tiled_tma.py --out DIR [--ms 32 16 64 1] [--only Qwen3-8B/qkv ...]
    TRITON_INTERPRET=1 python bench/prototypes/w12_tiled_tma.py --check   # CPU: bit-identity only

Why: the stall sampling of the shipped M=32 config of Qwen3-8B qkv (bench/results/w12/
ncu_stalls_8b_qkv_m32.md) found the warps waiting for weight tiles that are late while DRAM is half
busy, and named session 9's tile-contiguous layout (w12_tiled.md: 32B qkv M=32 30.64 -> 27.34 µs)
as the lead. That run used cp.async; the weight loads have come by TMA since. A row-major TMA box
[64 rows, BK/8 groups] is 64 separate 128- or 256-byte segments, one per DRAM page; stored tile
by tile ([N/BN, Kp/BK, BN, BK/8] groups) the same box is one contiguous run of 8-16 KB (lo) and
4-8 KB (hi). Only the addresses change: the kernel's tile, decode, sums and escapes are the same,
so the output must be bit-identical.

Arms per (projection, M), escapes on: cuBLAS; the shipped config as dispatched; the shipped GEMM
config with weight TMA (forced on where it was off) row-major and tiled; and n64 k256 w4 s4 with
TMA row-major and tiled. At M=1 (GEMV rows) the GEMM arms take the shipped M=2 config. Every arm
is compared bit for bit with the row-major arm of its config and against the float64 reference
bound. Uses the temporary switch `gemm.AB["tiled"]`. Writes OUT/w12_tiled_tma.json and .md.
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

from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.tma import WORD, _descriptor  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

WIDE = LaunchConfig(KernelPath.GEMM, 64, 256, num_warps=4, num_stages=4, tma=True)


def tiled_planes(weight, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lo as int64 [N/bn * Kp/bk * bn, bk/8] and hi as int32 [same rows, bk/8]: tile (i, j) -- rows
    i*bn.., K step j -- is rows (i * Kp/bk + j) * bn .. + bn, one contiguous run per plane."""
    N, Kp = weight.lo.shape
    if N % bn or Kp % bk:
        raise ValueError(f"tiles {bn}x{bk} do not divide [{N}, {Kp}]")
    lo = weight.lo.view(N // bn, bn, Kp // bk, bk).transpose(1, 2).contiguous()
    hi = weight.hi.view(N // bn, bn, Kp // bk, bk // 2).transpose(1, 2).contiguous()
    return lo.view(-1, bk).view(torch.int64), hi.view(-1, bk // 2).view(torch.int32)


def tiled_descriptors(weight, config: LaunchConfig):
    key = ("tiled", config.block_n, config.block_k)
    if key not in weight.derived:
        lo, hi = tiled_planes(weight, config.block_n, config.block_k)
        box = [config.block_n, config.block_k // WORD]
        weight.derived[key] = (lo, hi, _descriptor(lo, box), _descriptor(hi, box))
    return weight.derived[key][2:]


def call(x, w, cfg, tiled: bool):
    gemm_mod.AB["tiled"] = tiled_descriptors if tiled else None
    try:
        return gemm_mod.gemm(x, w, cfg)
    finally:
        gemm_mod.AB["tiled"] = None


def check(argv_only=None) -> int:
    """CPU (TRITON_INTERPRET=1) or GPU: tiled == row-major bit for bit on small odd weights, escapes
    on, split K, several tiles."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    ok = True
    for N, K, M, cfg in [(128, 384, 3, LaunchConfig(KernelPath.GEMM, 64, 128, num_stages=2, tma=True)),
                         (192, 512, 17, LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2, split_k=2, tma=True)),
                         (128, 256, 5, LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=2, tma=True))]:
        w = torch.randn(N, K, dtype=torch.bfloat16, device=dev) * 0.02
        w[::7, ::5] = 0  # escapes
        w[3, 11] = float("inf")
        x = torch.randn(M, K, dtype=torch.bfloat16, device=dev)
        q = encode(w)
        a, b = call(x, q, cfg, False), call(x, q, cfg, True)
        same = torch.equal(a.view(torch.int16), b.view(torch.int16))
        ok &= same
        print(N, K, M, cfg.label(), "bit-identical" if same else "DIFFERENT", flush=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--ms", type=int, nargs="+", default=[32, 16, 64, 1])
    p.add_argument("--only", nargs="*", default=None, help="MODEL/proj, e.g. Qwen3-8B/qkv")
    p.add_argument("--check", action="store_true", help="bit-identity on small weights only (CPU under the interpreter)")
    args = p.parse_args(argv)
    if args.check:
        return check()
    from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets
    from specpilot.kernels.reference import error_bound

    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    name = torch.cuda.get_device_name()
    for shape in MODELS:
        for proj, N, K in shape.projections():
            if args.only and f"{shape.name}/{proj}" not in args.only:
                continue
            sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
            dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
            for M in args.ms:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                exact, bound = error_bound(x, sets[0], torch.bfloat16)
                shipped = kc.choose_config(kc.WeightFormat.W12, M, N, K, name)
                base = shipped if shipped.path is KernelPath.GEMM else kc.choose_config(kc.WeightFormat.W12, 2, N, K, name)
                base = replace(base, tma=True)
                plans = {"shipped": (shipped, False), "row-major": (base, False), "tiled": (base, True),
                         "wide row-major": (WIDE, False), "wide tiled": (WIDE, True)}
                arms, errors, same = {"cublas": [lambda d=d: F.linear(x, d) for d in dense]}, {}, {}
                outs = {}
                for tag, (cfg, tiled) in plans.items():
                    try:
                        y = call(x, sets[0], cfg, tiled) if tag != "shipped" else kc_run(x, sets[0], cfg)
                        outs[tag] = y
                        errors[tag] = float(((y.double() - exact).abs() / bound).max())
                        if tiled:
                            ref = outs.get(tag.replace("tiled", "row-major"))
                            same[tag] = ref is not None and torch.equal(ref.view(torch.int16), y.view(torch.int16))
                        if tag == "shipped":
                            arms[tag] = [lambda w=w, c=cfg: kc_run(x, w, c) for w in sets]
                        else:
                            arms[tag] = [lambda w=w, c=cfg, t=tiled: call(x, w, c, t) for w in sets]
                    except Exception as err:  # noqa: BLE001 - report and go on
                        errors[tag] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                del outs
                u, runs = rotated_rounds(arms)
                data["rows"].append({"model": shape.name, "proj": proj, "N": N, "K": K, "M": M, "us": u, "runs": runs,
                                     "error_over_bound": errors, "bit_identical": same,
                                     "configs": {k: c.label() for k, (c, _) in plans.items()}})
                print(shape.name, proj, M, {k: round(v, 2) for k, v in u.items()}, same, flush=True)
                del exact, bound
            for w in sets:
                w.derived.clear()
            del sets, dense
            torch.cuda.empty_cache()
            (args.out / "w12_tiled_tma.json").write_text(json.dumps(data, indent=1) + "\n")
            (args.out / "w12_tiled_tma.md").write_text(render(data))
    return 0


def kc_run(x, w, cfg):
    from specpilot.kernels.dispatch import run_config

    return run_config(x, w, cfg)


def render(data: dict) -> str:
    m = data["meta"]
    keys = ("shipped", "row-major", "tiled", "wide row-major", "wide tiled")
    lines = ["# W12 planes stored tile by tile, loaded by TMA (bench/prototypes/w12_tiled_tma.py)", "",
             f"- {m['date']}, {m['gpu']}, commit {m['git_commit']}; µs, fastest of 3 rotated rounds over rotating "
             "weight sets, escapes on; x = cuBLAS / arm",
             "- row-major / tiled: the shipped GEMM config (the M=2 one where M=1 ships a GEMV) with weight TMA; "
             f"wide: {WIDE.label()}; same = tiled output bit-identical to row-major", "",
             "| model | proj | M | cuBLAS | " + " | ".join(f"{k} | x" for k in keys) + " | same | config |",
             "|---|---|---|---|" + "---|---|" * len(keys) + "---|---|"]
    for r in data["rows"]:
        u = r["us"]
        cells = " | ".join(f"{u[k]:.2f} | {u['cublas'] / u[k]:.3f}" if k in u else "- | -" for k in keys)
        same = "/".join(str(r["bit_identical"].get(k, "-")) for k in ("tiled", "wide tiled"))
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {u['cublas']:.2f} | {cells} | {same} | "
                     f"{r['configs']['row-major']} |")
    errs = [f"{r['model']} {r['proj']} M={r['M']} {k}: {v}" for r in data["rows"]
            for k, v in r["error_over_bound"].items() if not isinstance(v, float) or v > 1.0]
    lines += ["", "errors / over the bound: " + ("; ".join(errs) if errs else "none")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
