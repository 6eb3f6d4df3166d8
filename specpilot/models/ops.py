"""Elementwise pieces of a decoder block, fused on GPU.

Between the projections, a block does only cheap elementwise work (RMSNorm, q/k norm, RoPE, the
residual add, SiLU x up). In eager PyTorch that is ~40 tiny kernels per layer, several
milliseconds per token on an 8B model: more than its whole weight-streaming floor. Each function
here is written once in plain PyTorch (the exact HF math, used as is on CPU) and, on CUDA, compiled
with `torch.compile` into one or two kernels reused by every layer (same shapes, weights passed as
arguments, and shapes symbolic, so one compilation serves all layers and all shapes).

`fusion_enabled()` is False on CPU and when `SPECPILOT_COMPILE=0`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specpilot import env
from specpilot.kernels import launch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(h + delta, rms_norm(h + delta)): the residual add fused with the next norm."""
    h = h + delta
    return h, rms_norm(h, weight, eps)


def qkv_norm_rope(qkv, q_weight, k_weight, cos, sin, H: int, Hkv: int, D: int, eps: float):
    """Split fused qkv [B,T,(H+2Hkv)D] into q [B,T,H,D], k, v [B,T,Hkv,D]; q/k norm (if weights) and RoPE."""
    B, T, _ = qkv.shape
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return q, k, v


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rms_norm_1p(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm (Gemma, Qwen3-Next): scales by (1 + w), all in float32, one rounding."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


def add_rms_norm_1p(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(h + delta, rms_norm_1p(h + delta)): the residual add fused with the next zero-centred norm."""
    h = h + delta
    return h, rms_norm_1p(h, weight, eps)


def gated_qkv_norm_rope(qkvg, q_weight, k_weight, cos, sin, H: int, Hkv: int, D: int, eps: float):
    """Split fused [q | k | v | gate] [B,T,(2H+2Hkv)D] into q [B,T,H,D], k, v [B,T,Hkv,D] and the
    output gate [B,T,H*D]; zero-centred q/k norms, then RoPE on the first cos.shape[-1] dims of each
    head (partial rotary; the rest pass through)."""
    B, T, _ = qkvg.shape
    q, k, v, gate = qkvg.split([H * D, Hkv * D, Hkv * D, H * D], dim=-1)
    q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
    q, k = rms_norm_1p(q, q_weight, eps), rms_norm_1p(k, k_weight, eps)
    R = cos.shape[-1]
    q = torch.cat([q[..., :R] * cos + rotate_half(q[..., :R]) * sin, q[..., R:]], dim=-1)
    k = torch.cat([k[..., :R] * cos + rotate_half(k[..., :R]) * sin, k[..., R:]], dim=-1)
    return q, k, v, gate


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated DeltaNet's output norm: w * rmsnorm(x), times silu(gate) in float32 (per head, over its last dim)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(x.dtype)
    return (h * F.silu(gate.float())).to(x.dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, zero_centered: bool) -> torch.Tensor:
    """Gemma's RMSNorm over the last dim, in float32 with one rounding: scale (1 + w) (Gemma-3) or w
    (Gemma-4; none without a weight, its v norm), each written as transformers computes it."""
    h = x.float()
    if zero_centered:
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return (h * (1.0 + weight.float())).to(x.dtype)
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (h if weight is None else h * weight.float()).to(x.dtype)


def gemma_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                    zero_centered: bool) -> torch.Tensor:
    """Gemma's q (or k) norm, then RoPE: x [B,T,H,D], cos/sin broadcastable to it."""
    x = gemma_rms_norm(x, weight, eps, zero_centered)
    return x * cos + rotate_half(x) * sin


def gemma_add_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                   zero_centered: bool) -> torch.Tensor:
    """h + gemma_rms_norm(delta): a sublayer's output normed (Gemma's post-norm) into the residual."""
    return h + gemma_rms_norm(delta, weight, eps, zero_centered)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up of a fused [.., 2I] gate|up projection (Gemma's MLP)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def attention_bias(mask: torch.Tensor, dtype: torch.dtype, groups: int = 1) -> torch.Tensor:
    """The additive attention bias of a bool mask [B,X,T,S] (True: may attend): 0 or -inf in
    `dtype`, [B,X,groups*T,S], the mask repeated for the `groups` query heads of a KV group folded
    into the query axis (head h = j*G + g, as `CachedAttention.attend_over_cache` folds them). Two
    kernels (a fill and a masked fill through the expanded mask), no host tensors: CUDA-graph safe."""
    B, X, T, S = mask.shape
    bias = torch.full((B, X, groups, T, S), float("-inf"), dtype=dtype, device=mask.device)
    return bias.masked_fill_(mask[:, :, None].expand(B, X, groups, T, S), 0.0).view(B, X, groups * T, S)


def fusion_enabled(device: torch.device) -> bool:
    return device.type == "cuda" and env.compile_enabled()


# the ops `fused` hands out, by name (a plain dict: Dynamo traces a lookup in it, not `globals()`)
FUSABLE = {fn.__name__: fn for fn in (rms_norm, add_rms_norm, qkv_norm_rope, silu_mul, rms_norm_1p, add_rms_norm_1p,
                                      gated_qkv_norm_rope, gated_rms_norm, gemma_rms_norm, gemma_norm_rope,
                                      gemma_add_norm, gelu_tanh_mul)}


# Compilations one op may keep. dynamic=True makes batch sizes and token counts symbolic, but
# Dynamo still compiles a new entry per tensor rank (a norm on [B,T,C] and on q/k [B,T,H,D]), per
# dtype, per eps, and for size 1 apart from sizes >= 2 (a decode step apart from a prefill). One
# process that runs several models, dtypes or systems (the loop's loaded process, the GPU tests)
# passes torch's default of 8 entries, and with fullgraph=True the 9th is a hard error.
RECOMPILE_LIMIT = 64


def allow_recompiles() -> None:
    """Raise Dynamo's per-function recompile limit to at least RECOMPILE_LIMIT (process-wide, as
    serving engines do; never lowered)."""
    config = torch._dynamo.config
    if config.recompile_limit < RECOMPILE_LIMIT:
        config.recompile_limit = RECOMPILE_LIMIT
    if config.accumulated_recompile_limit < 8 * RECOMPILE_LIMIT:
        config.accumulated_recompile_limit = 8 * RECOMPILE_LIMIT


def inductor_options(device: torch.device) -> dict | None:
    """Inductor's options for code compiled for `device`: its Triton kernels launched with
    programmatic dependent launch where ours are (`kernels.launch.pdl`, SPECPILOT_PDL=1) and this
    torch has the option; else None (the defaults)."""
    if not launch.pdl(device):
        return None
    import torch._inductor.config as inductor_config

    return {"triton.enable_pdl": True} if hasattr(inductor_config.triton, "enable_pdl") else None


@functools.cache
def _compiled(name: str, backend: str = "inductor", pdl: bool = False):
    # dynamic=True: one compilation serves every batch size and token count (decode step, tree
    # verification, draft expansions, prefill); with static shapes each new (B, T) recompiles, and
    # a real workload soon hits torch.compile's recompile limit.
    allow_recompiles()  # process-wide, so once, at the first compilation
    options = {"triton.enable_pdl": True} if pdl else None
    return torch.compile(FUSABLE[name], dynamic=True, fullgraph=True, backend=backend, options=options)


def fused(name: str, device: torch.device):
    """The op `name`: compiled on CUDA when fusion is enabled, plain otherwise, and plain inside a
    torch.compile trace (`compiled_static`), where the enclosing compilation fuses it with its
    neighbours: a compiled op called there would end the traced graph (a graph break per forward)."""
    if torch.compiler.is_compiling() or not fusion_enabled(device):
        return FUSABLE[name]
    return _compiled(name, pdl=True) if inductor_options(device) is not None else _compiled(name)


# backend of `compiled_static`: a torch.compile backend name or callable (the CPU tests trace with
# Dynamo and run the captured graphs as they are)
STATIC_BACKEND = "inductor"


def compiled_static(fn, device: torch.device):
    """`fn` (a drafter's proposal, a round's verification) under torch.compile with static shapes: each
    (batch, tokens, cache) shape compiles once, and everything between the projections (the
    additive mask, RoPE gathers, cache writes, the elementwise pieces above) fuses into a few
    kernels per layer, where the eager forward launches dozens. For calls of one shape repeated
    every round; on CPU, or with SPECPILOT_COMPILE=0, `fn` itself."""
    if STATIC_BACKEND == "inductor" and not fusion_enabled(device):
        return fn
    allow_recompiles()
    if STATIC_BACKEND == "inductor":
        return torch.compile(fn, dynamic=False, backend=STATIC_BACKEND, options=inductor_options(device))
    return torch.compile(fn, dynamic=False, backend=STATIC_BACKEND)
