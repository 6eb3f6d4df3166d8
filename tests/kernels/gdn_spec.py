"""An independent reference of the Gated DeltaNet step, for the kernels' tests: written apart from
`specpilot.kernels.gdn` (whose torch fallback is the package's own reference), with trees run depth
by depth (every node of one depth from its parent's state) rather than node by node."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot.models.recurrence import Recurrence


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """log-decay g and write strength beta [B,T,Hv] in float32, as transformers computes them."""
    beta = b.sigmoid().float()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def heads(y: torch.Tensor, config):
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
