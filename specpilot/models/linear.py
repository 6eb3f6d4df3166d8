"""The kernels as modules: `TritonLinear`, and `swap_projections`, what the engine calls for
`kernel = "triton"`.

`TritonLinear` runs plain (BF16) weights through the same GEMV/GEMM kernels as `W12Linear` reads
W12 with, so a benchmark can separate kernel quality from the format's byte savings; its weight is
the original `nn.Linear`'s parameter (shared, not copied). Its kernels run through
`specpilot::linear` (`kernels.op`), one opaque op under torch.compile; it falls back to `F.linear`
where the kernels cannot run (CPU without TRITON_INTERPRET=1, no Triton). `swap_projections` turns every
block projection (qkv, o, gate_up, down) and optionally lm_head into a `TritonLinear` or a
`W12Linear` (weights encoded on the fly, refused unless they are exactly BF16: W12 is lossless by
contract). Does not own the kernels (`specpilot.kernels.dispatch`), which modules count as projections
(`specpilot.models.transformer.replace_linears`) or `W12Linear` (`specpilot.models.w12_linear`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.errors import ConfigError
from specpilot.kernels import dispatch, op
from specpilot.models.transformer import replace_linears


class TritonLinear(nn.Module):
    """y = x @ weight.T with our Triton kernels (no bias: decoder projections have none)."""

    def __init__(self, weight: torch.Tensor, table: str = ""):
        super().__init__()
        self.table = table  # a candidate's tuned table over the device's (`kernels.configs.tuned_table`)
        if weight.dim() != 2:
            raise ValueError(f"TritonLinear needs a 2-D weight [N, K], got shape {list(weight.shape)}")
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.out_features, self.in_features = weight.shape
        self.handle = op.register(self, "weight")  # names the weight to `specpilot::linear`

    def __setstate__(self, state):  # a copy (deepcopy, pickle) names its own weight
        super().__setstate__(state)
        self.handle = op.register(self, "weight")

    @classmethod
    def from_linear(cls, linear: nn.Linear, table: str = "") -> TritonLinear:
        if linear.bias is not None:
            raise ValueError("TritonLinear does not support a bias (decoder projections have none)")
        return cls(linear.weight, table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        if dispatch.kernels_available(x):
            return op.linear(x, self.handle, self.table)
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.weight.dtype}"


def swap_projections(model: nn.Module, w12: bool, lm_head: bool = False, table: str = "",
                     heads: tuple[str, ...] = ()) -> int:
    """Replace projections (and the lm_head, and `heads`: see `replace_linears`) by `W12Linear`
    (w12) or `TritonLinear` modules that choose their kernels from `table` (a `kernel_table` knob)
    over the device's tuned table; returns how many."""
    from specpilot.models.w12_linear import W12Linear
    from specpilot.w12.codec import encode, exact_bf16

    def make(name: str, linear: nn.Linear) -> nn.Module:
        if linear.bias is not None:
            raise ConfigError(f"{name}: projections with a bias are not supported by the Triton kernels")
        if not w12:
            return TritonLinear.from_linear(linear, table)
        return W12Linear(encode(exact_bf16(linear.weight, name)), table)

    return replace_linears(model, make, lm_head=lm_head, heads=heads)
