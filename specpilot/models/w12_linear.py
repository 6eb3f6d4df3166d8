"""`W12Linear`: the module the engine runs for a projection stored in W12.

Owns the nn.Module face of a `W12Weight`: its planes as buffers (so `.to(device)`, `deepcopy`
with a memo, and state dicts treat them like any weight), and the forward y = x @ W.T in x's
dtype. On CUDA (or on CPU under TRITON_INTERPRET=1) the forward runs the Triton kernels, which
decode in registers while streaming, through `specpilot::linear` (`kernels.op`: one opaque op
under torch.compile); elsewhere, or without Triton, it decodes with the reference
codec and calls `F.linear` -- bit-identical weights, so a CPU model loaded from a W12 checkpoint
gives exactly the logits of the BF16 original. Does not own the kernels (`specpilot.kernels`) or
the format (`specpilot.w12`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.kernels import dispatch, op
from specpilot.w12.codec import decode
from specpilot.w12.weight import PLANES, W12Weight


class W12Linear(nn.Module):
    """y = x @ W.T for a W12-encoded W [N, K] (no bias)."""

    def __init__(self, weight: W12Weight, table: str = ""):
        super().__init__()
        self.table = table  # a candidate's tuned table over the device's (`kernels.configs.tuned_table`)
        self.out_features, self.in_features = weight.shape
        for name, tensor in weight.planes().items():
            self.register_buffer(name, tensor)
        self._view: W12Weight | None = None  # the buffers as a W12Weight, rebuilt when they change
        self.handle = op.register(self, "weight_w12")  # names the weight to `specpilot::linear`

    def __setstate__(self, state):  # a copy (deepcopy, pickle) names its own weight
        super().__setstate__(state)
        self.handle = op.register(self, "weight_w12")

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> W12Linear:
        """Encode an nn.Linear's BF16 weight (bias must be absent)."""
        from specpilot.w12.codec import encode, exact_bf16

        if linear.bias is not None:
            raise ValueError("W12Linear does not support a bias (decoder projections have none)")
        return cls(encode(exact_bf16(linear.weight, "linear")))

    @property
    def weight_w12(self) -> W12Weight:
        view, buffers = self._view, self._buffers  # every forward asks: `_buffers`, not Module.__getattr__
        if view is None or any(getattr(view, n) is not buffers[n] for n in PLANES):  # .to(), load_state_dict
            planes = {n: buffers[n] for n in PLANES}
            view = self._view = W12Weight.from_planes((self.out_features, self.in_features), planes)
        return view

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        if dispatch.kernels_available(x):
            return op.linear(x, self.handle, self.table)
        return F.linear(x, decode(self.weight_w12).to(x.dtype))

    def extra_repr(self) -> str:
        w = self.weight_w12
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"escapes={w.num_escapes}, bits/weight={w.bits_per_weight:.3f}")
