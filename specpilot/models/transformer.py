"""Dense decoder (Llama and Qwen3 families) in plain PyTorch.

Owns: the forward pass over a static KV cache with an explicit attention mask (what AR decoding,
tree verification and drafting all use), a cache-free causal forward (training and teacher
forcing), RoPE with Llama-3 scaling, Qwen3's per-head q/k RMSNorm, GQA without materialising
repeated K/V, fused QKV and gate/up projections.

Does not own: where tokens go in the cache or what they may attend to (the engine computes
`slots`, `positions` and `mask`, see `specpilot.engine.tree`); loading weights (`loading.py`);
which kernel does a projection (any module with `weight`-shaped semantics `y = x @ W.T` can stand
in for `nn.Linear`, see `replace_linears`).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.models.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and scale after casting back, as the HF reference does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    D = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    s = config.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(config: ModelConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_positions, D] in float32 (HF's non-interleaved layout)."""
    inv = rope_inverse_frequencies(config)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, T, H, D]; cos/sin: [B, T, 1, D] already in x.dtype
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        H, Hkv, D, C = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
        self.qkv_proj = nn.Linear(C, (H + 2 * Hkv) * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(D, config.rms_norm_eps)
            self.k_norm = RMSNorm(D, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B,T,H,D], k and v [B,T,Hkv,D] with norms and RoPE applied."""
        B, T, _ = x.shape
        H, Hkv, D = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        q, k, v = self.qkv_proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward_cached(self, x, cos, sin, k_cache, v_cache, slots, mask):
        """Write this chunk's K/V at `slots`, attend over the whole static cache under `mask`.

        x [B,T,C]; k_cache, v_cache [B,Hkv,S,D]; slots [B,T] int64; mask [B,1,T,S] bool.
        """
        B, T, _ = x.shape
        H, Hkv, D = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        G = H // Hkv
        q, k, v = self.project(x, cos, sin)
        rows = torch.arange(B, device=x.device)[:, None].expand(B, T)
        k_cache[rows, :, slots] = k  # advanced indices first: [B,T,Hkv,D]
        v_cache[rows, :, slots] = v
        # GQA without repeating K/V: fold the G query heads of a group into the query axis.
        q = q.permute(0, 2, 1, 3).reshape(B, Hkv, G * T, D)  # [B,Hkv,G*T,D], head h = j*G + g
        m = mask.expand(B, G, T, mask.shape[-1]).reshape(B, 1, G * T, mask.shape[-1])
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=m)  # [B,Hkv,G*T,D]
        o = o.view(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        return self.o_proj(o)

    def forward_causal(self, x, cos, sin):
        """Plain causal attention over the chunk itself (no cache). x [B,T,C]."""
        B, T, _ = x.shape
        H, Hkv, D = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        q, k, v = self.project(x, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B,H,T,D]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        C, I = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(C, 2 * I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class Transformer(nn.Module):
    """Decoder-only LM. Parameters use our fused layout; `loading.py` maps HF names onto it."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(config, max_positions or config.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        cos = self.rope_cos[positions].to(dtype).unsqueeze(2)  # [B,T,1,D]
        sin = self.rope_sin[positions].to(dtype).unsqueeze(2)
        return cos, sin

    def forward(
        self,
        tokens: torch.Tensor,  # [B,T] int64
        positions: torch.Tensor,  # [B,T] int64 RoPE positions
        cache,  # specpilot.engine.kv_cache.KVCache
        slots: torch.Tensor,  # [B,T] int64 cache slots written by this chunk
        mask: torch.Tensor,  # [B,1,T,S] bool: may query t attend to cache slot s
        logits_for: torch.Tensor | None = None,  # [B,T'] indices of T to project (None: all)
    ) -> torch.Tensor:
        """Logits [B,T,V] (or [B,T',V]) of a chunk attending to the static cache."""
        h = self.embed_tokens(tokens)
        cos, sin = self._rope(positions, h.dtype)
        for i, layer in enumerate(self.layers):
            a = layer.self_attn.forward_cached(
                layer.input_layernorm(h), cos, sin, cache.k[i], cache.v[i], slots, mask
            )
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if logits_for is not None:
            h = torch.gather(h, 1, logits_for[..., None].expand(-1, -1, h.shape[-1]))
        return self.lm_head(self.norm(h))

    def forward_causal(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B,T,V] of tokens [B,T] starting at position 0, no cache (training, forcing)."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        h = self.embed_tokens(tokens)
        cos, sin = self._rope(positions, h.dtype)
        for layer in self.layers:
            h = h + layer.self_attn.forward_causal(layer.input_layernorm(h), cos, sin)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.norm(h))


def projection_names() -> tuple[str, ...]:
    """Suffixes of the projection modules inside each block (kernels swap these)."""
    return ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def replace_linears(model: Transformer, make: Callable[[str, nn.Linear], nn.Module], lm_head: bool = False) -> int:
    """Swap every block projection (and optionally lm_head) for `make(name, linear)`."""
    count = 0
    for i, block in enumerate(model.layers):
        for suffix in projection_names():
            parent_name, attr = suffix.rsplit(".", 1)
            parent = block.get_submodule(parent_name)
            old = getattr(parent, attr)
            if isinstance(old, nn.Linear):
                setattr(parent, attr, make(f"layers.{i}.{suffix}", old))
                count += 1
    if lm_head and isinstance(model.lm_head, nn.Linear):
        model.lm_head = make("lm_head", model.lm_head)
        count += 1
    return count
