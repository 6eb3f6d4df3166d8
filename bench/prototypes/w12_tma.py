"""Prototype: the W12 GEMM's weight planes loaded by TMA (tensor descriptors) instead of per-thread
cp.async, timed against the shipped kernel (GPU timing; correctness also under TRITON_INTERPRET=1).

    python bench/prototypes/w12_tma.py --out DIR [--budget-s 240]
    TRITON_INTERPRET=1 python bench/prototypes/w12_tma.py --check   # CPU: bit-identity only

Why: every other lever on the K loop is measured (bench/results/README.md): the step of a lone
program is latency-bound, and the loop issues 12-24 16-byte cp.async per thread per step for the
lo/hi planes. With tensor descriptors a step's [64, BK/8] lo and hi boxes are two TMA copies into
shared memory, signalled by an mbarrier, issued by one thread; Triton pipelines them (`num_stages`)
like the cp.async path. The x^T tile, the decode (`tiles.decode_groups` + `assemble`), the MMA,
the split-K reduction and the row scale are the shipped kernel's own functions. Escapes are left
out, so the arm is compared with the shipped kernel at `escapes="off"`: the same sums in the same
order, the outputs must be bit-identical.

Every projection of Qwen3-8B and Qwen3-32B at M = 1 and 32, at the shipped tuned config, against
cuBLAS (`F.linear`) and the shipped kernel (escapes off), rotating weight sets, CUDA graphs,
fastest of 3 rotated rounds. Writes OUT/w12_tma.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels import tiles  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig, block_m  # noqa: E402
from specpilot.kernels.launch import bf16_dots, prepare_launch, ptx_decode  # noqa: E402

WORD = 8  # weights per group: one int64 of lo bytes, one int32 of hi nibbles


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _tma_kernel(x_ptr, lo_desc, hi_desc, base_ptr, y_ptr, ws_ptr, count_ptr,
                M, N, K, Kp, split_k, steps_per_split, stride_xm, stride_ym,
                DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, PTX_DECODE: tl.constexpr, STAGES: tl.constexpr):
    G: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, tl.cdiv(Kp, BLOCK_K))
    scale = tiles.row_scale(base_ptr, rows, N)  # [BN]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # y^T tile [BN, BM]
    for step in tl.range(step0, step1, num_stages=STAGES):
        lo = lo_desc.load([row0, step * G])  # [BN, G] int64 (rows past N and groups past Kp read 0)
        hi = hi_desc.load([row0, step * G])  # [BN, G] int32
        o0, o1, o2, o3, o4, o5, o6, o7 = tiles.decode_groups(lo, hi, PTX_DECODE, False)
        w = tiles.assemble(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N, BLOCK_K)  # [BN, BK] scaled
        xt = gemm_mod._load_xt(x_ptr, m, M, K, step, stride_xm, BLOCK_K, EVEN_K)  # [BK, BM]
        acc = gemm_mod._dot(w, xt, tl.where(step == step0, 0.0, acc), DOT_BF16)
    out = tl.trans(acc)  # [BM, BN]
    y_mask = (m < M)[:, None] & (rows < N)[None, :]
    if split_k > 1:
        is_last, out = tiles.reduce_split_k(
            out, ws_ptr, count_ptr, pid_n, pid_k, split_k, m[:, None] * N + rows[None, :], y_mask, M * N,
        )
    else:
        is_last = pid_k == 0
    if is_last:
        out = out * scale[None, :]
        tiles.store_rows(out, y_ptr, rows, M, N, stride_ym, BLOCK_M)


def descriptors(weight, cfg: LaunchConfig):
    """(lo, hi) tensor descriptors over the planes as [N, Kp/8] int64 / int32, boxes [BN, BK/8]; cached."""
    key = ("tma", cfg.block_n, cfg.block_k)
    if key not in weight.derived:
        N, Kp = weight.lo.shape
        g = cfg.block_k // WORD
        lo = weight.lo.view(torch.int64)  # [N, Kp/8]
        hi = weight.hi.view(torch.int32)  # [N, Kp/8]
        weight.derived[key] = (TensorDescriptor(lo, [N, Kp // WORD], [lo.stride(0), 1], [cfg.block_n, g]),
                               TensorDescriptor(hi, [N, Kp // WORD], [hi.stride(0), 1], [cfg.block_n, g]))
    return weight.derived[key]


def tma_gemm(x: torch.Tensor, weight, cfg: LaunchConfig) -> torch.Tensor:
    """y [M, N] = x @ W^T with escapes left out, on the shipped kernel's launch plan for `cfg`."""
    run = prepare_launch(x, weight, cfg, KernelPath.GEMM, kc.GEMM_MAX_M, None)
    lo_desc, hi_desc = descriptors(weight, cfg)
    ops = run.ops
    _tma_kernel[run.grid](
        x, lo_desc, hi_desc, ops.base, run.y, run.args[8], run.args[9],
        x.shape[0], ops.N, ops.K, ops.Kp, run.grid[1], run.steps_per_split, x.stride(0), run.y.stride(0),
        DOT_BF16=bf16_dots(x, ops), BLOCK_M=block_m(KernelPath.GEMM, x.shape[0]), BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, EVEN_K=run.even_k, PTX_DECODE=ptx_decode(cfg), STAGES=cfg.num_stages,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.max_registers,
    )
    return run.y.to(x.dtype)


def check(device: str = "cpu") -> bool:
    """Bit-identity against the shipped kernel with escapes off, on small odd shapes."""
    from specpilot.w12 import encode

    torch.manual_seed(0)
    ok = True
    for N, K, bk, sk, M in [(128, 512, 256, 0, 1), (192, 768, 128, 2, 3), (100, 1000, 128, 2, 17)]:
        w = torch.randn(N, K, dtype=torch.bfloat16, device=device) * 0.02
        w[0, 5] = 0.0
        ww = encode(w)
        x = torch.randn(M, K, dtype=torch.bfloat16, device=device)
        cfg = LaunchConfig(KernelPath.GEMM, 64, bk, split_k=sk, num_warps=4, num_stages=2)
        ref = gemm_mod.gemm(x, ww, cfg, escapes="off").view(torch.int16)
        same = torch.equal(tma_gemm(x, ww, cfg).view(torch.int16), ref)
        print(N, K, bk, sk, M, "bit-identical" if same else "DIFFERENT", flush=True)
        ok &= same
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--check", action="store_true", help="only the bit-identity check on small shapes")
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--budget-s", type=float, default=240.0)
    args = p.parse_args(argv)
    if args.check:
        return 0 if check("cuda" if torch.cuda.is_available() else "cpu") else 1
    from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets
    from specpilot.w12 import encode

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "small_check": check("cuda"), "rows": []}
    gpu = torch.cuda.get_device_name()
    order = [("Qwen3-8B", "qkv"), ("Qwen3-32B", "qkv"), ("Qwen3-8B", "o"), ("Qwen3-8B", "gate_up"), ("Qwen3-32B", "o"),
             ("Qwen3-8B", "down"), ("Qwen3-32B", "down"), ("Qwen3-32B", "gate_up"), ("Qwen3-8B", "lm_head"),
             ("Qwen3-32B", "lm_head")]
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    for model, proj in order:
        if time.monotonic() - start > args.budget_s:
            print("budget spent; stopping before", model, proj, flush=True)
            break
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        for M in args.ms:
            cfg = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                    "w12": [lambda w=w: gemm_mod.gemm(x, w, cfg) for w in sets],
                    "w12 escapes off": [lambda w=w: gemm_mod.gemm(x, w, cfg, escapes="off") for w in sets]}
            try:
                ref = gemm_mod.gemm(x, sets[0], cfg, escapes="off").view(torch.int16)
                same = bool(torch.equal(tma_gemm(x, sets[0], cfg).view(torch.int16), ref))
                if same:
                    arms["tma escapes off"] = [lambda w=w: tma_gemm(x, w, cfg) for w in sets]
            except Exception as err:  # noqa: BLE001 - report and go on
                same = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            u, runs = rotated_rounds(arms)
            data["rows"].append({"model": model, "proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                                 "us": u, "runs": runs, "bit_identical": same})
            print(model, proj, M, cfg.label(), {k: round(v, 2) for k, v in u.items()}, "bit-identical:", same, flush=True)
            (args.out / "w12_tma.json").write_text(json.dumps(data, indent=1) + "\n")
            del arms
        del sets, dense
        torch.cuda.empty_cache()
    lines = ["# W12 weight planes loaded by TMA vs per-thread cp.async (bench/prototypes/w12_tma.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; tuned configs; µs per "
             f"call, fastest of 3 rotated rounds; small-shape check: {data['small_check']}", "",
             "| model | proj | M | config | cuBLAS | W12 | W12 escapes off | TMA escapes off | TMA / cp.async (escapes off) | "
             "bit-identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        u = r["us"]
        t, off = u.get("tma escapes off"), u["w12 escapes off"]
        tma = f"{t:.2f}" if t else "-"
        ratio = f"{t / off:.3f}" if t else "-"
        lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {r['config']} | {u['cublas']:.2f} | {u['w12']:.2f} | "
                     f"{off:.2f} | {tma} | {ratio} | {r['bit_identical']} |")
    (args.out / "w12_tma.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
