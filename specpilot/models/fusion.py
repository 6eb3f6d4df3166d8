"""Row-wise concatenation of projection weights (q/k/v -> qkv, gate/up -> gate_up).

Plain tensors concatenate with `torch.cat`; packed formats (W12) provide `concat_rows` on their
weight type, since their rows are stored independently.
"""

from __future__ import annotations

import torch


def concat_rows(weights: list) -> object:
    """Stack [N_i, K] weights into one [sum N_i, K] weight of the same kind."""
    if all(isinstance(w, torch.Tensor) for w in weights):
        return torch.cat(weights, dim=0)
    kinds = {type(w) for w in weights}
    if len(kinds) != 1:
        raise TypeError(f"cannot fuse projections stored in different formats: {sorted(k.__name__ for k in kinds)}")
    return kinds.pop().concat_rows(weights)
