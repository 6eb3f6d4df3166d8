"""A decode / verify step's routed experts on the GPU: one GEMV per (token, expert) pair.

Owns: `moe_experts` (three kernels: the pairs' gate|up projections with the SwiGLU fused into
their epilogue, the pairs' down projections scaled by their routing weights, and each token's
ordered sum over its k pairs), their launcher, the blocking (`blocking`), the custom op
torch.compile sees (`specpilot::moe_experts`), when the kernels apply (`applies`: `MAX_PAIRS`)
and a pure-torch version of the same math (`reference`), used where the kernels cannot run.

Semantics are those of `models.moe.Experts.forward` (which calls this where it applies):
out[t] = sum over the token's k slots j, in increasing expert order, of
w[t,j] * down_e(silu(gate_e x[t]) * up_e x[t]), e = ids[t,j], with the roundings of the model's
eager math: the projections rounded to the model dtype, silu(gate) rounded, times up rounded, the
down projection rounded, times w rounded, and each add of the ordered sum rounded.

The rules:
- Pair p = t * k + j. A program of the projections owns one pair and one block of output rows and
  reads that pair's expert's weights directly through ids [T,k] -- no sort, no gathered copy of x
  or the weights, no host read -- so the step is CUDA-graph capturable. Pairs that share an
  expert read its rows again (from L2: their programs run side by side), so the weights streamed
  grow with the pairs where a grouped GEMM reads each routed expert once: hence `MAX_PAIRS`.
- The sum kernel takes the token's k outputs in increasing expert order (ties by slot) by a
  selection over its k ids in registers: no sorted copy of ids or weights, no atomics.
- Batch invariant: the blocking depends only on (C, I) (`blocking`), never on T or k, and each
  pair's result only on its own token, expert and weight, so a tree node's MLP output is bit for
  bit the one the same token gets in a decode step (one token), at any number of pairs.
- Each program keeps a [rows, columns] float32 accumulator over its K steps (plain loads, no
  pipelining through shared memory, as the GEMV path: `gemv.py`) and sums over the columns at the
  end; x (or h) is loaded in the weight tile's layout, so no layout conversion runs in the loop.
- Exact in the math, not the rounding: float32 sums in another order than cuBLAS / MKL.
- float32, BF16 or float16 activations and weights (the same dtype); x [T,C] and the expert
  tensors need a unit innermost stride (x's rows any stride).
- Launched with programmatic dependent launch where `launch.pdl` says so: every program waits
  before its first load (the expert id, a kernel's output, decides which weights it reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.kernels.configs import next_pow2
from specpilot.kernels.dispatch import kernels_available
from specpilot.kernels.launch import launch_options, pdl

# Above this many (token, expert) pairs the grouped GEMM (`Experts.forward`), which reads each
# routed expert once for all its tokens, takes over: a pair-wise GEMV re-reads a shared expert's
# rows once per pair (from L2), and its FMAs grow with the pairs. 64 = 8 tokens at k = 8.
MAX_PAIRS = 64
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # -> the kernels' ROUND code


@dataclass(frozen=True)
class Blocking:
    """Rows and columns per program of the two projections, columns per program of the sum, and
    warps per program (`scripts/moe_kernels.py --sweep` times other blockings)."""

    gate_up_n: int = 16  # intermediate rows (each of gate and up)
    gate_up_k: int = 256  # hidden columns per step
    down_n: int = 32  # hidden rows
    down_k: int = 256  # intermediate columns per step
    sum_c: int = 512
    num_warps: int = 4



def blocking(C: int, I: int) -> Blocking:
    """The blocking of hidden size C and expert intermediate size I: a function of (C, I) only,
    so that a pair's result does not depend on how many pairs run beside it. Column steps shrink
    to the next power of two of a small row (the interpreter's tiny test shapes)."""
    b = Blocking()
    return Blocking(b.gate_up_n, min(b.gate_up_k, next_pow2(C)), b.down_n, min(b.down_k, next_pow2(I)),
                    min(b.sum_c, next_pow2(C)), b.num_warps)


def applies(x: torch.Tensor, gate_up_proj: torch.Tensor, pairs: int) -> bool:
    """Whether `Experts.forward` runs these kernels: where they can run, in a dtype they take (x's
    and the experts' the same), on unit innermost strides, for 1 to `MAX_PAIRS` pairs."""
    return (kernels_available(x) and x.dtype in DTYPES and gate_up_proj.dtype == x.dtype
            and x.stride(-1) == 1 and gate_up_proj.stride(-1) == 1 and 0 < pairs <= MAX_PAIRS)


def _check(x, weights, ids, gate_up_proj, down_proj) -> tuple[int, int, int, int, int]:
    T, C = x.shape
    E, I2, Cw = gate_up_proj.shape
    I = I2 // 2
    k = ids.shape[-1] if ids.dim() == 2 else 0
    if (ids.shape != (T, k) or weights.shape != (T, k) or Cw != C or I2 != 2 * I or down_proj.shape != (E, C, I)
            or ids.dtype != torch.int64 or x.dtype not in DTYPES
            or {weights.dtype, gate_up_proj.dtype, down_proj.dtype} != {x.dtype}
            or x.stride(-1) != 1 or gate_up_proj.stride(-1) != 1 or down_proj.stride(-1) != 1):
        shapes = {n: (tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(t.stride()))
                  for n, t in {"x": x, "weights": weights, "ids": ids, "gate_up_proj": gate_up_proj,
                               "down_proj": down_proj}.items()}
        raise ValueError(f"moe_experts: expects x [T,C], weights [T,k] in x's dtype, ids [T,k] int64, "
                         f"gate_up_proj [E,2I,C], down_proj [E,C,I] in x's dtype, unit last strides; got {shapes}")
    return T, k, C, I, E


def moe_experts_eager(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                      down_proj: torch.Tensor, *, block: Blocking | None = None) -> torch.Tensor:
    """`moe_experts` by the kernels, called directly; `block` overrides the blocking (timing
    sweeps: another blocking sums in another order, so keep one per (C, I))."""
    from specpilot.kernels import moe_gemv_kernel as kernels

    T, k, C, I, _ = _check(x, weights, ids, gate_up_proj, down_proj)
    out = torch.empty_like(x)
    if T * k == 0:
        return out.zero_()
    b = block or blocking(C, I)
    ids, weights = ids.contiguous(), weights.contiguous()
    rnd = DTYPES[x.dtype]
    on = pdl(x.device)
    h = torch.empty(T * k, I, dtype=x.dtype, device=x.device)  # [T*k,I] pair p = t*k + j
    y = torch.empty(T * k, C, dtype=x.dtype, device=x.device)  # [T*k,C]
    kernels.moe_gate_up_kernel[(T * k, -(-I // b.gate_up_n))](
        x, ids, gate_up_proj, h,
        k, C, I,
        x.stride(0), ids.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), h.stride(0),
        BLOCK_N=b.gate_up_n, BLOCK_K=b.gate_up_k, EVEN_N=I % b.gate_up_n == 0, EVEN_K=C % b.gate_up_k == 0,
        ROUND=rnd, PDL=on, num_warps=b.num_warps, num_stages=1, **launch_options(on),
    )
    kernels.moe_down_kernel[(T * k, -(-C // b.down_n))](
        h, ids, weights, down_proj, y,
        k, C, I,
        h.stride(0), ids.stride(0), weights.stride(0), down_proj.stride(0), down_proj.stride(1), y.stride(0),
        BLOCK_N=b.down_n, BLOCK_K=b.down_k, EVEN_N=C % b.down_n == 0, EVEN_K=I % b.down_k == 0,
        ROUND=rnd, PDL=on, num_warps=b.num_warps, num_stages=1, **launch_options(on),
    )
    kernels.moe_sum_kernel[(T, -(-C // b.sum_c))](
        y, ids, out,
        k, C,
        y.stride(0), ids.stride(0), out.stride(0),
        BLOCK_C=b.sum_c, KP2=next_pow2(k), ROUND=rnd, PDL=on, num_warps=b.num_warps, num_stages=1, **launch_options(on),
    )
    return out


def reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
              down_proj: torch.Tensor) -> torch.Tensor:
    """`moe_experts` in plain torch: slot by slot in increasing expert order, each pair's
    projections as batched matmuls over its expert's gathered weights, rounded where the model's
    eager math rounds."""
    k = _check(x, weights, ids, gate_up_proj, down_proj)[1]
    ids, perm = ids.sort(dim=-1)
    weights = weights.gather(-1, perm)
    out = torch.zeros_like(x)
    for j in range(k):
        e = ids[:, j]  # [T]
        gate, up = torch.bmm(gate_up_proj[e], x[:, :, None])[..., 0].chunk(2, dim=-1)  # [T,I] each
        h = F.silu(gate) * up
        out = out + torch.bmm(down_proj[e], h[:, :, None])[..., 0] * weights[:, j, None]
    return out


@torch.library.custom_op("specpilot::moe_experts", mutates_args=())
def _moe_experts_op(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor) -> torch.Tensor:
    return moe_experts_eager(x, weights, ids, gate_up_proj, down_proj)


@_moe_experts_op.register_fake
def _(x, weights, ids, gate_up_proj, down_proj):
    return x.new_empty(x.shape)


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                down_proj: torch.Tensor) -> torch.Tensor:
    """out [T,C] in x's dtype: sum over each token's k slots, in increasing expert order, of
    weights[t,j] * SwiGLU expert ids[t,j] (gate_up_proj [E,2I,C] ([gate | up] rows), down_proj
    [E,C,I]) of x [T,C]; weights [T,k] in x's dtype, ids [T,k] int64. The kernels on CUDA / the
    interpreter (one custom op under torch.compile), else `reference`."""
    args = (x, weights, ids, gate_up_proj, down_proj)
    if not kernels_available(x):
        return reference(*args)
    if torch.compiler.is_compiling():
        return torch.ops.specpilot.moe_experts(*args)
    return moe_experts_eager(*args)
