"""Scratch memory of the projections: the deterministic split-K reduction's, and decoded W12 weights.

Owns: one fixed-size buffer of float32 partial sums and one array of arrival counters per device,
allocated once (so CUDA graphs captured later keep valid addresses) and shared by every projection
on that device. The counters start at zero and the last split of each tile resets its counter, so
they are zero again after every launch. And the buffer W12 weights are decoded into before cuBLAS
(`unpack_buffer`), shared the same way.

Does not own choosing the split (`configs.auto_split_k`) or the reduction itself (`tiles.py`).
Projections sharing a workspace must run one after another on one stream at a time, as the
layers of a decoder do; two streams running projections concurrently need separate workspaces.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

PARTIAL_FLOATS = 1 << 23  # 32 MiB: split_k * M * N floats, e.g. 8 x 64 x 16384
COUNTERS = 1 << 17  # row tiles per launch (N / block_n)


@dataclass(frozen=True)
class SplitKWorkspace:
    partials: torch.Tensor  # [PARTIAL_FLOATS] float32
    counters: torch.Tensor  # [COUNTERS] int32, zero between launches

    @classmethod
    def allocate(cls, device: torch.device | str, partial_floats: int = PARTIAL_FLOATS,
                 counters: int = COUNTERS) -> SplitKWorkspace:
        return cls(
            partials=torch.empty(partial_floats, dtype=torch.float32, device=device),
            counters=torch.zeros(counters, dtype=torch.int32, device=device),
        )

    def fits(self, split_k: int, M: int, N: int, n_tiles: int) -> bool:
        return split_k * M * N <= self.partials.numel() and n_tiles <= self.counters.numel()


_lock = threading.Lock()
_shared: dict[torch.device, SplitKWorkspace] = {}


def shared_workspace(device: torch.device | str) -> SplitKWorkspace:
    """The workspace of `device`, allocated on first use."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _lock:
        ws = _shared.get(device)
        if ws is None:
            ws = _shared[device] = SplitKWorkspace.allocate(device)
        return ws


_unpacked: dict[torch.device, list[torch.Tensor]] = {}


def unpack_buffer(device: torch.device | str, N: int, K: int) -> torch.Tensor:
    """A BF16 [N, K] view of `device`'s shared buffer for decoded W12 weights (decode then cuBLAS,
    `dispatch.linear`), grown to the largest weight asked for. A grown buffer's predecessors stay
    allocated: CUDA graphs captured earlier keep their addresses."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _lock:
        buffers = _unpacked.setdefault(device, [])
        if not buffers or buffers[-1].numel() < N * K:
            buffers.append(torch.empty(N * K, dtype=torch.bfloat16, device=device))
        return buffers[-1][: N * K].view(N, K)
