"""The decode cache of a hybrid decoder: K/V of its attention layers, states of its recurrent layers.

Per row, next to the static KV cache of the full-attention layers (`KVCache`), every Gated DeltaNet
layer keeps a fixed-size state that does not grow with the sequence:

- `state`  [B,Hv,Dk,Dv] float32: the recurrent state after the row's last committed token;
- `window` [B,K-1,Cc]: the conv inputs of the last K-1 committed tokens, oldest first;

and a scratch written by each tree forward (`models.recurrence`):

- `node_state` [B,N,Hv,Dk,Dv] float32 and `node_input` [B,N,Cc]: every node's state and conv input.

States stay in float32 everywhere (committed, scratch): a tree node's state is then bit for bit the
one a sequential decode of its path computes, and committing it changes nothing.

`commit_path` is the engine's one commit: the attention layers move the accepted path's K/V
entries (`KVCache.commit_path`), and each recurrent layer takes the deepest accepted node's state
and the conv inputs of the K-1 tokens ending there, in active rows only (a done row, e.g. one
still prefilling under continuous batching, keeps its state). Every layer's tensors are views of
one stacked buffer per kind, so a commit is a few kernels for all layers, as for the KV cache.

Owns: allocation, row/span views, the commit. Does not own what the layers compute (`models.gdn`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.models.config import ModelConfig
from specpilot.models.kv_cache import KVCache


@dataclass
class HybridCache:
    kv: KVCache  # the attention layers', in their order
    state_stack: torch.Tensor  # [L,B,Hv,Dk,Dv] float32, L = recurrent layers
    window_stack: torch.Tensor  # [L,B,K-1,Cc]
    node_state_stack: torch.Tensor  # [L,B,N,Hv,Dk,Dv] float32
    node_input_stack: torch.Tensor  # [L,B,N,Cc]
    # no packed prefill: a chunk continues its own row's recurrent state, which a batch-1 packing
    # cache does not hold
    packable = False

    @classmethod
    def allocate(cls, config: ModelConfig, batch: int, capacity: int, device, dtype, nodes: int = 1) -> "HybridCache":
        """Buffers for `batch` rows of `capacity` slots, and a scratch for trees of up to `nodes` nodes."""
        c = config
        L, K = len(c.linear_layers), c.linear_conv_kernel_dim
        S = (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
        f32 = dict(device=device, dtype=torch.float32)
        return cls(
            KVCache.allocate(config, batch, capacity, device, dtype),
            torch.zeros(L, batch, *S, **f32),
            torch.zeros(L, batch, K - 1, c.conv_dim, device=device, dtype=dtype),
            torch.zeros(L, batch, nodes, *S, **f32),
            torch.zeros(L, batch, nodes, c.conv_dim, device=device, dtype=dtype),
        )

    # the layers' views (`models.recurrence.RecurrentCache`; attention layers read k, v)
    @property
    def k(self) -> list[torch.Tensor]:
        return self.kv.k

    @property
    def v(self) -> list[torch.Tensor]:
        return self.kv.v

    @property
    def state(self) -> list[torch.Tensor]:
        return list(self.state_stack.unbind(0))

    @property
    def window(self) -> list[torch.Tensor]:
        return list(self.window_stack.unbind(0))

    @property
    def node_state(self) -> list[torch.Tensor]:
        return list(self.node_state_stack.unbind(0))

    @property
    def node_input(self) -> list[torch.Tensor]:
        return list(self.node_input_stack.unbind(0))

    @property
    def batch(self) -> int:
        return self.state_stack.shape[1]

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    @property
    def nodes(self) -> int:
        """The largest tree a forward may run (the scratch's node count)."""
        return self.node_state_stack.shape[2]

    def nbytes(self) -> int:
        stacks = (self.state_stack, self.window_stack, self.node_state_stack, self.node_input_stack)
        return self.kv.nbytes() + sum(t.numel() * t.element_size() for t in stacks)

    def row(self, b: int) -> "HybridCache":
        """A view of row `b` (writes go to the shared buffers)."""
        r = slice(b, b + 1)
        return HybridCache(self.kv.row(b), self.state_stack[:, r], self.window_stack[:, r],
                           self.node_state_stack[:, r], self.node_input_stack[:, r])

    def span(self, n: int) -> "HybridCache":
        """Attention over slots 0..n-1 only (`KVCache.span`); the recurrent states are whole."""
        return HybridCache(self.kv.span(n), self.state_stack, self.window_stack, self.node_state_stack,
                           self.node_input_stack)

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.kv.move_slots(src, dst)

    def commit_path(self, prefix: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor,
                    active: torch.Tensor | None = None) -> None:
        """Commit each active row's accepted path of the last tree forward (see the module
        docstring). prefix, accept_len [B]; path [B,K+1] node indices by depth (-1 past the path)."""
        self.kv.commit_path(prefix, path, accept_len, active)
        L, B = self.state_stack.shape[:2]
        if L == 0:
            return
        rows = torch.arange(B, device=path.device)
        live = torch.ones(B, dtype=torch.bool, device=path.device) if active is None else active
        best = path.gather(1, accept_len[:, None])[:, 0]  # [B] the deepest accepted node
        S = self.node_state_stack[:, rows, best]  # [L,B,Hv,Dk,Dv]
        self.state_stack.copy_(torch.where(live[None, :, None, None, None], S, self.state_stack))
        Km1, Cc = self.window_stack.shape[2:]
        inputs = self.node_input_stack[:, rows[:, None], path.clamp(min=0)]  # [L,B,K+1,Cc]
        full = torch.cat([self.window_stack, inputs], dim=2)  # [L,B,K-1+K+1,Cc]
        idx = accept_len[:, None] + 1 + torch.arange(Km1, device=path.device)  # [B,K-1]
        new = full.gather(2, idx[None, :, :, None].expand(L, B, Km1, Cc))
        self.window_stack.copy_(torch.where(live[None, :, None, None], new, self.window_stack))
