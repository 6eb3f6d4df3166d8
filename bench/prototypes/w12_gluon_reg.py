"""Prototype: the W12 GEMM with its weight groups loaded from global memory straight into the
registers of the wgmma A fragment, as the GEMV streams them, instead of through a shared-memory
ring (Gluon, GPU only; timed against the Triton kernel).

    python bench/prototypes/w12_gluon_reg.py --out DIR [--ms 32 16]

Why: at M=32 the shipped GEMM (weights by TMA or cp.async into a shared ring, then LDS into the
fragment) keeps DRAM half busy while its warps wait on the ring's barriers
(bench/results/w12/ncu_stalls_8b_qkv_m32.md); an L2 prefetch and padded row strides did not help
(w12_l2_prefetch.md, w12_row_pad.md). The GEMV, which loads its groups straight into registers
with no shared memory and no barrier, streams Qwen3-8B qkv at M=1 in 13.1 µs against the GEMM's
14.5. Here each thread loads the int64/int32 groups of its own A fragment (the layout `REG_W` of
`w12_gluon.py`, which the decode turns into the fragment with no data movement) DEPTH K steps
ahead into registers, decodes, and issues an asynchronous wgmma whose B (x^T) comes from shared
memory: either a cp.async ring of x tiles (one CTA barrier per step, for x only) or, with
`--x-once`, the program's whole x slice copied once before the loop (no barrier in the loop).

Scope as `w12_gluon.py`: W12 with escapes left out (compared with the Triton kernel's
escapes="off" at the same config: the same sums in the same order, so bit-identical), n64, 4
warps, K steps of 128 or 256, rows M <= 32, the Triton config's grid and split. Writes
OUT/w12_gluon_reg.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.prototypes.w12_gluon import ASM, LAYOUTS, SH_X, _decode  # noqa: E402
from bench.w12_kernels import MODELS, environment, random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels import gemm as gemm_mod  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig  # noqa: E402
from specpilot.kernels.launch import prepare_launch  # noqa: E402
from specpilot.kernels.tiles import SCALE_EXP  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

MMAS = {bm: gl.NVMMADistributedLayout([3, 0], [4, 1], [16, bm, 16]) for bm in (16, 32)}
A_OPS = {bm: gl.DotOperandLayout(0, MMAS[bm], 2) for bm in (16, 32)}
X_ONCE_MAX_BYTES = 96 * 1024  # the program's x slice copied once must leave room for 2 programs per SM


@gluon.jit
def _issue_x(x_s, slot, x_ptrs, x_mask, step, ok, BLOCK_K: gl.constexpr):
    async_copy.async_copy_global_to_shared(x_s.index(slot), x_ptrs + step * BLOCK_K, mask=x_mask & ok)
    async_copy.commit_group()


@gluon.jit
def _groups(lo_ptrs, hi_ptrs, step, G: gl.constexpr):
    return gl.load(lo_ptrs + step * G), gl.load(hi_ptrs + step * G)


@gluon.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def _w12_reg_kernel(x_ptr, lo_ptr, hi_ptr, base_ptr, y_ptr, ws_ptr, count_ptr,
                    M, N, Kp, split_k, steps_per_split, stride_xm, stride_ym, stride_lo, stride_hi,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_M: gl.constexpr, XSTAGES: gl.constexpr,
                    DEPTH: gl.constexpr, X_ONCE: gl.constexpr, LD_W: gl.constexpr, LD_X: gl.constexpr,
                    SH_X: gl.constexpr, REG_W: gl.constexpr, MMA: gl.constexpr, A_OP: gl.constexpr,
                    ASM_TEXT: gl.constexpr, SCALE_EXP: gl.constexpr):
    G: gl.constexpr = BLOCK_K // 8
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    row0 = pid_n * BLOCK_N
    step0 = pid_k * steps_per_split
    step1 = gl.minimum(step0 + steps_per_split, gl.cdiv(Kp, BLOCK_K))
    n_steps = step1 - step0

    # The groups' addresses in the fragment's own layout (built once; rows past N read row N - 1,
    # whose outputs are masked at the store).
    rows = gl.minimum(row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD_W)), N - 1)
    g = gl.arange(0, G, layout=gl.SliceLayout(0, LD_W))
    lo_off = gl.convert_layout(rows[:, None] * (stride_lo // 8) + (step0 * G + g)[None, :], REG_W)
    hi_off = gl.convert_layout(rows[:, None] * (stride_hi // 4) + (step0 * G + g)[None, :], REG_W)
    lo_ptrs = lo_ptr.to(gl.pointer_type(gl.int64)) + lo_off
    hi_ptrs = hi_ptr.to(gl.pointer_type(gl.int32)) + hi_off
    kx = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, LD_X))
    mx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LD_X))
    x_ptrs = x_ptr + mx[None, :] * stride_xm + (step0 * BLOCK_K + kx)[:, None]
    x_mask = (mx < M)[None, :] & (kx >= 0)[:, None]

    x_s = gl.allocate_shared_memory(gl.bfloat16, [XSTAGES, BLOCK_K, BLOCK_M], SH_X)
    if X_ONCE:  # XSTAGES = steps_per_split: the whole slice, one wait and one barrier before the loop
        for i in gl.static_range(XSTAGES):
            async_copy.async_copy_global_to_shared(x_s.index(i), x_ptrs + i * BLOCK_K, mask=x_mask & (i < n_steps))
        async_copy.commit_group()
    else:
        for i in gl.static_range(XSTAGES - 1):
            _issue_x(x_s, i, x_ptrs, x_mask, i, i < n_steps, BLOCK_K)

    last = n_steps - 1
    lo_c, hi_c = _groups(lo_ptrs, hi_ptrs, 0, G)
    if DEPTH == 2:
        lo_1, hi_1 = _groups(lo_ptrs, hi_ptrs, gl.minimum(1, last), G)
    if X_ONCE:
        async_copy.wait_group(0)
        gl.thread_barrier()

    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA)
    w_prev = gl.zeros([BLOCK_N, BLOCK_K], gl.bfloat16, layout=A_OP)
    for i in range(n_steps):
        # next groups first: their loads are in flight while this step decodes and multiplies
        # (the last steps reload the last step's groups: L1/L2 hits, no branch)
        lo_n, hi_n = _groups(lo_ptrs, hi_ptrs, gl.minimum(i + DEPTH, last), G)
        if X_ONCE:
            xt = x_s.index(i)
        else:
            slot = i % XSTAGES
            async_copy.wait_group(XSTAGES - 2)
            gl.thread_barrier()  # every thread's x copies of step i have landed; step i-1's x stage is read
            xt = x_s.index(slot)
        w = _decode(lo_c, hi_c, BLOCK_N, BLOCK_K, A_OP, ASM_TEXT)
        acc = warpgroup_mma(w, xt, acc, use_acc=i > 0, is_async=True)
        acc, w_prev = warpgroup_mma_wait(1, deps=[acc, w_prev])  # step i-1's MMA is done: its A and x^T free
        w_prev = w
        if not X_ONCE:
            nxt = i + XSTAGES - 1
            _issue_x(x_s, nxt % XSTAGES, x_ptrs, x_mask, nxt, nxt < n_steps, BLOCK_K)
        if DEPTH == 2:
            lo_c, hi_c = lo_1, hi_1
            lo_1, hi_1 = lo_n, hi_n
        else:
            lo_c, hi_c = lo_n, hi_n
    acc, w_prev = warpgroup_mma_wait(0, deps=[acc, w_prev])
    if not X_ONCE:
        async_copy.wait_group(0)

    rows_o = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    m_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
    mask = (rows_o < N)[:, None] & (m_o < M)[None, :]
    offs = rows_o[:, None] + m_o[None, :] * N
    total = acc
    is_last = pid_k == 0
    if split_k > 1:  # the deterministic reduction of `tiles.reduce_split_k`, as in w12_gluon.py
        gl.store(ws_ptr + pid_k * (M * N) + offs, acc, mask=mask)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        is_last = arrived == split_k - 1
        if is_last:
            total = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA)
            for s in range(split_k):
                total += gl.load(ws_ptr + s * (M * N) + offs, mask=mask, other=0.0, cache_modifier=".cg")
            gl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed")
    if is_last:
        e0 = gl.load(base_ptr + rows_o, mask=rows_o < N, other=1).to(gl.int32)
        scale = ((e0 + SCALE_EXP) << 23).to(gl.float32, bitcast=True)  # 2^(e0 - 112), as `tiles.row_scale`
        out = total * scale[:, None]
        gl.store(y_ptr + rows_o[:, None] + m_o[None, :] * stride_ym, out.to(gl.bfloat16), mask=mask)


def x_once_fits(cfg: LaunchConfig, steps_per_split: int, bm: int) -> bool:
    return steps_per_split * cfg.block_k * bm * 2 <= X_ONCE_MAX_BYTES


def reg_gemm(x: torch.Tensor, weight, cfg: LaunchConfig, depth: int = 1, x_once: bool = False) -> torch.Tensor:
    """y [M, N] = x @ W^T, escapes left out, with the Triton kernel's launch plan (grid, split) for `cfg`;
    cfg.num_stages is the x ring's depth (ignored with x_once)."""
    assert cfg.block_n == 64 and cfg.block_k in LAYOUTS and cfg.num_warps == 4 and x.shape[0] <= 32
    ld_w, ld_x, _, _, reg_w = LAYOUTS[cfg.block_k]
    bm = 16 if x.shape[0] <= 16 else 32
    run = prepare_launch(x, weight, cfg, KernelPath.GEMM, kc.GEMM_MAX_M, None)
    if x_once and not x_once_fits(cfg, run.steps_per_split, bm):
        raise ValueError(f"x slice of {run.steps_per_split} steps does not fit {X_ONCE_MAX_BYTES} bytes")
    ops = run.ops
    ws, counters = run.args[8], run.args[9]
    _w12_reg_kernel[run.grid](
        x, ops.w, ops.hi, ops.base, run.y, ws, counters,
        x.shape[0], ops.N, ops.Kp, run.grid[1], run.steps_per_split, x.stride(0), run.y.stride(0),
        ops.stride_w, ops.stride_hi,
        BLOCK_N=64, BLOCK_K=cfg.block_k, BLOCK_M=bm, XSTAGES=run.steps_per_split if x_once else cfg.num_stages,
        DEPTH=depth, X_ONCE=x_once, LD_W=ld_w, LD_X=ld_x, SH_X=SH_X, REG_W=reg_w, MMA=MMAS[bm], A_OP=A_OPS[bm],
        ASM_TEXT=ASM, SCALE_EXP=SCALE_EXP.value,
        num_warps=4, maxnreg=cfg.max_registers,
    )
    return run.y


ROWS = (("Qwen3-8B", "qkv"), ("Qwen3-8B", "o"), ("Qwen3-32B", "qkv"), ("Qwen3-8B", "gate_up"), ("Qwen3-8B", "down"))


def plans(shipped: LaunchConfig):
    """(tag, Triton config, depth, x_once) of the arms: the Gluon register loop at K steps of 128 (at most
    168 registers: 126-164 compiled, 3-4 programs per SM) and 256 (248: two), on the shipped config's split
    when its K step matches, else the automatic one, and on splits 2 and 4; x by a 3-stage ring or once;
    prefetch depth 1, and 2 at k128 (depth 2 at k256 takes 248 registers and a register move per group)."""
    out = []
    for bk, resident, variants in ((128, 3, ((1, False), (1, True), (2, True))), (256, 2, ((1, False), (1, True)))):
        own = shipped.split_k if shipped.path is KernelPath.GEMM and shipped.block_k == bk else 0
        for sk in dict.fromkeys((own, 2, 4)):
            cfg = LaunchConfig(KernelPath.GEMM, 64, bk, split_k=sk, num_warps=4, num_stages=3, resident=resident)
            for depth, once in variants:
                out.append((f"gluon reg k{bk} sk{sk or 'auto'} d{depth}{' xonce' if once else ''}", cfg, depth, once))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[32, 16])
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--best", type=int, default=4, help="Gluon arms re-timed side by side per row (by their first timing)")
    args = p.parse_args(argv)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": environment(), "rows": []}
    gpu = torch.cuda.get_device_name()
    shapes = {(m.name, proj): (N, K) for m in MODELS for proj, N, K in m.projections()}
    from bench.w12_kernels import graph_time_us

    for model, proj in ROWS:
        if time.monotonic() - start > args.budget_s:
            print("budget spent; stopping before", model, proj, flush=True)
            break
        N, K = shapes[(model, proj)]
        sets = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dense = [random_weight(N, K) for _ in range(weight_sets(N, K, N * K * 2))]
        for M in args.ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            shipped = kc.choose_config(kc.WeightFormat.W12, M, N, K, gpu)
            row = {"model": model, "proj": proj, "N": N, "K": K, "M": M, "shipped": shipped.label(), "first": {},
                   "bit_identical": {}}
            for tag, cfg, depth, once in plans(shipped):
                try:  # the Triton kernel at the same plan sums in the same order: the outputs must be bit-identical
                    ref = gemm_mod.gemm(x, sets[0], cfg, escapes="off").view(torch.int16)
                    out = reg_gemm(x, sets[0], cfg, depth, once).view(torch.int16)
                    row["bit_identical"][tag] = bool(torch.equal(out, ref))
                    row["first"][tag] = graph_time_us([lambda w=w: reg_gemm(x, w, cfg, depth, once) for w in sets])
                except ValueError as err:  # an x slice too large to copy once: not a failure
                    row["bit_identical"][tag] = f"skipped: {err}"
                except Exception as err:  # noqa: BLE001 - report and go on
                    row["bit_identical"][tag] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            best = sorted(row["first"], key=row["first"].get)[: args.best]
            arms = {"cublas": [lambda d=d: F.linear(x, d) for d in dense],
                    "shipped " + shipped.label(): [lambda w=w: gemm_mod.gemm(x, w, shipped) for w in sets],
                    "shipped, escapes off": [lambda w=w: gemm_mod.gemm(x, w, shipped, escapes="off") for w in sets]}
            by_tag = {t: (c, d, o) for t, c, d, o in plans(shipped)}
            for tag in best:
                c, d, o = by_tag[tag]
                arms[tag] = [lambda w=w, c=c, d=d, o=o: reg_gemm(x, w, c, d, o) for w in sets]
                arms["triton " + tag[len("gluon reg "):] + ", escapes off"] = [
                    lambda w=w, c=c: gemm_mod.gemm(x, w, c, escapes="off") for w in sets]
            row["us"], row["runs"] = rotated_rounds(arms)
            data["rows"].append(row)
            print(model, proj, M, {k: round(v, 2) for k, v in sorted(row["us"].items(), key=lambda kv: kv[1])},
                  "not identical / failed:", {k: v for k, v in row["bit_identical"].items() if v is not True and not str(v).startswith("skipped")},
                  flush=True)
            (args.out / "w12_gluon_reg.json").write_text(json.dumps(data, indent=1) + "\n")
        del sets, dense
        torch.cuda.empty_cache()
    lines = ["# W12 GEMM with its weight groups loaded straight into the wgmma A fragment's registers (Gluon) vs the "
             "Triton kernel (bench/prototypes/w12_gluon_reg.py)", "",
             f"- {data['meta']['date']}, {data['meta']['gpu']}, commit {data['meta']['git_commit']}; µs per call, "
             "fastest of 3 rotated rounds after one timing of every Gluon arm; Gluon arms and the `triton ..., escapes "
             "off` arms leave escapes out (same plan, compared bit for bit); `shipped` is the dispatcher's config with escapes",
             "", "| model | proj | M | arm | µs | cuBLAS / arm | bit-identical to Triton |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        for k, v in sorted(r["us"].items(), key=lambda kv: kv[1]):
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | {k} | {v:.2f} | {r['us']['cublas'] / v:.3f} | "
                         f"{r['bit_identical'].get(k, '')} |")
        failed = {k: v for k, v in r["bit_identical"].items() if v is not True and not str(v).startswith("skipped")}
        if failed:
            lines.append(f"| {r['model']} | {r['proj']} | {r['M']} | not identical or failed: {failed} | | | |")
    (args.out / "w12_gluon_reg.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
