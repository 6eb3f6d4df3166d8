"""Split-KV attention over a static cache for calls with few queries (decode, drafting, tree verification).

Owns: `split_attention` (launcher: the plan, the split kernel, the merge kernel), the plan
(`plan_splits`), a float64 reference, and `specpilot::split_attention`, the custom op torch.compile
sees as one opaque node.

Why: flash-style kernels tile the query axis and walk the keys of a tile in one program. A call
with a few queries (one decode token, a drafter's frontier, a 65-node tree) then has few query
tiles: unless the kernel also splits the keys, a few dozen programs walk the whole cache in sequence
on a GPU of 132 SMs. Here the keys are cut into splits so that the grid
fills the GPU; each program returns its split's normalised output and log-sum-exp, and the last
split of each query tile to finish merges them (the flash-decoding scheme, without a second launch:
an arrival counter per tile in the projections' workspace, `kernels.workspace`, zero between
launches; a second kernel merges where the counters would not fit).

The rules:
- Same semantics as `F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)` (scale
  D ** -0.5 unless given) with the GQA folding of `models.transformer.CachedAttention`: query row
  m = g * T + t of KV head j is query t of head j * G + g. q is read in its [B,T,H,D] layout and
  the output written in it, so neither the fold nor its inverse costs a copy.
- Exact in the math, not in the rounding: scores and the softmax in float32, BF16 probabilities
  for the second product on BF16 inputs (as the flash kernels do); float32 inputs (and everything
  under the interpreter) multiply in IEEE float32, not TF32.
- A query that no key admits gets zeros (SDPA gives NaN); the engine never asks for one.
- A key tile that the bias masks for every query of a program's tile is skipped, its K/V never
  read: the unfilled end of a static cache costs its mask, not its bytes.
- The plan depends only on shapes and the SM count, so a CUDA graph or a compiled graph replays it.
- Head sizes are powers of two from 16 to 512. Up to 128 they share one tiling; 256 and 512 (Gemma)
  take more warps and, where the query tile is large, smaller key tiles (`key_tiles`), so that q,
  the accumulator and a K/V tile stay in the registers and shared memory of sm_90.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specpilot import env
from specpilot.kernels.launch import launch_options, pdl
from specpilot.kernels.workspace import shared_workspace

BLOCK_N = 64  # keys per inner step (but for the large heads of `LARGE_HEAD_TILES`)
# Queries per row up to which a call counts as "few" (decode, drafting, a verify tree of up to 256
# nodes with a segment's rows): longer chunks (prefill) fill the GPU by their query tiles, where
# torch's flash kernels are the faster choice (`models.transformer.CachedAttention`).
MAX_QUERIES = 512
MAX_HEAD_DIM = 512  # Gemma-4's global layers
SMS_OFF_GPU = 8  # the SM count the plan assumes off a GPU (the interpreter: few programs, still several splits)
# (D, BLOCK_M) -> (keys per inner step, warps of the split and the merge kernel) where not
# (BLOCK_N, 4): for heads of 256 and 512 the accumulator [BLOCK_M, D] and q spread over 8 warps,
# with key tiles of 32 where 64 would spill registers on sm_90 (`python -m specpilot.kernels.aot`
# compiles each); D = 512 keeps query tiles of 16 rows (`query_tile`): 32 spill even on 8 warps.
LARGE_HEAD_TILES = {(256, 32): (64, 8), (256, 64): (32, 8), (512, 16): (32, 8)}


@dataclass(frozen=True)
class SplitPlan:
    block_m: int  # query rows per program
    block_n: int  # keys per inner step
    num_warps: int  # of the split kernel and the merge kernel
    chunk: int  # keys per split, a multiple of block_n
    n_split: int  # splits of the cache


def query_tile(queries: int, head_dim: int) -> int:
    """Query rows per program: the fewest of 16, 32, 64 covering `queries`; 16 for D = 512."""
    if head_dim > 256:
        return 16
    return 16 if queries <= 16 else 32 if queries <= 32 else 64


def key_tiles(head_dim: int, block_m: int) -> tuple[int, int]:
    """(keys per inner step, warps) of a program of `block_m` query rows of head size `head_dim`."""
    return LARGE_HEAD_TILES.get((head_dim, block_m), (BLOCK_N, 4))


def plan_splits(rows: int, queries: int, keys: int, sms: int, head_dim: int = 128) -> SplitPlan:
    """The split of `keys` for `rows` (batch x KV heads) of `queries` folded query rows each, heads
    of `head_dim`: at least enough programs for two waves of `sms` (fewer only where every split is
    one key tile), each split a whole number of key tiles."""
    block_m = query_tile(queries, head_dim)
    block_n, warps = key_tiles(head_dim, block_m)
    base = rows * _cdiv(queries, block_m)  # programs per split
    tiles = _cdiv(keys, block_n)
    want = max(1, min(tiles, _cdiv(2 * sms, base)))
    per = tiles // want  # key tiles per split: n_split = cdiv(tiles, per) >= want
    return SplitPlan(block_m, block_n, warps, per * block_n, _cdiv(tiles, per))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def softmax_scale(head_dim: int, scale: float | None) -> float:
    """The scores' scale: `scale`, or head_dim ** -0.5 (SDPA's default) when None."""
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def _sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return SMS_OFF_GPU


def split_attention_eager(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          bias: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """q [B,T,H,D]; k_cache, v_cache [B,Hkv,S,D]; bias [B,1,G*T,S] additive (0 or -inf), G = H / Hkv;
    scale of the scores (None: D ** -0.5) -> o [B,T,H,D] in q's dtype (the kernels, called directly)."""
    from specpilot.kernels.attention_kernel import merge_splits_kernel, split_attention_kernel

    B, T, H, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    M = G * T
    if H % Hkv or bias.shape[-2] != M or bias.shape[-1] != S or D & (D - 1) or not 16 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"split_attention: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}, bias {tuple(bias.shape)}")
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    plan = plan_splits(B * Hkv, M, S, _sms(q.device), D)
    interpret = env.triton_interpret()  # the interpreter mishandles BF16 dots and stores
    out = torch.empty(q.shape, dtype=torch.float32 if interpret else q.dtype, device=q.device)
    direct = plan.n_split == 1  # one split: no partials, no merge
    parts = 1 if direct else plan.n_split
    o_part = torch.empty(B * Hkv, parts, M, D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B * Hkv, parts, M, dtype=torch.float32, device=q.device)
    tiles = _cdiv(M, plan.block_m)
    counters = shared_workspace(q.device).counters
    merge_here = not direct and tiles * B * Hkv <= counters.numel()
    pdl_launch = pdl(q.device)
    split_attention_kernel[(plan.n_split, tiles, B * Hkv)](
        q, k_cache, v_cache, bias, o_part, lse_part, out, counters,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), bias.stride(0), bias.stride(2), bias.stride(3),
        out.stride(0), out.stride(1), out.stride(2),
        T, G, Hkv, M, S, plan.chunk, plan.n_split, softmax_scale(D, scale),
        D=D, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, DOT_BF16=q.dtype == torch.bfloat16 and not interpret,
        DIRECT=direct, MERGE=merge_here, PDL=pdl_launch, num_warps=plan.num_warps, **launch_options(pdl_launch),
    )
    if not direct and not merge_here:
        merge_splits_kernel[(tiles, B * Hkv)](
            o_part, lse_part, out, out.stride(0), out.stride(1), out.stride(2),
            T, G, Hkv, M, plan.n_split, D=D, BLOCK_M=plan.block_m, PDL=pdl_launch, num_warps=plan.num_warps,
            **launch_options(pdl_launch),
        )
    return out.to(q.dtype)


@torch.library.custom_op("specpilot::split_attention", mutates_args=())
def _split_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        bias: torch.Tensor, scale: float) -> torch.Tensor:
    return split_attention_eager(q, k_cache, v_cache, bias, scale)


@_split_attention_op.register_fake
def _(q, k_cache, v_cache, bias, scale):
    return torch.empty_like(q)


def split_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, bias: torch.Tensor,
                    scale: float | None = None) -> torch.Tensor:
    """`split_attention_eager`; under torch.compile the op `specpilot::split_attention` (the kernels
    stay out of the traced graph, as the projections' do: `op.py`)."""
    if torch.compiler.is_compiling():
        return torch.ops.specpilot.split_attention(q, k_cache, v_cache, bias, softmax_scale(q.shape[-1], scale))
    return split_attention_eager(q, k_cache, v_cache, bias, scale)


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, bias: torch.Tensor,
              scale: float | None = None) -> torch.Tensor:
    """The same attention in float64 by plain torch: [B,T,H,D] (zeros for a query no key admits)."""
    B, T, H, D = q.shape
    Hkv = k_cache.shape[1]
    qf = q.double().permute(0, 2, 1, 3).reshape(B, Hkv, (H // Hkv) * T, D)
    s = qf @ k_cache.double().transpose(-1, -2) * softmax_scale(D, scale) + bias.double()  # [B,Hkv,M,S]
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = p @ v_cache.double()  # [B,Hkv,M,D]
    return o.reshape(B, H, T, D).transpose(1, 2)
