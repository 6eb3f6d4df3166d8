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
node's is its ancestors (`models.recurrence`). `step` is the one update every path uses, so a
tree node's state is bit for bit the state a sequential decode of its root path computes.

Owns: the layer module (`GatedDeltaNet`) and the reference math in plain PyTorch: conv windows
along tree paths, the chunk scan, the depth-parallel tree scan (nodes of one depth are
independent: max_depth + 1 passes over all nodes, graph-capturable), and committing a causal
chunk's state. Does not own the state buffers (the engine's cache) or the GPU kernels
(`specpilot.kernels.gdn`, which compute the same thing).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.models import ops
from specpilot.models.config import ModelConfig
from specpilot.models.recurrence import Recurrence


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """log-decay g and write strength beta [B,T,Hv] in float32, as transformers computes them."""
    beta = b.sigmoid().float()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def heads(y: torch.Tensor, config: ModelConfig):
    """Conv output y [B,T,Cc] -> q, k [B,T,Hv,Dk] (normalised, q scaled, each key head repeated for
    its value heads) and v [B,T,Hv,Dv], all float32."""
    B, T, _ = y.shape
    Hk, Hv, Dk, Dv = (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                      config.linear_value_head_dim)
    q, k, v = y.split([Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
    q, k = q.reshape(B, T, Hk, Dk).float(), k.reshape(B, T, Hk, Dk).float()
    if Hv != Hk:
        q, k = q.repeat_interleave(Hv // Hk, dim=2), k.repeat_interleave(Hv // Hk, dim=2)
    q = l2norm(q) * Dk**-0.5
    return q, l2norm(k), v.reshape(B, T, Hv, Dv).float()


def step(S, q, k, v, g, beta):
    """One gated delta rule update. S [...,Hv,Dk,Dv]; q, k [...,Hv,Dk]; v [...,Hv,Dv]; g, beta [...,Hv].
    Returns (S', o [...,Hv,Dv]), float32."""
    S = S * g.exp()[..., None, None]
    kv = (S * k[..., :, None]).sum(-2)  # [...,Hv,Dv]
    delta = (v - kv) * beta[..., None]
    S = S + k[..., :, None] * delta[..., None, :]
    return S, (S * q[..., :, None]).sum(-2)


def chunk_scan(q, k, v, g, beta, S0, commit):
    """A causal chunk from S0 [B,Hv,Dk,Dv]: outputs [B,T,Hv,Dv] and the state after token commit[b]
    (S0 where commit[b] < 0)."""
    T = q.shape[1]
    S, kept, out = S0, S0, []
    for t in range(T):
        S, o = step(S, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        out.append(o)
        kept = torch.where((commit == t)[:, None, None, None], S, kept)
    return torch.stack(out, 1), kept


def tree_scan(q, k, v, g, beta, S0, parents, depths, max_depth: int):
    """Every node of a tree from its parent's state (the root's parent: S0 [B,Hv,Dk,Dv]), depth by
    depth: outputs [B,N,Hv,Dv] and node states [B,N,Hv,Dk,Dv]."""
    B, N = parents.shape
    nodes = S0[:, None].expand(B, N, *S0.shape[1:]).contiguous()
    out = torch.zeros_like(v)
    at_root = (parents < 0)[..., None, None, None]
    idx = parents.clamp(min=0)[..., None, None, None].expand_as(nodes)
    for d in range(max_depth + 1):
        prev = torch.where(at_root, S0[:, None], nodes.gather(1, idx))
        S, o = step(prev, q, k, v, g, beta)
        here = depths == d
        nodes = torch.where(here[..., None, None, None], S, nodes)
        out = torch.where(here[..., None, None], o, out)
    return out, nodes


def window_index(T: int, K: int, rec: Recurrence, device) -> torch.Tensor:
    """[B or 1,T,K] indices into cat(committed window [K-1], chunk inputs [T]) of each token's conv
    inputs, oldest first (the token itself last): its K-1 nearest ancestors in the chunk, then the
    committed window's newest entries."""
    t = torch.arange(T, device=device)
    if not rec.is_tree:
        j = torch.arange(K - 1, -1, -1, device=device)  # distance back, oldest first
        return (K - 1 + t[:, None] - j[None, :])[None]  # below K-1: the committed window
    parents, depths = rec.parents, rec.depths
    cols = [K - 1 + t.expand_as(parents)]
    anc = parents
    for j in range(1, K):
        cols.append(torch.where(j <= depths, K - 1 + anc.clamp(min=0), K - 1 - (j - depths)))
        anc = torch.where(anc >= 0, parents.gather(1, anc.clamp(min=0)), anc)
    return torch.stack(cols[::-1], dim=-1)


def conv_windows(x: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, rec: Recurrence) -> torch.Tensor:
    """Each token's conv inputs [B,T,K,Cc] along its history; inputs before position 0 are zeros.
    x [B,T,Cc]; window [B,K-1,Cc] the committed tokens' inputs."""
    B, T, Cc = x.shape
    K = window.shape[1] + 1
    full = torch.cat([window, x], dim=1)  # [B,K-1+T,Cc]
    idx = window_index(T, K, rec, x.device).expand(B, T, K)
    win = full.gather(1, idx.reshape(B, T * K, 1).expand(B, T * K, Cc)).view(B, T, K, Cc)
    back = torch.arange(K - 1, -1, -1, device=x.device)
    live = (positions[:, :, None] - back) >= 0  # [B,T,K]
    return win * live[..., None].to(win.dtype)


def causal_conv(win: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(depthwise conv) [B,T,Cc] of windows [B,T,K,Cc] with weight [Cc,K], rounded to the
    input dtype before the SiLU as transformers' conv does."""
    y = (win.float() * weight.float().t()).sum(2)
    return F.silu(y.to(win.dtype))


def commit_window(window: torch.Tensor, x: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The conv inputs of the K-1 tokens ending at chunk token last[b] (window [B,K-1,Cc], x [B,T,Cc]);
    the old window where last[b] < 0."""
    B, Km1, Cc = window.shape
    full = torch.cat([window, x], dim=1)
    idx = last.clamp(min=-1)[:, None] + 1 + torch.arange(Km1, device=x.device)  # [B,K-1]
    new = full.gather(1, idx[..., None].expand(B, Km1, Cc))
    return torch.where((last >= 0)[:, None, None], new, window)


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
        y = causal_conv(conv_windows(xin, window, positions, rec), self.conv_weight)
        q, k, v = heads(y, c)
        g, beta = gates(a, b, self.A_log, self.dt_bias)
        fresh = (positions[:, 0] == 0)[:, None, None, None]  # the root / first token starts a sequence
        S0 = torch.where(fresh, torch.zeros_like(cache.state[j]), cache.state[j])
        if rec.is_tree:
            o, nodes = tree_scan(q, k, v, g, beta, S0, rec.parents, rec.depths, rec.max_depth)
            cache.node_state[j][:, :T] = nodes
            cache.node_input[j][:, :T] = xin
        else:
            o, kept = chunk_scan(q, k, v, g, beta, S0, rec.commit)
            cache.state[j].copy_(torch.where((rec.commit >= 0)[:, None, None, None], kept, cache.state[j]))
            cache.window[j].copy_(commit_window(window, xin, rec.commit))
        o = (fuse or ops.gated_rms_norm)(o.to(x.dtype), z.reshape(B, T, Hv, Dv), self.norm.weight, c.rms_norm_eps)
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
        g, beta = gates(a, b, self.A_log, self.dt_bias)
        o, _ = chunked_scan(q, k, v, g, beta)
        o = ops.gated_rms_norm(o.to(x.dtype), z.reshape(B, T, Hv, Dv), self.norm.weight, c.rms_norm_eps)
        return self.out_proj(o.reshape(B, T, Hv * Dv))
