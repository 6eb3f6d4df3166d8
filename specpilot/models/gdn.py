"""Gated DeltaNet (GDN), the linear-attention layer of the hybrid Qwen3-Next / Qwen3.5 decoders.

Per token (Qwen3-Next conventions, transformers' `modeling_qwen3_next.py` and the fla kernels):
one projection gives [q | k | v] (the conv input x, Cc channels), z, b and a; a causal depthwise
conv of width K (SiLU) runs over x along the token's own history; q and k are L2-normalised (q
scaled by Dk^-0.5) and each of the Hk key heads serves Hv / Hk value heads; then per value head a
state S [Dk,Dv] in float32 evolves by the gated delta rule

    S <- exp(g) S;   u = beta (v - S^T k);   S <- S + k u^T;   o = S^T q

with g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b); o goes through an RMSNorm gated
by silu(z) and the output projection.

*History* means the token's root path: a causal chunk's history is the tokens before it, a tree
node's is its ancestors (`models.recurrence`). The conv and the recurrence run in
`specpilot.kernels.gdn` (Triton kernels on the GPU, their pure-torch reference elsewhere; one code
path for chunks and trees, so a tree node's state is bit for bit what a sequential decode of its
root path computes).

Owns: the layer module (`GatedDeltaNet`: its decode forward through the cache, its cache-free
training forward through `gdn_chunked`). Does not own
the state buffers (the model's cache, `hybrid_cache.py`) or the kernels.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.kernels import gdn as kernels
from specpilot.models import ops
from specpilot.models.config import ModelConfig
from specpilot.models.recurrence import Recurrence


def heads(y: torch.Tensor, config: ModelConfig):
    """Conv output y [B,T,Cc] -> q, k [B,T,Hv,Dk] and v [B,T,Hv,Dv] in float32 (`kernels.gdn.heads`)."""
    c = config
    return kernels.heads(y, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                         c.linear_value_head_dim)


class GatedDeltaNet(nn.Module):
    """One GDN layer. Parameters in our fused layout (`models.hybrid` maps both HF layouts onto it):
    in_proj [Cc + Hv*Dv + 2 Hv, C] = [q | k | v | z | b | a]; conv_weight [Cc,K]; A_log, dt_bias [Hv];
    norm.weight [Dv]; out_proj [C, Hv*Dv]."""

    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.config = config
        self.index = index  # this layer's position among the recurrent layers (its cache entries)
        c = config
        Hv = c.linear_num_value_heads
        self.in_proj = nn.Linear(c.hidden_size, c.conv_dim + c.linear_value_dim + 2 * Hv, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(c.conv_dim, c.linear_conv_kernel_dim))
        self.A_log = nn.Parameter(torch.empty(Hv))
        self.dt_bias = nn.Parameter(torch.empty(Hv))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(c.linear_value_head_dim))
        self.out_proj = nn.Linear(c.linear_value_dim, c.hidden_size, bias=False)

    def forward(self, x, positions, cache, rec: Recurrence, packing=None, fuse=None):
        """x [B,T,C] (packed [1,M,C] with `packing`); positions [B,T]; `cache` a `RecurrentCache`.
        Returns the layer's output, [B,T,C] (or [1,M,C])."""
        c = self.config
        Hv, Dv = c.linear_num_value_heads, c.linear_value_head_dim
        proj = self.in_proj(x)
        if packing is not None:
            proj = packing.unpack(proj)
        B, T, _ = proj.shape
        xin, z, b, a = proj.split([c.conv_dim, c.linear_value_dim, Hv, Hv], dim=-1)
        j = self.index
        window = cache.window[j]
        step = not rec.is_tree and T == 1 and rec.commit is not None  # a decode step: the conv kernel moves the window on itself
        y = kernels.gdn_conv(xin, window, positions, self.conv_weight, rec.parents, rec.depths,
                             commit=rec.commit if step else None)  # [B,T,Cc]
        fresh = positions[:, 0] == 0  # the root / first token starts a sequence: the zero state
        Hk = c.linear_num_key_heads
        if rec.is_tree:
            o = kernels.gdn_recurrence(y, a, b, self.A_log, self.dt_bias, cache.state[j], fresh, Hk,
                                       parents=rec.parents, node_state=cache.node_state[j])
            cache.node_input[j][:, :T] = xin
        else:
            o = kernels.gdn_recurrence(y, a, b, self.A_log, self.dt_bias, cache.state[j], fresh, Hk,
                                       commit=rec.commit)
            if not step:
                cache.window[j].copy_(kernels.commit_window(window, xin, rec.commit))
        o = (fuse or ops.gated_rms_norm)(o, z.reshape(B, T, Hv, Dv), self.norm.weight, c.rms_norm_eps)
        o = o.reshape(B, T, Hv * Dv)
        return self.out_proj(packing.pack(o) if packing is not None else o)

    def forward_causal(self, x: torch.Tensor) -> torch.Tensor:
        """x [B,T,C] from the zero state, no cache, differentiable (training, teacher forcing): the
        conv as a padded conv1d and the recurrence in chunks (`gdn_chunked`)."""
        from specpilot.models.gdn_chunked import chunked_scan

        c = self.config
        B, T, _ = x.shape
        Hv, Dv, K = c.linear_num_value_heads, c.linear_value_head_dim, c.linear_conv_kernel_dim
        xin, z, b, a = self.in_proj(x).split([c.conv_dim, c.linear_value_dim, Hv, Hv], dim=-1)
        y = F.conv1d(xin.transpose(1, 2), self.conv_weight[:, None].to(xin.dtype), padding=K - 1,
                     groups=c.conv_dim)[..., :T]
        q, k, v = heads(F.silu(y).transpose(1, 2), c)
        g, beta = kernels.gates(a, b, self.A_log, self.dt_bias)
        o, _ = chunked_scan(q, k, v, g, beta)
        o = ops.gated_rms_norm(o.to(x.dtype), z.reshape(B, T, Hv, Dv), self.norm.weight, c.rms_norm_eps)
        return self.out_proj(o.reshape(B, T, Hv * Dv))
