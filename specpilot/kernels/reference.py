"""Pure-PyTorch references of the projection kernels, and the error bound the kernels must meet.

Owns: `reference_linear` (decode, then a float32 matmul: what every kernel computes up to
summation order) and `error_bound` (the invariant the tests and the benchmark check). No Triton.
"""

from __future__ import annotations

import torch

from specpilot.w12.codec import decode
from specpilot.w12.weight import W12Weight

FP32_UNIT_ROUNDOFF = 2.0**-24


def dense_weight(weight: W12Weight | torch.Tensor) -> torch.Tensor:
    """The plain [N, K] weight (W12 decoded exactly to BF16)."""
    return decode(weight) if isinstance(weight, W12Weight) else weight


def reference_linear(x: torch.Tensor, weight: W12Weight | torch.Tensor) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W [N, K].T in float32, returned in x's dtype."""
    return (x.float() @ dense_weight(weight).float().T).to(x.dtype)


def error_bound(
    x: torch.Tensor, weight: W12Weight | torch.Tensor, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact y [M, N] in float64, allowed |y_kernel - y| [M, N]) for a kernel accumulating in float32.

    Row n's output is a float32 sum, in any order (tiles, split-K, tensor-core trees), of K products
    and 2 E_n escape terms x*v and -x*p (E_n: the row's escapes). Any such sum is within
    (K + 2 E_n + 2) * 2 u32 * sum_k |x_k| (|w_k| + p_n [k is an escape]) of the exact value; the
    factor 2 covers tensor cores that truncate instead of rounding when aligning addends. The final
    rounding to `out_dtype` adds half an ulp of the result. Non-finite entries are compared
    separately (they must match the reference's exactly).
    """
    w = dense_weight(weight).double()  # [N, K]
    xd = x.double()  # [M, K]
    w = torch.where(torch.isfinite(w), w, 0.0)  # rows with Inf/NaN have non-finite references anyway
    exact = xd @ w.T  # [M, N]
    magnitude = xd.abs() @ w.abs().T  # [M, N]
    terms = torch.full((w.shape[0],), float(w.shape[1] + 2), dtype=torch.float64, device=w.device)
    if isinstance(weight, W12Weight) and weight.num_escapes:
        from specpilot.w12.codec import escape_columns, escape_rows

        rows, cols = escape_rows(weight), escape_columns(weight)
        p = torch.exp2(weight.base[rows].double() - 127.0)
        magnitude.index_add_(1, rows, xd[:, cols].abs() * p)  # the placeholder products x * p
        terms += 2.0 * (weight.esc_ptr[1:] - weight.esc_ptr[:-1]).double()
    accumulate = terms[None, :] * (2 * FP32_UNIT_ROUNDOFF) * magnitude
    out_ulp = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[out_dtype]
    bound = out_ulp * (exact.abs() + accumulate) + accumulate
    tiny = {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}[out_dtype]
    return exact, bound + tiny
