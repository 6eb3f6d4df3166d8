"""The Triton kernel of `topk.py` (imported on first use: importing Triton needs it installed)."""

import triton
import triton.language as tl


@triton.jit
def top_log_probs_kernel(x_ptr, values_ptr, indices_ptr, V, stride, K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + offs, mask=offs < V, other=float("-inf")).to(tl.float32)  # [BLOCK]
    m = tl.max(x, axis=0)
    log_sum = tl.log(tl.sum(tl.exp(x - m), axis=0))
    for j in tl.static_range(K):
        best = tl.max(x, axis=0)
        # the smallest index holding the maximum (ties: lower index first)
        idx = tl.min(tl.where(x == best, offs, BLOCK), axis=0)
        tl.store(values_ptr + row * K + j, (best - m) - log_sum)
        tl.store(indices_ptr + row * K + j, idx.to(tl.int64))
        x = tl.where(offs == idx, float("-inf"), x)
