"""Dynamic FP8 activation quantization for the W8A8 kernels: x [M, K] -> e4m3 codes and scales.

Owns the rule (the same for every W8A8 backend, so they compute one function): per activation
row and group of `group` columns (group = the weight's block_k: the whole row for per-channel
weights, 128 columns for block-wise 128x128 ones, as DeepSeek-style W8A8 does),
    scale = amax(|x_group|) / 448 (1 where the group is all zero),  code = e4m3(x / scale)
rounded to nearest even and clamped to +-448; x is recovered as code * scale. Pure torch ops,
capturable in a CUDA graph (no host syncs). Non-finite activations are refused by nothing here:
they give non-finite scales, and so non-finite outputs, as the weight-only path would.

Does not own the GEMM (`fp8_gemm`, `torch._scaled_mm` in `fp8_dispatch`).
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def quantize_activations(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [M, K] e4m3, scale [M, ceil(K / group)] float32) of x [M, K] by the module's rule."""
    if x.dim() != 2:
        raise ValueError(f"quantize_activations needs x [M, K], got {list(x.shape)}")
    if not isinstance(group, int) or group < 1:
        raise ValueError(f"quantize_activations needs a positive group size, got {group!r}")
    M, K = x.shape
    Kb = -(-K // group)
    xf = x.float()
    if Kb * group != K:
        xf = torch.nn.functional.pad(xf, (0, Kb * group - K))
    groups = xf.view(M, Kb, group)  # [M, Kb, group]
    amax = groups.abs().amax(dim=2)  # [M, Kb]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = (groups / scale[:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return codes.view(M, Kb * group)[:, :K].contiguous(), scale.contiguous()
