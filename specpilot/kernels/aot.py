"""Compile every kernel variant for a GPU architecture on a machine without a GPU.

    python -m specpilot.kernels.aot [--arch 90] [--quick]      # exit 1 if any variant fails
    python -m specpilot.kernels.aot --sass "gemv n4 k1024"     # instructions per weight of the K loop

Triton's interpreter (how the CPU tests run the kernels) executes the Python of a kernel but never
compiles it, so errors only the compiler sees -- branches returning different types, inline-asm
operand constraints, layouts Triton cannot lower -- would first show up on the GPU. This module
compiles each candidate launch config of the GEMV and GEMM paths (both weight formats, tiles even
and uneven, the smallest and largest row block of each config), the unpack kernel, the split-KV
attention kernels (each query tile and head size, BF16 and float32), the FP8 kernel, the Gated
DeltaNet kernels, the pair-wise MoE expert kernels, the fused draft-layer kernels and the rope_store
kernel to PTX and a
cubin for the target with Triton's bundled ptxas (no driver involved), checks the shared memory
each needs against the architecture's limit, and reports every failure.

Owns: the kernels' argument signatures for ahead-of-time compilation and the variant list. Must
run in a process where TRITON_INTERPRET is unset when Triton is imported (the test spawns one).
Does not own the kernels or the configs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass

from specpilot.kernels import configs as kc
from specpilot.kernels.configs import GEMM_MAX_M, GEMV_MAX_M, KernelPath, LaunchConfig, block_m

POINTERS = {  # argument -> Triton pointer type; a plain weight passes itself as hi/base/escapes
    "x_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32", "count_ptr": "*i32", "esc_ptr_ptr": "*i32",
    "esc_col_ptr": "*i16", "esc_val_ptr": "*i16", "lo_ptr": "*u8", "out_ptr": "*i16",
    "ebw_ptr": "*i32", "ebv_ptr": "*i16", "xt_ptr": "*bf16",
}
W12_PLANES = {"w_ptr": "*u8", "hi_ptr": "*u8", "base_ptr": "*u8"}
DENSE_PLANES = {"w_ptr": "*bf16", "hi_ptr": "*bf16", "base_ptr": "*bf16", "esc_ptr_ptr": "*bf16",
                "esc_col_ptr": "*bf16", "esc_val_ptr": "*bf16", "ebw_ptr": "*bf16", "ebv_ptr": "*bf16"}


NOT_DIVISIBLE = {"M", "split_k", "steps_per_split"}  # the launchers never specialize these
# split-KV attention (`attention_kernel.py`): its tensors' pointers in the model's dtype (float32
# for the partial outputs), the softmax scale a float; its integers may take any value
ATTENTION_POINTERS = {"q_ptr": "act", "k_ptr": "act", "v_ptr": "act", "bias_ptr": "act", "o_ptr": "act",
                      "o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "count_ptr": "*i32"}
SHARED_MEMORY_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # bytes per block (opt-in maximum)


@dataclass(frozen=True)
class Variant:
    kernel: str  # "gemv" | "gemm" | "unpack" | "attention" | "attention_merge" | "fp8" | "gdn_conv" | "gdn_recurrence"
    # | "moe_gate_up" | "moe_down" | "moe_sum" | "draft_gemv" | "draft_qkv_gemv" | "rope_store"
    label: str
    constexprs: dict
    num_warps: int
    num_stages: int
    max_registers: int | None = None  # the launcher's maxnreg (GEMM)
    activations: str = "*bf16"  # attention: the pointer type of q, K/V, the bias and the output


def _kernel(name: str):
    if name == "gemv":
        from specpilot.kernels.gemv import _gemv_kernel

        return _gemv_kernel
    if name == "gemm":
        from specpilot.kernels.gemm import _gemm_kernel

        return _gemm_kernel
    if name == "fp8":
        from specpilot.kernels.fp8_gemm import _fp8_gemm_kernel

        return _fp8_gemm_kernel
    if name in ("attention", "attention_merge"):
        from specpilot.kernels.attention_kernel import merge_splits_kernel, split_attention_kernel

        return split_attention_kernel if name == "attention" else merge_splits_kernel
    if name in ("gdn_conv", "gdn_recurrence"):
        from specpilot.kernels import gdn_kernel

        return getattr(gdn_kernel, name + "_kernel")
    if name in ("draft_gemv", "draft_qkv_gemv"):
        from specpilot.kernels import draft_layer_kernel

        return getattr(draft_layer_kernel, name + "_kernel")
    if name == "rope_store":
        from specpilot.kernels.rope_store_kernel import rope_store_kernel

        return rope_store_kernel
    if name.startswith("moe_"):
        from specpilot.kernels import moe_gemv_kernel

        return getattr(moe_gemv_kernel, name + "_kernel")
    from specpilot.kernels.w12_unpack import _unpack_kernel

    return _unpack_kernel


def _constexprs(cfg: LaunchConfig, bm: int, w12: bool, even: bool) -> dict:
    """The meta-parameters a launch of `cfg` with row block `bm` passes (GEMM: before its escape mode)."""
    c = {"IS_W12": w12, "BLOCK_M": bm, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
         "EVEN_N": even, "EVEN_K": even, "PTX_DECODE": cfg.ptx_decode, "STAGES": cfg.num_stages}
    gemm = {"DOT_BF16": True, "TMA": cfg.tma, "TMA_X": cfg.tma_x}
    gemv = {"EVEN_M": even, "ESC_CHUNK": 16, "PAIRS": not w12 and even, "X_PAIRS": even and cfg.ptx_decode}
    c.update(gemv if cfg.path is KernelPath.GEMV else gemm)
    return c


def _descriptor_types(c: dict, w12: bool) -> dict:
    """Signature of the GEMM's lo_desc/hi_desc/x_desc: tensor descriptors of the weight tiles with
    TMA (`tma.py`: W12 int64 / int32 groups [BN, BK/8], plain [BN, BK]), else the planes' pointers;
    x's tiles [BM, BK] with TMA_X, else x's pointer."""
    n, k = c["BLOCK_N"], c["BLOCK_K"]
    x = {"x_desc": f"tensordesc<bf16[{c['BLOCK_M']}, {k}]>" if c.get("TMA_X") else "*bf16"}
    if not c.get("TMA"):
        planes = W12_PLANES if w12 else DENSE_PLANES
        return {"lo_desc": planes["w_ptr"], "hi_desc": planes["hi_ptr"], **x}
    if w12:
        return {"lo_desc": f"tensordesc<i64[{n}, {k // 8}]>", "hi_desc": f"tensordesc<i32[{n}, {k // 8}]>", **x}
    return {"lo_desc": f"tensordesc<bf16[{n}, {k}]>", "hi_desc": f"tensordesc<bf16[{n}, {k}]>", **x}


# tiles whose every escape mode and format `--quick` compiles: the GEMM's untuned defaults
# (`configs.heuristic_config`) and the first GEMV tile; the other candidates compile in their
# main mode only (W12 escape blocks, plain BF16), which exercises the same code per tile
FULL_QUICK_TILES = {(64, 256, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3), (8, 1024, 2, 1)}


def variants(quick: bool = False) -> list[Variant]:
    """Every candidate config x format x (even, uneven tiles) x (smallest, largest row block);
    `quick`: even tiles, the smallest row block, every mode of `FULL_QUICK_TILES` only."""
    seen: dict[LaunchConfig, list[int]] = {}
    for M in range(1, GEMM_MAX_M + 1):
        for cfg in kc.candidates(M):
            seen.setdefault(cfg, []).append(M)

    def modes(cfg: LaunchConfig, all_modes: tuple) -> tuple:
        """All of `all_modes`, or under `quick` the first (the main one) unless the tile is full."""
        full = (cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages) in FULL_QUICK_TILES
        return all_modes if not quick or full else all_modes[:1]

    out = []
    for cfg, ms in seen.items():
        path = cfg.path.value
        blocks = sorted({block_m(cfg.path, M) for M in ms})
        for bm in ([blocks[0]] if quick else [blocks[0], blocks[-1]]):
            for w12 in (True, False):
                for even in ((True,) if quick else (True, False)):
                    c = _constexprs(cfg, bm, w12, even)
                    label = f"{cfg.label()} bm{bm} {'w12' if w12 else 'bf16'} {'even' if even else 'masked'}"
                    if cfg.path is KernelPath.GEMV:  # W12: escape blocks (ESC_MODE 1) in the accumulators
                        # (a slab of <= G = block_k / 8 entries) or one-hot after the loop (wider), or the epilogue (2)
                        for mode, slot in (modes(cfg, ((1, 16), (1, 256), (2, 16))) if w12 else ((0, 16),)):
                            name = label + {0: "", 1: " blocks" + (" wide" if slot > 16 else ""), 2: " epilogue"}[mode]
                            out.append(Variant(path, name, {**c, "ESC_MODE": mode, "ESC_SLOT": slot},
                                               cfg.num_warps, cfg.num_stages))
                        continue
                    # W12: escape blocks (ESC_MODE 1, gathering from x or from x^T) or the epilogue's CSR correction (2)
                    for mode, gather_t in (modes(cfg, ((1, False), (2, False), (1, True))) if w12 else ((0, False),)):
                        name = label + {0: "", 1: " blocks", 2: " epilogue"}[mode] + (" xT" if gather_t else "")
                        out.append(Variant(path, name, {**c, "ESC_MODE": mode, "ESC_SLOT": 64, "GATHER_T": gather_t},
                                           cfg.num_warps, cfg.num_stages, cfg.max_registers))
    four_warps = list(dict.fromkeys(c for M in (16, 32) for c in kc.gemm_candidates(M) if c.num_warps == 4))
    for cfg in four_warps[:1] if quick else four_warps:  # the register cap of three programs per SM (LaunchConfig.resident)
        capped = dataclasses.replace(cfg, resident=3)
        c = {**_constexprs(capped, 32, True, True), "ESC_MODE": 1, "ESC_SLOT": 64, "GATHER_T": False}
        out.append(Variant("gemm", f"{capped.label()} bm32 w12 even blocks", c, cfg.num_warps, cfg.num_stages,
                           capped.max_registers))
    tma_tiles = dict.fromkeys(c for M in (1, 32) for c in kc.gemm_candidates(M)
                              if c.block_k <= 256)  # a plain weight's TMA box is <= 256 wide; 8 warps: the M > 32 heuristic
    for cfg in tma_tiles:  # the weight tiles loaded by TMA (`tma.py`), the sweep's tma variants; from 16
        for t, bm in ((dataclasses.replace(cfg, tma=True), 16), (dataclasses.replace(cfg, tma=True, tma_x=True), 32)):
            for w12 in modes(cfg, (True, False)):  # W12 first: the main mode; rows also with x by TMA (tma_x)
                c = {**_constexprs(t, bm, w12, True), "ESC_MODE": 1 if w12 else 0, "ESC_SLOT": 64, "GATHER_T": False}
                out.append(Variant("gemm", f"{t.label()} bm{bm} {'w12' if w12 else 'bf16'} even{' blocks' if w12 else ''}",
                                   c, cfg.num_warps, cfg.num_stages, cfg.max_registers))
    out.append(Variant("unpack", "unpack", {"BLOCK_N": 16, "BLOCK_K": 256, "PTX_DECODE": True}, 4, 1))
    out += attention_variants(quick)
    out += fp8_variants(quick)
    out += gdn_variants(quick)
    out += moe_variants(quick)
    out += draft_layer_variants(quick)
    out += rope_store_variants(quick)
    out += pdl_variants(out)
    return list({v.label: v for v in out}.values())


# variants compiled again as launched with programmatic dependent launch (`launch.pdl`): a GEMV, a
# GEMM, the split-KV kernel and its merge, in both weight formats / directly or merged
PDL_OF = ("gemv n8 k1024 w2 s1 bm1", "gemm n64 k256 w4 s3 bm16", "attention d128 bm16 bf16", "merge d128 bm16 bf16",
          "moe_gate_up n16 k256 bf16 even", "moe_down n32 k256 bf16 even", "moe_sum c512 bf16",
          "draft_gemv n16 residual bf16", "draft_qkv_gemv d64 qk_norm bf16", "rope_store d128 bm16 qk_norm bf16")


def pdl_variants(base: list[Variant]) -> list[Variant]:
    """The variants of `PDL_OF` with PDL on, labelled '... pdl'."""
    return [dataclasses.replace(v, label=v.label + " pdl", constexprs={**v.constexprs, "PDL": True})
            for v in base if v.label.startswith(PDL_OF)]


def attention_variants(quick: bool = False) -> list[Variant]:
    """The split-KV kernel at each query tile `plan_splits` picks, head sizes 64 and 128 and Gemma's
    256 and 512 (on the key tiles and warps of `key_tiles`), BF16 dots (BF16 models) and IEEE
    float32 ones (float32 models), writing partials that the last split merges or (one split) the
    output directly; the merge kernel (where the counters do not fit) likewise."""
    from specpilot.kernels.attention import key_tiles, query_tile

    out = []
    for bf16 in ((True,) if quick else (True, False)):
        for D in (64, 128, 256, 512):
            for bm in dict.fromkeys(query_tile(queries, D) for queries in (16, 32, 64)):
                block_n, warps = key_tiles(D, bm)
                name = f"attention d{D} bm{bm} {'bf16' if bf16 else 'fp32'}"
                act = "*bf16" if bf16 else "*fp32"
                for direct in (False, True):  # several splits, merged; one, written directly
                    c = {"D": D, "BLOCK_M": bm, "BLOCK_N": block_n, "DOT_BF16": bf16, "DIRECT": direct,
                         "MERGE": not direct}
                    out.append(Variant("attention", name + (" direct" if direct else ""), c, warps, 3, activations=act))
                out.append(Variant("attention_merge", name.replace("attention", "merge"), {"D": D, "BLOCK_M": bm}, warps,
                                   1, activations=act))
    return out


def gdn_variants(quick: bool = False) -> list[Variant]:
    """The Gated DeltaNet kernels (`gdn_kernel.py`) as `kernels.gdn` launches them: the conv over a
    chunk, a tree, and a decode step that moves the window on (COMMIT); the recurrence at Dk 64 and
    128; BF16 and (unless `quick`) float32 activations."""
    from specpilot.kernels.gdn import BLOCK_V, CONV_BLOCK_C, recurrence_warps

    out = []
    for act in (("*bf16",) if quick else ("*bf16", "*fp32")):
        rnd = 1 if act == "*bf16" else 0
        for tree, commit in ((False, False), (True, False), (False, True)):
            c = {"K": 4, "BLOCK_C": CONV_BLOCK_C, "TREE": tree, "ROUND": rnd, "COMMIT": commit, "KP2": 4}
            label = f"gdn_conv {'tree' if tree else 'step commit' if commit else 'chunk'} {act[1:]}"
            out.append(Variant("gdn_conv", label, c, 4, 1, activations=act))
        for dk in (64, 128):
            c = {"BK": dk, "BV": BLOCK_V, "ROUND": rnd, "BETA_ROUND": rnd}
            out.append(Variant("gdn_recurrence", f"gdn_recurrence dk{dk} {act[1:]}", c, recurrence_warps(dk), 1,
                               activations=act))
    return out


def moe_variants(quick: bool = False) -> list[Variant]:
    """The pair-wise MoE expert kernels (`moe_gemv_kernel.py`) as `kernels.moe_gemv` launches them:
    the default blocking and (unless `quick`) one of half the rows, tiles even and masked, BF16 and
    float32 activations and weights; the ordered sum of k = 8 pairs."""
    from specpilot.kernels.moe_gemv import Blocking

    blocks = [Blocking()] + ([] if quick else [Blocking(gate_up_n=8, down_n=16)])
    out = []
    for act in ("*bf16", "*fp32"):
        rnd = 1 if act == "*bf16" else 0
        for b in blocks:
            for even in (True, False):
                tail = f"{act[1:]} {'even' if even else 'masked'}"
                for kernel, n, k in (("moe_gate_up", b.gate_up_n, b.gate_up_k), ("moe_down", b.down_n, b.down_k)):
                    c = {"BLOCK_N": n, "BLOCK_K": k, "EVEN_N": even, "EVEN_K": even, "ROUND": rnd}
                    out.append(Variant(kernel, f"{kernel} n{n} k{k} {tail}", c, b.num_warps, 1, activations=act))
        b = blocks[0]
        out.append(Variant("moe_sum", f"moe_sum c{b.sum_c} {act[1:]}", {"BLOCK_C": b.sum_c, "KP2": 8, "ROUND": rnd},
                           b.num_warps, 1, activations=act))
    return out


def draft_layer_variants(quick: bool = False) -> list[Variant]:
    """The fused draft-layer kernels (`draft_layer_kernel.py`) as `kernels.draft_layer` launches them:
    the projection at each row block `block_n` picks, with each prologue / epilogue pair the model
    uses (residual; norm + SwiGLU; norm + plain); the qkv kernel at each head size, q/k norm on and
    off; BF16 dots (BF16 models) and (unless `quick`) IEEE float32 ones."""
    from specpilot.kernels import draft_layer as dl

    out = []
    for act in (("*bf16",) if quick else ("*bf16", "*fp32")):
        common = {"BLOCK_M": dl.MAX_ROWS, "BLOCK_K": dl.BLOCKING.block_k, "ROUND": 1 if act == "*bf16" else 0,
                  "DOT_BF16": act == "*bf16"}
        for bn in (16, 32, 64):
            for name, norm, epilogue in (("residual", False, dl.RESIDUAL), ("norm swiglu", True, dl.SWIGLU),
                                         ("norm plain", True, dl.PLAIN)):
                c = {**common, "BLOCK_N": bn, "NORM": norm, "EPILOGUE": epilogue}
                out.append(Variant("draft_gemv", f"draft_gemv n{bn} {name} {act[1:]}", c, dl.BLOCKING.num_warps, 2,
                                   activations=act))
        for D in dl.HEAD_DIMS:
            for qk in (True, False):
                c = {**common, "HALF": D // 2, "QK_NORM": qk}
                out.append(Variant("draft_qkv_gemv", f"draft_qkv_gemv d{D} {'qk_norm' if qk else 'plain'} {act[1:]}",
                                   c, dl.BLOCKING.num_warps, 2, activations=act))
    return out


def rope_store_variants(quick: bool = False) -> list[Variant]:
    """The rope_store kernel (`rope_store_kernel.py`) as `kernels.rope_store` launches it: each head
    size at the largest row block and (unless `quick`) a decode step's smallest, q/k norm on and off,
    BF16 and (unless `quick`) float32 activations."""
    from specpilot.kernels import rope_store as rs

    out = []
    for act in (("*bf16",) if quick else ("*bf16", "*fp32")):
        for D in rs.HEAD_DIMS:
            for bm in ((rs.MAX_BLOCK_M,) if quick else (2, rs.MAX_BLOCK_M)):
                for qk in (True, False):
                    c = {"BLOCK_M": bm, "HALF": D // 2, "QK_NORM": qk, "ROUND": 1 if act == "*bf16" else 0}
                    label = f"rope_store d{D} bm{bm} {'qk_norm' if qk else 'plain'} {act[1:]}"
                    out.append(Variant("rope_store", label, c, 4 if bm * D >= 2048 else 2, 1, activations=act))
    return out


def _rope_store_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of a rope_store launch: qkv, q/k norm weights, q and the caches in the
    model's dtype, the RoPE tables float32, positions and slots int64, eps float32; strides of model
    shapes (multiples of 16) but the row count M and tokens per row T."""
    types = {"cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64", "slot_ptr": "*i64", "eps": "fp32"}
    signature = {name: "constexpr" if name in v.constexprs else types.get(name) or
                 (v.activations if name.endswith("_ptr") else "i32") for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if signature[name] not in ("constexpr", "fp32") and name not in ("M", "T", "H", "Hkv")}
    return signature, attrs


def _draft_layer_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of a fused draft-layer launch: activations, weights, norms, RoPE tables
    and caches in the model's dtype, positions and slots int64, eps float32; sizes and strides of
    model shapes (multiples of 16) but the row count M and the tokens per row T."""
    signature = {name: "constexpr" if name in v.constexprs else "*i64" if name in ("pos_ptr", "slot_ptr")
                 else v.activations if name.endswith("_ptr") else "fp32" if name == "eps" else "i32"
                 for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if signature[name] not in ("constexpr", "fp32") and name not in ("M", "T", "H", "Hkv")}
    return signature, attrs


def _moe_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of a MoE expert launch: ids int64, everything else in the model's
    dtype; sizes and strides of model shapes (multiples of 16) but k and the ids' and routing
    weights' row strides (k)."""
    signature = {name: "constexpr" if name in v.constexprs else "*i64" if name == "ids_ptr"
                 else v.activations if name.endswith("_ptr") else "i32" for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if signature[name] != "constexpr" and name not in ("topk", "si_t", "swt_t")}
    return signature, attrs


def _gdn_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of a GDN launch: activations, conv weights and outputs in the model's
    dtype, states float32, A_log / dt_bias float32, positions, parents, commits int64, fresh bool."""
    ints = {"pos_ptr", "par_ptr", "dep_ptr", "cm_ptr", "commit_ptr"}
    f32 = {"state_ptr", "node_ptr", "alog_ptr", "dtb_ptr"}
    signature = {}
    for name in fn.arg_names:
        if name in v.constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = ("*i64" if name in ints else "*fp32" if name in f32 else "*i1" if name == "fresh_ptr"
                               else v.activations)
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name.endswith("_ptr")}
    return signature, attrs


def fp8_variants(quick: bool = False) -> list[Variant]:
    """The FP8 kernel (`fp8_gemm.py`) as its launcher runs it on CUDA: the tiles `choose_config`
    picks for each row count, weight-only with BF16, FP16 and float32 activations and W8A8,
    per-channel and block-wise scales, tiles even and masked; `quick`: BF16 and W8A8, even tiles."""
    import torch
    import triton.language as tl

    from specpilot.kernels.fp8_gemm import choose_config

    out = []
    for M in (1, 17, 33, 65):  # the K split is a runtime argument: the CPU's SM count picks the same tiles
        c = choose_config(M, 4096, 4096, 4096, torch.device("cpu"))
        for act in (("*bf16", "*u8") if quick else ("*bf16", "*fp16", "*fp32", "*u8")):
            for scale_steps in (0, 1):  # per channel; block-wise 128 x 128 (one K tile per scale block)
                for even in ((True,) if quick else (True, False)):
                    w8a8 = act == "*u8"
                    k = {"SCALE_STEPS": scale_steps, "X_CODES": w8a8, "NATIVE": True, "FACTOR": 1.0,
                         "DOT": {"*fp16": tl.float16, "*fp32": tl.float32}.get(act, tl.bfloat16),
                         "BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "EVEN_K": even}
                    label = (f"fp8 bm{c.block_m} n{c.block_n} k{c.block_k} w{c.num_warps} s{c.num_stages} "
                             f"{'w8a8' if w8a8 else act[1:]} {'block' if scale_steps else 'channel'} "
                             f"{'even' if even else 'masked'}")
                    out.append(Variant("fp8", label, k, c.num_warps, c.num_stages, activations=act))
    return out


def compile_variant(v: Variant, arch: int, keep: dict | None = None) -> float:
    """Seconds to compile `v` to a cubin for sm_`arch`; raises the compiler's error. `keep`, if
    given, receives the compiled kernel under "kernel" (for SASS inspection)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _kernel(v.kernel)
    if "PDL" in fn.arg_names and "PDL" not in v.constexprs:  # a launch passes it (False: no PDL), never an int
        v = dataclasses.replace(v, constexprs={**v.constexprs, "PDL": False})
    signature, attrs = (_attention_signature if v.kernel.startswith("attention") else
                        _gdn_signature if v.kernel.startswith("gdn") else
                        _moe_signature if v.kernel.startswith("moe") else
                        _draft_layer_signature if v.kernel.startswith("draft") else
                        _rope_store_signature if v.kernel == "rope_store" else
                        _fp8_signature if v.kernel == "fp8" else _projection_signature)(fn, v)
    constants = {(fn.arg_names.index(k),): val for k, val in v.constexprs.items() if k in fn.arg_names}
    t = time.monotonic()
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": v.num_warps, "num_stages": v.num_stages,
                                     **({"maxnreg": v.max_registers} if v.max_registers else {})})
    limit = SHARED_MEMORY_LIMIT.get(arch)
    if limit is not None and kernel.metadata.shared > limit:
        raise RuntimeError(f"needs {kernel.metadata.shared} bytes of shared memory; sm_{arch} allows {limit}")
    if keep is not None:
        keep["kernel"] = kernel
    return time.monotonic() - t


def _projection_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of a GEMV, GEMM or unpack launch."""
    w12 = v.constexprs.get("IS_W12", True)
    planes = {**(W12_PLANES if w12 else DENSE_PLANES), **(_descriptor_types(v.constexprs, w12) if v.kernel == "gemm" else {})}
    signature = {name: "constexpr" if name in v.constexprs else planes.get(name) or POINTERS.get(name) or "i32"
                 for name in fn.arg_names}
    # What a launch on real tensors specializes: 16-byte aligned pointers, and sizes and strides
    # divisible by 16 (every model shape here) -- without it the compiler emits byte-wide loads.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if signature[name] != "constexpr" and name not in NOT_DIVISIBLE and not signature[name].startswith("tensordesc")}
    return signature, attrs


def _fp8_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of an FP8 launch: codes as bytes, x in its dtype (bytes for W8A8),
    y in x's dtype (BF16 for W8A8), float32 scales and split-K partials."""
    out = "*bf16" if v.activations == "*u8" else v.activations
    types = {"x_ptr": v.activations, "w_ptr": "*u8", "w_scale_ptr": "*fp32", "x_scale_ptr": "*fp32", "y_ptr": out,
             "ws_ptr": "*fp32", "count_ptr": "*i32"}
    signature = {name: "constexpr" if name in v.constexprs else types.get(name, "i32") for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if signature[name] != "constexpr" and name not in NOT_DIVISIBLE}
    return signature, attrs


def _attention_signature(fn, v: Variant) -> tuple[dict, dict]:
    """(signature, attributes) of a split-KV attention or merge launch."""
    signature = {}
    for name in fn.arg_names:
        if name in v.constexprs:
            signature[name] = "constexpr"
        elif name in ATTENTION_POINTERS:
            signature[name] = v.activations if ATTENTION_POINTERS[name] == "act" else ATTENTION_POINTERS[name]
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    # what a launch on the engine's tensors specializes: aligned pointers, strides and cache lengths
    # that are multiples of 16 (head sizes, capacities in steps of 256); query counts are not
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name in ATTENTION_POINTERS or name.startswith(("sq_", "sk_", "sv_", "sb_", "so_")) or name in ("S", "chunk")}
    return signature, attrs


def main_loop_profile(kernel, v: Variant) -> dict:
    """Instruction mix of the K loop in the SASS of a compiled variant (of its loops, the one issuing
    the most loads), and instructions per weight per thread -- the number a kernel's speed hangs on."""
    import collections
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    code = [(int(m.group(1), 16), line) for line in sass.splitlines()
            if (m := re.match(r"\s+/\*([0-9a-f]{4})\*/", line))]
    # ptxas places the retry paths of mbarrier waits (TMA loads) after the kernel's last plain EXIT;
    # their branches back into the body span the K loop and the epilogue, so they are no loops.
    end = max((at for at, line in code if re.search(r"\*/\s+EXIT\s*;", line)), default=code[-1][0] if code else 0)
    loops = [(at - int(m.group(1), 16), int(m.group(1), 16), at) for at, line in code
             if (m := re.search(r"BRA\s.*?0x([0-9a-f]+)", line)) and int(m.group(1), 16) < at <= end]
    if not loops:
        return {"label": v.label, "loop_instructions": 0, "grid_dependency": grid_dependency(kernel.asm["ptx"])}

    def streaming(loop):
        """The K loop streams weights with vector loads (escape loops gather 2-byte values; the
        split-K reduction's loads are .STRONG) and feeds them to the math (MMA or FMA)."""
        _, first, last = loop
        body = [line for at, line in code if first <= at <= last]
        loads = sum(bool(re.search(r"\s(LDGSTS|UTMALDG|LDG\.E\.(64|128))(?!\.STRONG)", line)) for line in body)
        math = sum(bool(re.search(r"\s(HGMMA|HMMA|FFMA)", line)) for line in body)
        return loads > 0, math, loop[0]

    _, first, last = max(loops, key=streaming)
    body = [line for at, line in code if first <= at <= last]
    ops = collections.Counter(m.group(1) for line in body
                              if (m := re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+(?:\.[A-Z0-9_]+)*)", line)))
    c = v.constexprs
    weights = c.get("BLOCK_N", 1) * c.get("BLOCK_K", 1) / (32 * v.num_warps)  # per thread per K step
    shared_ops = sum(bool(re.search(r"\s(STS|LDS|BAR)\b", line)) for _, line in code)  # whole kernel
    return {"label": v.label, "loop_instructions": len(body), "weights_per_thread": weights,
            "per_weight": len(body) / weights, "shared_bytes": kernel.metadata.shared, "kernel_shared_ops": shared_ops,
            "mix": dict(ops.most_common()), "atomics": re.findall(r"\batom\.global\.[\w.]+", kernel.asm["ptx"]),
            "grid_dependency": grid_dependency(kernel.asm["ptx"])}


def grid_dependency(ptx: str) -> dict:
    """How often the PTX waits for the previous grid and releases the next one (PDL), and how many
    global loads come before its first wait (what a kernel reads while the previous one finishes)."""
    out = {op: ptx.count(f"griddepcontrol.{op}") for op in ("wait", "launch_dependents")}
    head = ptx.split("griddepcontrol.wait", 1)[0] if out["wait"] else ""
    out["loads_before_wait"] = head.count("ld.global") + head.count("cp.async.bulk.tensor")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90: H100/H200)")
    p.add_argument("--quick", action="store_true", help="even tiles and the smallest row block only")
    p.add_argument("--sass", metavar="TEXT", nargs="+", help="only variants whose label contains one of the "
                   "TEXTs; print the instruction mix of each one's K loop and instructions per weight")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        print("error: unset TRITON_INTERPRET: the interpreter does not compile", file=sys.stderr)
        return 2
    if args.sass:
        chosen = [v for v in variants(args.quick) if any(text in v.label for text in args.sass)]
        if not chosen:
            print(f"error: no variant label contains {' or '.join(map(repr, args.sass))}", file=sys.stderr)
            return 2
        for v in chosen:
            keep: dict = {}
            compile_variant(v, args.arch, keep)
            prof = main_loop_profile(keep["kernel"], v)
            print(f"{prof['label']}: {prof['loop_instructions']} instructions per K step, "
                  f"{prof.get('per_weight', float('nan')):.2f} per weight; {prof.get('mix')}; "
                  f"atomics {prof.get('atomics')}; shared-memory ops in the kernel {prof.get('kernel_shared_ops')}; "
                  f"grid dependency {prof['grid_dependency']}")
        return 0
    failures = 0
    vs = variants(args.quick)
    start = time.monotonic()
    for v in vs:
        try:
            compile_variant(v, args.arch)
        except Exception as err:  # noqa: BLE001 - report every failing variant, then fail
            failures += 1
            first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
            print(f"FAILED {v.kernel} {v.label}: {type(err).__name__}: {first}", flush=True)
            print(str(err)[-1500:], file=sys.stderr)
    print(f"{len(vs) - failures}/{len(vs)} kernel variants compiled for sm_{args.arch} "
          f"in {time.monotonic() - start:.0f} s (GEMV up to M={GEMV_MAX_M}, GEMM up to M={GEMM_MAX_M})")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
