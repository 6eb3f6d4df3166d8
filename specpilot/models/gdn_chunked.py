"""The gated delta rule over a whole sequence in chunks: the parallel form for training and prefill.

Within a chunk of L tokens, with G_t the cumulative log-decay since the chunk's start and S the
state entering it, the delta rule's L sequential updates collapse (the WY / UT transform of
DeltaNet) into a unit lower-triangular solve and a few matmuls:

    A[i,j] = beta_i exp(G_i - G_j) k_i.k_j   for j < i          (L x L, strictly lower)
    U = (I + A)^-1 (beta * V),   W = (I + A)^-1 (beta * exp(G) * K)
    V' = U - W S                                                 (what S does not already predict)
    O = (exp(G) * Q) S + (Q K^T * exp(G_i - G_j), j <= i) V'
    S <- exp(G_L) S + (exp(G_L - G) * K)^T V'

It computes what `gdn.chunk_scan` computes, up to float32 rounding (not bit for bit: the engine's
decode paths use the sequential form). Differentiable, so training runs through it.

Owns this function only; the layer and the sequential reference are in `models.gdn`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunked_scan(q, k, v, g, beta, S0: torch.Tensor | None = None, chunk: int = 64):
    """q, k [B,T,H,Dk] (normalised, q scaled), v [B,T,H,Dv], g, beta [B,T,H], all float32; S0
    [B,H,Dk,Dv] or None (zeros). Returns outputs [B,T,H,Dv] and the final state [B,H,Dk,Dv].
    Float32 throughout, autocast or not: the triangular solve is ill-conditioned in bf16."""
    with torch.autocast(q.device.type, enabled=False):
        return _chunked(q.float(), k.float(), v.float(), g.float(), beta.float(), S0, chunk)


def _chunked(q, k, v, g, beta, S0, chunk: int):
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    pad = (-T) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))  # padding: no decay, no write
    n = (T + pad) // chunk
    # [B,H,n,L,...]
    q, k, v = (x.transpose(1, 2).reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.transpose(1, 2).reshape(B, H, n, chunk) for x in (g, beta))
    G = g.cumsum(-1)  # [B,H,n,L]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [B,H,n,L,L]
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay
    A = A.masked_fill(lower.logical_not() | torch.eye(chunk, dtype=torch.bool, device=q.device), 0.0)
    eye = torch.eye(chunk, dtype=A.dtype, device=A.device)
    U = torch.linalg.solve_triangular(eye + A, v * beta[..., None], upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(eye + A, kb * G.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # [B,H,n,L,L], j <= i
    qg = q * G.exp()[..., None]
    last = G[..., -1:]  # [B,H,n,1]
    kg = k * (last - G).exp()[..., None]
    S = torch.zeros(B, H, Dk, Dv, dtype=q.dtype, device=q.device) if S0 is None else S0
    out = []
    for c in range(n):
        Vn = U[:, :, c] - W[:, :, c] @ S
        out.append(qg[:, :, c] @ S + attn[:, :, c] @ Vn)
        S = S * last[:, :, c, :, None].exp() + kg[:, :, c].transpose(-1, -2) @ Vn
    o = torch.stack(out, 2).reshape(B, H, n * chunk, Dv)[:, :, :T].transpose(1, 2)
    return o, S
