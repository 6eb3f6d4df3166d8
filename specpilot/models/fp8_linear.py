"""`FP8Weight` and `FP8Linear`: a projection stored as float8 e4m3 weights with float32 scales.

Owns the in-memory form every FP8 checkpoint layout is read into (`models.fp8_checkpoint` parses
block-wise 128x128, per-channel and per-tensor layouts) and the module the decoders run for it.
One form for all layouts: the e4m3 codes `data` [N, K] and a row-wise scale grid `scale`
[N, ceil(K / block_k)] -- a block-wise layout has its block rows expanded to one scale row per
weight row, per-channel is `block_k = K`, per-tensor is the per-channel grid with one value. Rows
of this form fuse, split and permute freely (q/k/v -> qkv, the hybrid layouts' row orders),
which a 128-row block grid does not when a part has fewer rows than a block.

Dequantization rule (the reference, and what "the FP8 target" means for losslessness):
    W[n, k] = float32(data[n, k]) * scale[n, k // block_k], rounded once to the activation dtype,
and y = F.linear(x, W). The reference path is weight-only even where the layout says W8A8
(`Activation.DYNAMIC`: per-token e4m3 activations; `Activation.STATIC`: one input scale): how
activations are quantized is a GPU kernel choice, a different function of the same checkpoint, that
the guard must judge against this reference like any other kernel.

Which computation `FP8Linear` runs is its `kernel` (`kernels.fp8_dispatch.FP8Kernel`, a registry
by name): `auto` (the default) takes the Triton weight-only kernel on CUDA and this reference
elsewhere, so CPU models decode exactly as before; `reference` forces the rule above anywhere;
`triton`, `w8a8-triton`, `w8a8-scaled-mm` name a kernel (an error where it cannot run).
`set_fp8_kernel` sets it on every FP8 projection of a model. Does not own checkpoint parsing or
conversion (`models.fp8_checkpoint`) or any GPU kernel (`kernels.fp8_gemm`, `kernels.fp8_dispatch`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3fn magnitude


class Activation(enum.Enum):
    """How the layout says activations are treated (the CPU reference ignores it: weight-only)."""
    NONE = "none"        # weight-only FP8
    DYNAMIC = "dynamic"  # W8A8, per-token activation scales computed at run time
    STATIC = "static"    # W8A8, one calibrated input scale per projection (`input_scale`)


@dataclass(frozen=True)
class FP8Weight:
    """An e4m3 weight [N, K] with its row-wise scale grid [N, Kb] (Kb = ceil(K / block_k))."""
    data: torch.Tensor   # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [N, Kb] float32, multiplies the codes (a checkpoint's `weight_scale_inv`)
    block_k: int
    activation: Activation = Activation.NONE
    input_scale: torch.Tensor | None = None  # [N] float32, only for Activation.STATIC (per fused part)

    def __post_init__(self):
        N, K = self.data.shape
        if self.data.dtype != E4M3 or self.scale.dtype != torch.float32:
            raise ValueError(f"FP8Weight needs e4m3 data and float32 scales, got {self.data.dtype}, {self.scale.dtype}")
        if tuple(self.scale.shape) != (N, -(-K // self.block_k)):
            raise ValueError(f"FP8Weight scale shape {list(self.scale.shape)} does not fit data {[N, K]} "
                             f"with block_k={self.block_k}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [N, K] by the module's dequantization rule."""
        K = self.data.shape[1]
        scale = self.scale.repeat_interleave(self.block_k, dim=1)[:, :K]  # [N, K]
        return (self.data.float() * scale).to(dtype)

    def to(self, device) -> FP8Weight:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return FP8Weight(move(self.data), move(self.scale), self.block_k, self.activation, move(self.input_scale))

    def _with_rows(self, data, scale, input_scale) -> FP8Weight:
        return FP8Weight(data, scale, self.block_k, self.activation, input_scale)

    def take_rows(self, index: torch.Tensor) -> FP8Weight:
        return self._with_rows(self.data[index], self.scale[index],
                               None if self.input_scale is None else self.input_scale[index])

    def split_rows(self, sizes: list[int]) -> list[FP8Weight]:
        parts = zip(self.data.split(sizes), self.scale.split(sizes),
                    self.input_scale.split(sizes) if self.input_scale is not None else [None] * len(sizes))
        return [self._with_rows(*p) for p in parts]

    @classmethod
    def concat_rows(cls, weights: list[FP8Weight]) -> FP8Weight:
        """Stack [N_i, K] parts into [sum N_i, K]; parts share block_k and activation scheme."""
        first = weights[0]
        if any(w.block_k != first.block_k or w.activation != first.activation for w in weights):
            raise ValueError("cannot fuse FP8 projections with different scale blocks or activation schemes")
        inputs = None if first.input_scale is None else torch.cat([w.input_scale for w in weights])
        return first._with_rows(torch.cat([w.data for w in weights]), torch.cat([w.scale for w in weights]), inputs)


class FP8Linear(nn.Module):
    """y = x @ W.T for an `FP8Weight` W [N, K] (no bias), W by the module docstring's rule."""

    def __init__(self, weight: FP8Weight, kernel: str = "auto"):
        super().__init__()
        from specpilot.kernels.fp8_dispatch import parse_kernel

        self.kernel = parse_kernel(kernel)  # which computation forward runs (module docstring)
        self.out_features, self.in_features = weight.shape
        self.block_k = weight.block_k
        self.activation = weight.activation
        self.register_buffer("weight_e4m3", weight.data)    # [N, K] e4m3
        self.register_buffer("weight_scale", weight.scale)  # [N, Kb] float32
        self.register_buffer("input_scale", weight.input_scale)  # [N] or None

    @property
    def weight_fp8(self) -> FP8Weight:
        return FP8Weight(self.weight_e4m3, self.weight_scale, self.block_k, self.activation, self.input_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        from specpilot.kernels import fp8_dispatch

        kernel = fp8_dispatch.resolve(self.kernel, x)
        if kernel is fp8_dispatch.FP8Kernel.REFERENCE:
            return F.linear(x, self.weight_fp8.dequantize(x.dtype))
        return fp8_dispatch.linear(x, self.weight_e4m3, self.weight_scale, self.block_k, kernel)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, block_k={self.block_k}, "
                f"activation={self.activation.value}, kernel={self.kernel.value}")


def set_fp8_kernel(model: nn.Module, kernel: str) -> int:
    """Run every `FP8Linear` of `model` by `kernel` (an `FP8Kernel` name); returns how many."""
    from specpilot.kernels.fp8_dispatch import parse_kernel

    chosen = parse_kernel(kernel)
    modules = [m for m in model.modules() if isinstance(m, FP8Linear)]
    for m in modules:
        m.kernel = chosen
    return len(modules)
