"""Dense decoder (Llama and Qwen3 families) in plain PyTorch.

Owns: the forward pass over a static KV cache with an explicit attention mask (what AR decoding,
tree verification and drafting all use; the attention by torch's SDPA or the split-KV kernel,
`use_attention`; q/k norm, RoPE and the cache write by the fused op and indexed writes or by one
kernel, `use_rope_store`), a cache-free causal forward (training and teacher
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

from specpilot.config import AttentionKernel
from specpilot.kernels import rope_store
from specpilot.kernels.attention import MAX_QUERIES, split_attention
from specpilot.models import ops
from specpilot.models.config import ModelConfig
from specpilot.models.fusion import concat_rows
from specpilot.models.kv_cache import KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    D = config.rotary_dim  # head_dim, or its rotated part (partial rotary)
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
    """cos, sin tables [max_positions, R] in float32 (HF's non-interleaved layout; R = config.rotary_dim)."""
    inv = rope_inverse_frequencies(config)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


class CachedAttention(nn.Module):
    """A layer's attention over the static cache, whatever its projections: `kernel` picks what
    `attend_over_cache` attends with, and `use_attention` sets it on every such module (dense,
    hybrid and Gemma layers alike)."""

    kernel = AttentionKernel.SDPA

    def attend_over_cache(self, q, k_cache, v_cache, bias, scale: float | None = None) -> torch.Tensor:
        """softmax(q k^T * scale + bias) v: q [B,T,H,D]; k_cache, v_cache [B,Hkv,S,D]; bias
        [B,1,G*T,S] additive (0 or -inf) over the G = H / Hkv heads of a group folded into the
        query axis; scale None: D ** -0.5 -> [B,T,H*D]. The split-KV kernel (`kernels.attention`,
        same fold, no copies) when `kernel` is SPLIT_KV and T <= MAX_QUERIES; torch's SDPA
        otherwise (prefill chunks)."""
        B, T, H, D = q.shape
        Hkv = k_cache.shape[1]
        if self.kernel is AttentionKernel.SPLIT_KV and T <= MAX_QUERIES:
            extra = () if scale is None else (scale,)
            return split_attention(q, k_cache, v_cache, bias, *extra).reshape(B, T, H * D)  # [B,T,H,D] -> [B,T,H*D]
        # GQA without repeating K/V: fold the G query heads of a group into the query axis.
        q = q.permute(0, 2, 1, 3).reshape(B, Hkv, (H // Hkv) * T, D)  # head h = j*G + g
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=bias, scale=scale)  # [B,Hkv,G*T,D]
        # reshape, not view: the fused attention kernels may return a non-contiguous layout
        return o.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)


class Attention(CachedAttention):
    """A dense layer's attention: fused qkv projection, Qwen3's q/k norm, RoPE, the cached attention
    and o_proj. `rope_store` (set by `use_rope_store`): `Transformer.forward` writes q/k norm, RoPE
    and the cache write in one kernel (`project_store`) where it applies."""

    rope_store = False

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

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fuse=None, packing=None):
        """q [B,T,H,D], k and v [B,T,Hkv,D] with norms and RoPE applied (x packed [1,M,C] with
        `packing`: the projection runs on the M packed rows, the rest on all [B,T])."""
        c = self.config
        qkv_rope = fuse or ops.qkv_norm_rope
        qw = self.q_norm.weight if self.q_norm is not None else None
        kw = self.k_norm.weight if self.k_norm is not None else None
        qkv = self.qkv_proj(x)
        if packing is not None:
            qkv = packing.unpack(qkv)
        return qkv_rope(qkv, qw, kw, cos, sin, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps)

    def project_store(self, x, cos_table, sin_table, positions, k_cache, v_cache, slots) -> torch.Tensor:
        """q [B,T,H,D] of x [B,T,C] with norms and RoPE applied, k and v written into k_cache, v_cache
        [B,Hkv,S,D] at slots [B,T]: the qkv projection, then one kernel (`kernels.rope_store`, RoPE
        from the float32 tables [P,D] at positions [B,T], rounded as the compiled `project` rounds)."""
        c = self.config
        qw = self.q_norm.weight if self.q_norm is not None else None
        kw = self.k_norm.weight if self.k_norm is not None else None
        return rope_store.qk_norm_rope_store(self.qkv_proj(x), qw, kw, cos_table, sin_table, positions, k_cache,
                                             v_cache, slots, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps)

    def attend_cached(self, q, k, v, k_cache, v_cache, rows, slots, bias, packing=None):
        """Write k, v at `slots`, attend over the whole static cache, project.

        q [B,T,H,D]; k, v [B,T,Hkv,D]; k_cache, v_cache [B,Hkv,S,D]; rows, slots [B,T] int64;
        bias [B,1,G*T,S] additive mask (0 or -inf) in q's dtype, G = H / Hkv. With `packing` the
        output projection runs on the packed rows only: [1,M,C].
        """
        o = self.attend(q, k, v, k_cache, v_cache, rows, slots, bias)
        return self.o_proj(packing.pack(o) if packing is not None else o)

    def attend(self, q, k, v, k_cache, v_cache, rows, slots, bias) -> torch.Tensor:
        """`attend_cached` before the output projection: [B,T,H*D] (`attend_over_cache`)."""
        k_cache[rows, :, slots] = k  # advanced indices first: [B,T,Hkv,D]
        v_cache[rows, :, slots] = v
        return self.attend_over_cache(q, k_cache, v_cache, bias)

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

    def forward(self, x: torch.Tensor, act=None) -> torch.Tensor:
        return self.down_proj((act or ops.silu_mul)(self.gate_up_proj(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class Packing:
    """The rows of a [B,T] chunk that count (e.g. the valid nodes of trees sharing a node budget),
    as M flat indices into B*T. Projections, norms and the MLP run on the packed [1,M,C] rows
    (their cost scales with M, not B*T); attention unpacks to [B,T] (rows left out get zeros:
    their K/V entries are junk that no packed row's mask admits)."""

    def __init__(self, index: torch.Tensor, B: int, T: int):
        self.index, self.B, self.T = index, B, T  # index [M] int64, increasing

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B,T,F] -> [1,M,F]."""
        return x.reshape(self.B * self.T, -1).index_select(0, self.index)[None]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[1,M,F] -> [B,T,F], zeros where no row was packed."""
        full = x.new_zeros(self.B * self.T, x.shape[-1]).index_copy_(0, self.index, x[0])
        return full.view(self.B, self.T, -1)


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

    def new_cache(self, batch: int, capacity: int, nodes: int = 1) -> KVCache:
        """The decode cache of `batch` rows of `capacity` slots (`nodes`: the largest tree a forward
        runs; a KV cache needs no scratch for it)."""
        return KVCache.allocate(self.config, batch, capacity, self.device, self.dtype)

    def rope_store_applies(self, h: torch.Tensor) -> bool:
        """Whether a cached forward with activations like h (dtype, device) runs each layer's q/k norm,
        RoPE and cache write in one kernel: its attention's `rope_store` is on, the kernel takes the
        model's dtype, device and head size, with RoPE over the whole head, and the forward is not
        being traced by torch.compile (a compiled forward fuses the plain ops itself; the kernel
        serves eager and CUDA-graphed rounds)."""
        c = self.config
        return (bool(self.layers) and self.layers[0].self_attn.rope_store and not torch.compiler.is_compiling()
                and rope_store.applies(h, c.head_dim, self.rope_cos.shape[-1]))

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        cos = self.rope_cos[positions].to(dtype).unsqueeze(2)  # [B,T,1,D]
        sin = self.rope_sin[positions].to(dtype).unsqueeze(2)
        return cos, sin

    def forward(
        self,
        tokens: torch.Tensor,  # [B,T] int64
        positions: torch.Tensor,  # [B,T] int64 RoPE positions
        cache,  # specpilot.models.kv_cache.KVCache
        slots: torch.Tensor,  # [B,T] int64 cache slots written by this chunk
        mask: torch.Tensor,  # [B,1,T,S] bool: may query t attend to cache slot s
        logits_for: torch.Tensor | None = None,  # [B,T'] indices of T to project (None: all)
        capture: tuple[int, ...] = (),  # layer ids whose outputs to return as features (-1: embedding)
        pack: torch.Tensor | None = None,  # [M] flat indices into B*T: compute only these rows
        recurrence=None,  # models.recurrence.Recurrence: read by recurrent layers only (none here)
    ):
        """Logits [B,T,V] (or [B,T',V]) of a chunk attending to the static cache; with `pack`,
        logits [1,M,V] of the packed rows only (see `Packing`), and features, if captured, still
        [B,T,nC] with zeros at the rows left out.

        With `capture`, returns (logits, features [B,T,len(capture)*C]): the residual stream after
        each listed layer (HF's `hidden_states[i + 1]`; the last layer's is final-normed as in HF),
        and for id -1 the embedding (`hidden_states[0]`, the input of layer 0). The input of layer i
        is the output of layer i - 1, so EAGLE-3's "layer inputs" are ids shifted by one.
        """
        c = self.config
        B, T = tokens.shape
        dev = tokens.device
        eps = c.rms_norm_eps
        norm, add_norm = ops.fused("rms_norm", dev), ops.fused("add_rms_norm", dev)
        qkv_rope, act = ops.fused("qkv_norm_rope", dev), ops.fused("silu_mul", dev)
        h = self.embed_tokens(tokens)  # [B,T,C]
        # one kernel per layer for q/k norm, RoPE and the cache write, gathering cos/sin itself
        store = pack is None and self.rope_store_applies(h)
        if not store:
            cos, sin = self._rope(positions, h.dtype)
            rows = torch.arange(B, device=dev)[:, None].expand(B, T)
        # per-forward, not per-layer: the additive mask with GQA groups folded in
        G = c.num_heads // c.num_kv_heads
        bias = ops.attention_bias(mask, h.dtype, G)  # [B,1,G*T,S]
        packing = None
        if pack is not None:
            if logits_for is not None:
                raise ValueError("pack excludes logits_for")
            packing = Packing(pack, B, T)
            h = packing.pack(h)  # [1,M,C]
        x = norm(h, self.layers[0].input_layernorm.weight, eps)
        kept: dict[int, torch.Tensor] = {-1: h} if -1 in capture else {}
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            if store:
                q = attn.project_store(x, self.rope_cos, self.rope_sin, positions, cache.k[i], cache.v[i], slots)
                a = attn.o_proj(attn.attend_over_cache(q, cache.k[i], cache.v[i], bias))
            else:
                q, k, v = attn.project(x, cos, sin, fuse=qkv_rope, packing=packing)
                a = attn.attend_cached(q, k, v, cache.k[i], cache.v[i], rows, slots, bias, packing)
            h, x = add_norm(h, a, layer.post_attention_layernorm.weight, eps)
            m = layer.mlp(x, act=act)
            nxt = self.layers[i + 1].input_layernorm.weight if i + 1 < len(self.layers) else self.norm.weight
            h, x = add_norm(h, m, nxt, eps)  # x: the next layer's input (or the final norm)
            if i in capture:
                kept[i] = x if i + 1 == len(self.layers) else h
        if logits_for is not None:
            x = torch.gather(x, 1, logits_for[..., None].expand(-1, -1, x.shape[-1]))
        if capture:
            features = torch.cat([kept[i] for i in capture], dim=-1)
            return self.lm_head(x), packing.unpack(features) if packing is not None else features
        return self.lm_head(x)

    def forward_causal(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()):
        """Logits [B,T,V] of tokens [B,T] starting at position 0, no cache (training, forcing); with
        `capture`, (logits, features [B,T,len(capture)*C]) as `forward` returns them."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        h = self.embed_tokens(tokens)
        cos, sin = self._rope(positions, h.dtype)
        kept = {-1: h} if -1 in capture else {}
        for i, layer in enumerate(self.layers):
            h = h + layer.self_attn.forward_causal(layer.input_layernorm(h), cos, sin)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i in capture:
                kept[i] = self.norm(h) if i + 1 == len(self.layers) else h
        logits = self.lm_head(self.norm(h))
        return (logits, torch.cat([kept[i] for i in capture], dim=-1)) if capture else logits


def use_attention(model: nn.Module, kernel: AttentionKernel) -> None:
    """Every cached attention of `model` (its `CachedAttention` modules) attends with `kernel`."""
    for module in model.modules():
        if isinstance(module, CachedAttention):
            module.kernel = kernel


def use_rope_store(model: nn.Module, on: bool) -> None:
    """Every dense attention of `model` (its `Attention` modules) has q/k norm, RoPE and the cache
    write done in one kernel where it applies (`Attention.project_store`), or not."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.rope_store = on


PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "linear_attn.in_proj", "linear_attn.out_proj",
               "mlp.gate_up_proj", "mlp.down_proj")  # of a dense block, a hybrid decoder's blocks, drafters'


def projection_names(block: nn.Module) -> tuple[str, ...]:
    """Suffixes of the projection modules inside `block` (kernels swap these)."""
    return tuple(name for name in PROJECTIONS if _has_submodule(block, name))


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def decoder_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, block) of each decoder block: `layers.i` of a Transformer or a DFlash drafter, the
    `midlayer` of an EAGLE-3 head."""
    layers = getattr(model, "layers", None)
    if layers is not None:
        return [(f"layers.{i}", block) for i, block in enumerate(layers)]
    return [("midlayer", model.midlayer)]


def replace_linears(model: nn.Module, make: Callable[[str, nn.Linear], nn.Module], lm_head: bool = False,
                    heads: tuple[str, ...] = ()) -> int:
    """Swap every block projection (`decoder_blocks`), optionally the lm_head, and each top-level
    linear of `heads` the model has (a feature drafter's `fc`) for `make(name, linear)`."""
    count = 0
    for prefix, block in decoder_blocks(model):
        for suffix in projection_names(block):
            parent_name, attr = suffix.rsplit(".", 1)
            parent = block.get_submodule(parent_name)
            old = getattr(parent, attr)
            if isinstance(old, nn.Linear):
                setattr(parent, attr, make(f"{prefix}.{suffix}", old))
                count += 1
    for name in (("lm_head",) if lm_head else ()) + heads:
        old = getattr(model, name, None)
        if isinstance(old, nn.Linear):
            setattr(model, name, make(name, old))
            count += 1
    return count


# ---- Hugging Face layout (Llama, Qwen3) -----------------------------------------------------

def hf_tensor_shapes(config: ModelConfig, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of this config must hold, with its shape."""
    C, I, D = config.hidden_size, config.intermediate_size, config.head_dim
    H, Hkv, V = config.num_heads, config.num_kv_heads, config.vocab_size
    shapes = {prefix + "embed_tokens.weight": (V, C), prefix + "norm.weight": (C,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, C)
    for i in range(config.num_layers):
        p = f"{prefix}layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (C,),
            p + "post_attention_layernorm.weight": (C,),
            p + "self_attn.q_proj.weight": (H * D, C),
            p + "self_attn.k_proj.weight": (Hkv * D, C),
            p + "self_attn.v_proj.weight": (Hkv * D, C),
            p + "self_attn.o_proj.weight": (C, H * D),
        })
        if i not in config.moe_layers:  # a sparse layer's experts: `models/moe.py`
            shapes.update({p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
                           p + "mlp.down_proj.weight": (C, I)})
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
    return shapes


def to_fused_state(config: ModelConfig, hf: dict) -> dict:
    """HF names -> our parameter names (values may be tensors or W12 weights)."""
    out = {"embed_tokens.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    out["lm_head.weight"] = hf["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    for i in range(config.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
        out[q + "post_attention_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
        out[q + "self_attn.qkv_proj.weight"] = concat_rows(
            [hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
        )
        out[q + "self_attn.o_proj.weight"] = hf[p + "self_attn.o_proj.weight"]
        if i not in config.moe_layers:
            out[q + "mlp.gate_up_proj.weight"] = concat_rows([hf[p + "mlp.gate_proj.weight"],
                                                              hf[p + "mlp.up_proj.weight"]])
            out[q + "mlp.down_proj.weight"] = hf[p + "mlp.down_proj.weight"]
        if config.qk_norm:
            out[q + "self_attn.q_norm.weight"] = hf[p + "self_attn.q_norm.weight"]
            out[q + "self_attn.k_norm.weight"] = hf[p + "self_attn.k_norm.weight"]
    return out


def to_hf_state(model: Transformer) -> dict[str, torch.Tensor]:
    """Our parameters -> HF names (unfused), contiguous CPU tensors."""
    c = model.config
    H, Hkv, D, I = c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    hf = {"model.embed_tokens.weight": sd["embed_tokens.weight"], "model.norm.weight": sd["norm.weight"]}
    if not c.tie_word_embeddings:
        hf["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(c.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        hf[p + "input_layernorm.weight"] = sd[q + "input_layernorm.weight"]
        hf[p + "post_attention_layernorm.weight"] = sd[q + "post_attention_layernorm.weight"]
        wq, wk, wv = sd[q + "self_attn.qkv_proj.weight"].split([H * D, Hkv * D, Hkv * D])
        hf[p + "self_attn.q_proj.weight"], hf[p + "self_attn.k_proj.weight"] = wq, wk
        hf[p + "self_attn.v_proj.weight"] = wv
        hf[p + "self_attn.o_proj.weight"] = sd[q + "self_attn.o_proj.weight"]
        if i not in c.moe_layers:
            wg, wu = sd[q + "mlp.gate_up_proj.weight"].split([I, I])
            hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = wg, wu
            hf[p + "mlp.down_proj.weight"] = sd[q + "mlp.down_proj.weight"]
        if c.qk_norm:
            hf[p + "self_attn.q_norm.weight"] = sd[q + "self_attn.q_norm.weight"]
            hf[p + "self_attn.k_norm.weight"] = sd[q + "self_attn.k_norm.weight"]
    return {k: v.contiguous() for k, v in hf.items()}
