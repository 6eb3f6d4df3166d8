"""Gemma 3 and Gemma 4 text decoders (`Gemma3ForCausalLM`, `Gemma4ForCausalLM`, and the text model
of their `ForConditionalGeneration` wrappers), in plain PyTorch.

A layer attends globally (FULL_ATTENTION) or locally (SLIDING_ATTENTION: keys with
query_pos - key_pos < `sliding_window`, transformers' rule), each type with its own RoPE: the
sliding layers' base `sliding_rope_theta`; the global layers' `rope_theta`, frequencies divided by
`global_rope_factor` ("linear" / "proportional"), and on Gemma-4 proportional partial rotary (only
the first `global_rope_proportion` of the frequency pairs turn, exponents over the whole head).
Every layer has four norms (input; post-attention, on the attention output; pre-feedforward;
post-feedforward, on the MLP output), q and k norms (Gemma-4 also a scale-free v norm) and a
GELU-tanh MLP. Norms compute in float32 and round once: Gemma-3 scales by (1 + w), Gemma-4 by w.
Embeddings are scaled by sqrt(C) rounded to the model's dtype; the attention scale is
`query_pre_attn_scalar` ** -0.5 (Gemma-4: 1); the logits are soft-capped when the config says so.
Gemma-4 extras: per-layer input embeddings (PLE), a per-layer `layer_scalar`, global layers with
their own head dim / K/V heads, values taken from the key projection (`attention_k_eq_v`), and
KV-shared layers (the last `num_kv_shared_layers` attend to an earlier layer's cache entries and
own none; with `double_wide_mlp` their MLPs are twice as wide).

Sliding windows. The engine's masks admit, for each query, exactly its history: one key per
position up to its own (committed tokens, then its tree path or chunk prefix), in slot order,
itself last (tree nodes follow their parents: `engine.tree`). So a visible key's distance
query_pos - key_pos is the number of visible keys after it, and a sliding layer keeps the visible
keys with fewer than `sliding_window` after them (`window_mask`): per query, along its own path,
with no key positions stored. When the cache is longer than the window plus what a forward writes,
the sliding layers keep only a ring of the last R slots (`models.ring_cache`, where the rules are):
their K/V memory and the bytes attention reads follow the window, not the context; the mask above
is gathered at the slots the ring holds.

Owns: the modules, their forward (the dense `Transformer.forward` signature), the decode cache
(`GemmaCache`) and the HF tensor layout <-> our fused parameters (`hf_tensor_shapes`,
`to_fused_state`, `to_hf_state`). Our layout: `qkv_proj` = [q | k | v] rows ([q | k] with
`attention_k_eq_v`, [q] in a KV-shared layer), `gate_up_proj` = [gate | up]. Does not own the
config fields (`config.py`) or reading files (`loading.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.models.config import ModelConfig
from specpilot.models.fusion import concat_rows
from specpilot.models.kv_cache import KVCache
from specpilot.models import ops
from specpilot.models.ring_cache import RingCache, gather_columns, ring_slots
from specpilot.models.transformer import CachedAttention, Packing


def in_dtypes(value: float) -> dict[torch.dtype, float]:
    """`value` rounded to each floating dtype a model runs in (transformers scales embeddings by
    sqrt(C) cast to the weights' dtype), as Python floats: no tensor work in the forward."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    return {dt: float(torch.tensor(value, dtype=torch.float32, device="cpu").to(dt)) for dt in dtypes}


def rope_table(theta: float, D: int, pairs: int, factor: float, max_positions: int):
    """cos, sin [max_positions, D] float32 (HF's non-interleaved layout): the first `pairs` of the
    D/2 frequency pairs turn at theta ** (-2j / D) / factor, the others not at all."""
    inv = torch.zeros(D // 2)
    inv[:pairs] = 1.0 / (theta ** (torch.arange(0, 2 * pairs, 2, dtype=torch.int64).float() / D))
    inv = inv / factor
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def window_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """The engine's mask [B,1,T,S] keeping only the visible keys with fewer than `window` visible
    keys after them (distance < window, see the module docstring); window 0: unchanged."""
    if not window:
        return mask
    later = mask.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1) - mask.to(torch.int32)  # [B,1,T,S]
    return mask & (later < window)


def cache_layers(config: ModelConfig) -> tuple[int, ...]:
    """The layers that keep K/V of their own (all but Gemma-4's KV-shared layers), in order."""
    return tuple(sorted(set(config.kv_layers)))


class GemmaNorm(nn.Module):
    def __init__(self, dim: int, config: ModelConfig):
        super().__init__()
        self.eps, self.zero_centered = config.rms_norm_eps, config.zero_centered_norms
        self.weight = nn.Parameter(torch.zeros(dim) if self.zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.fused("gemma_rms_norm", x.device)(x, self.weight, self.eps, self.zero_centered)

    def add_to(self, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """h + this norm of delta (a post-norm into the residual), one fused op on the GPU."""
        return ops.fused("gemma_add_norm", h.device)(h, delta, self.weight, self.eps, self.zero_centered)

    def with_rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """This norm of x [B,T,H,D], then RoPE (a q or k norm), one fused op on the GPU."""
        return ops.fused("gemma_norm_rope", x.device)(x, self.weight, cos, sin, self.eps, self.zero_centered)


class GemmaAttention(CachedAttention):
    """Attention of one layer over the cache: q/k (and Gemma-4's v) norms, RoPE of its layer type,
    GQA without repeating K/V, the config's scale, SDPA or the split-KV kernel (`use_attention`).
    A KV-shared layer projects q only."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        c = self.config = config
        C, H = c.hidden_size, c.num_heads
        self.D, self.Hkv = D, Hkv = c.layer_head_dims[layer], c.layer_kv_heads[layer]
        self.sliding = layer in c.sliding_layers
        self.shared = c.kv_layers[layer] != layer
        self.cache_index = cache_layers(c).index(c.kv_layers[layer])  # the cache entries it reads (and writes)
        self.k_eq_v = c.attention_k_eq_v and not self.sliding
        self.v_norm = c.family == "gemma4"
        self.scale = (c.query_pre_attn_scalar or D) ** -0.5
        kv_rows = 0 if self.shared else (1 if self.k_eq_v else 2) * Hkv * D
        self.qkv_proj = nn.Linear(C, H * D + kv_rows, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.q_norm = GemmaNorm(D, c)
        if not self.shared:
            self.k_norm = GemmaNorm(D, c)

    def forward(self, x, cos, sin, cache, rows, slots, bias, packing=None, fresh=None):
        """x [B,T,C] (or packed [1,M,C]); cos, sin [B,T,1,D]; rows, slots [B,T]; bias [B,1,G*T,S]
        with the G = H / Hkv query heads of a group folded into the query axis (a sliding layer
        over a ring: [B,1,G*T,R], or [B,1,G*T,R+T] when `fresh`). `fresh` (a long chunk over a
        ring, `models.ring_cache`): a dict where a sliding layer leaves its new K/V [B,T,Hkv,D]
        instead of writing the ring, and from which it (and a layer sharing its K/V) attends."""
        H, Hkv, D = self.config.num_heads, self.Hkv, self.D
        y = self.qkv_proj(x)
        if packing is not None:
            y = packing.unpack(y)
        B, T, _ = y.shape
        q = self.q_norm.with_rope(y[..., : H * D].view(B, T, H, D), cos, sin)
        k_cache, v_cache = cache.k[self.cache_index], cache.v[self.cache_index]  # [B,Hkv,S or R,D]
        ring = getattr(cache, "ring", None) if self.sliding else None
        deferred = ring is not None and fresh is not None
        if not self.shared:
            k = y[..., H * D : (H + Hkv) * D].view(B, T, Hkv, D)
            v = k if self.k_eq_v else y[..., (H + Hkv) * D :].view(B, T, Hkv, D)
            k = self.k_norm.with_rope(k, cos, sin)
            if self.v_norm:
                v = ops.fused("gemma_rms_norm", v.device)(v, None, self.config.rms_norm_eps, False)
            if deferred:
                fresh[self.cache_index] = (k, v)
            else:
                at = slots if ring is None else ring.entries(slots)
                k_cache[rows, :, at] = k  # advanced indices first: [B,T,Hkv,D]
                v_cache[rows, :, at] = v
        if deferred:
            k_new, v_new = fresh[self.cache_index]
            k_cache = torch.cat([k_cache, k_new.transpose(1, 2)], 2)  # [B,Hkv,R+T,D]
            v_cache = torch.cat([v_cache, v_new.transpose(1, 2)], 2)
        o = self.attend_over_cache(q, k_cache, v_cache, bias, self.scale)  # [B,T,H*D]
        return self.o_proj(packing.pack(o) if packing is not None else o)


class GemmaMLP(nn.Module):
    def __init__(self, C: int, I: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(C, 2 * I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.fused("gelu_tanh_mul", x.device)(self.gate_up_proj(x)))


class GemmaBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        c, C, P = config, config.hidden_size, config.per_layer_input_size
        self.input_layernorm = GemmaNorm(C, c)
        self.self_attn = GemmaAttention(c, layer)
        self.post_attention_layernorm = GemmaNorm(C, c)
        self.pre_feedforward_layernorm = GemmaNorm(C, c)
        self.post_feedforward_layernorm = GemmaNorm(C, c)
        wide = c.double_wide_mlp and self.self_attn.shared
        self.mlp = GemmaMLP(C, c.intermediate_size * (2 if wide else 1))
        if P:
            self.per_layer_input_gate = nn.Linear(C, P, bias=False)
            self.per_layer_projection = nn.Linear(P, C, bias=False)
            self.post_per_layer_input_norm = GemmaNorm(C, c)
        if c.family == "gemma4":
            self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(self, h, cos, sin, cache, rows, slots, bias, packing, per_layer_input, fresh=None):
        """The residual stream [B,T,C] (packed: [1,M,C]) after this layer; per_layer_input [..,P] or None."""
        a = self.self_attn(self.input_layernorm(h), cos, sin, cache, rows, slots, bias, packing, fresh)
        h = self.post_attention_layernorm.add_to(h, a)
        h = self.post_feedforward_layernorm.add_to(h, self.mlp(self.pre_feedforward_layernorm(h)))
        if per_layer_input is not None:
            g = F.gelu(self.per_layer_input_gate(h), approximate="tanh") * per_layer_input
            h = self.post_per_layer_input_norm.add_to(h, self.per_layer_projection(g))
        return h * self.layer_scalar if hasattr(self, "layer_scalar") else h


@dataclass
class GemmaCache:
    """K/V of the layers that keep their own (`cache_layers`): one stacked `KVCache` per distinct
    (Hkv, D) shape (Gemma-4's global layers may differ from its sliding layers), so a commit is a
    gather and a scatter per shape; with `ring`, the sliding layers' K/V live in that ring instead
    (`models.ring_cache`). `k[j]` / `v[j]` are the j-th cache layer's [B,Hkv,S,D] ([B,Hkv,R,D] in
    the ring)."""

    groups: list  # KVCache per shape, then the RingCache if any
    where: list[tuple[int, int]]  # cache layer j -> (its group, its index in the group)
    capacity: int  # absolute slots a row may use (the engine's masks' S)
    k: list[torch.Tensor] = field(init=False)  # per cache layer [B,Hkv,S,D] (views of the groups')
    v: list[torch.Tensor] = field(init=False)

    def __post_init__(self):
        self.k = [self.groups[g].k[i] for g, i in self.where]
        self.v = [self.groups[g].v[i] for g, i in self.where]

    @classmethod
    def allocate(cls, config: ModelConfig, batch: int, capacity: int, device, dtype,
                 nodes: int = 1) -> "GemmaCache":
        """Every cache layer's K/V for `capacity` slots; the sliding layers' in a ring when
        `ring_slots(window, capacity, nodes)` is smaller (a forward writes up to `nodes` slots)."""
        layers = cache_layers(config)
        R = ring_slots(config.sliding_window, capacity, nodes) if config.sliding_layers else 0
        in_ring = [R > 0 and i in config.sliding_layers for i in layers]
        shapes = [(config.layer_kv_heads[i], config.layer_head_dims[i]) for i in layers]
        plain = [s for s, r in zip(shapes, in_ring) if not r]
        distinct = list(dict.fromkeys(plain))
        groups: list = []
        for Hkv, D in distinct:
            n = plain.count((Hkv, D))
            stack = torch.zeros(2, n, batch, Hkv, capacity, D, device=device, dtype=dtype)
            groups.append(KVCache([stack[0, i] for i in range(n)], [stack[1, i] for i in range(n)], stack))
        where, seen = [], {s: 0 for s in distinct}
        for s, r in zip(shapes, in_ring):
            if r:
                where.append((len(distinct), sum(in_ring[: len(where)])))
            else:
                where.append((distinct.index(s), seen[s]))
                seen[s] += 1
        if R:
            (Hkv, D), = {s for s, r in zip(shapes, in_ring) if r}  # sliding layers share one shape
            groups.append(RingCache.allocate(sum(in_ring), batch, Hkv, D, config.sliding_window, R, device, dtype))
        return cls(groups, where, capacity)

    @property
    def ring(self) -> RingCache | None:
        return self.groups[-1] if isinstance(self.groups[-1], RingCache) else None

    @property
    def packable(self) -> bool:
        """Packed prefill builds its batch-1 cache in the shape of `k[0]`: one shape only, no ring."""
        return len(self.groups) == 1 and self.ring is None

    @property
    def batch(self) -> int:
        return self.groups[0].batch

    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups)

    def row(self, b: int) -> "GemmaCache":
        """A view of row `b` (writes go to the shared buffers)."""
        return GemmaCache([g.row(b) for g in self.groups], self.where, self.capacity)

    def span(self, n: int) -> "GemmaCache":
        """A view of slots 0..n-1 of every row (`KVCache.span`); a ring stays whole."""
        return GemmaCache([g if isinstance(g, RingCache) else g.span(n) for g in self.groups], self.where, n)

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for g in self.groups:
            g.move_slots(src, dst)

    def commit_path(self, prefix: torch.Tensor, path: torch.Tensor, accept_len: torch.Tensor,
                    active: torch.Tensor | None = None) -> None:
        """Commit each row's accepted tree path in every group (`KVCache.commit_path`)."""
        for g in self.groups:
            g.commit_path(prefix, path, accept_len, active)


class GemmaTransformer(nn.Module):
    """Gemma-3 / Gemma-4 decoder-only LM (see the module docstring)."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        c = self.config = config
        C, L, P = c.hidden_size, c.num_layers, c.per_layer_input_size
        self.embed_tokens = nn.Embedding(c.vocab_size, C)
        if P:
            self.embed_tokens_per_layer = nn.Embedding(c.per_layer_input_vocab, L * P)
            self.per_layer_model_projection = nn.Linear(C, L * P, bias=False)
            self.per_layer_projection_norm = GemmaNorm(P, c)
        self.layers = nn.ModuleList(GemmaBlock(c, i) for i in range(L))
        self.norm = GemmaNorm(C, c)
        self.lm_head = nn.Linear(C, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.embed_scale = in_dtypes(C**0.5)  # by dtype
        self.per_layer_embed_scale = in_dtypes(P**0.5)
        for name, table in self.rope_buffers(max_positions).items():
            self.register_buffer(name, table, persistent=False)

    def rope_buffers(self, max_positions: int | None = None) -> dict[str, torch.Tensor]:
        """cos/sin tables [max_positions, D] float32 of the global layers (`rope_cos`, `rope_sin`)
        and of the sliding layers (`rope_cos_sliding`, `rope_sin_sliding`), on the CPU."""
        c = self.config
        n = max_positions or c.max_position_embeddings
        D = c.global_head_dim or c.head_dim
        pairs = int(c.global_rope_proportion * D // 2) if c.global_rope_proportion else D // 2
        cos, sin = rope_table(c.rope_theta, D, pairs, c.global_rope_factor, n)
        cos_s, sin_s = rope_table(c.sliding_rope_theta or c.rope_theta, c.head_dim, c.head_dim // 2, 1.0, n)
        return {"rope_cos": cos, "rope_sin": sin, "rope_cos_sliding": cos_s, "rope_sin_sliding": sin_s}

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, batch: int, capacity: int, nodes: int = 1) -> GemmaCache:
        """The decode cache of `batch` rows of `capacity` slots whose forwards write up to `nodes`
        slots each (tree nodes, a serving segment; longer chunks are prefill: see `ring_cache`)."""
        return GemmaCache.allocate(self.config, batch, capacity, self.device, self.dtype, nodes)

    def _per_layer_inputs(self, tokens: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Gemma-4's per-layer inputs [B,T,L,P] of tokens [B,T] with scaled embeddings h [B,T,C]."""
        c = self.config
        L, P = c.num_layers, c.per_layer_input_size
        shape = (*tokens.shape, L, P)
        ids = (self.embed_tokens_per_layer(tokens) * self.per_layer_embed_scale[h.dtype]).view(shape)
        proj = (self.per_layer_model_projection(h) * c.hidden_size**-0.5).view(shape)
        return (self.per_layer_projection_norm(proj) + ids) * 2.0**-0.5

    def forward(
        self,
        tokens: torch.Tensor,  # [B,T] int64
        positions: torch.Tensor,  # [B,T] int64 RoPE positions
        cache,  # GemmaCache (or a KVCache of its one shape: packed prefill)
        slots: torch.Tensor,  # [B,T] int64 cache slots written by this chunk
        mask: torch.Tensor,  # [B,1,T,S] bool: may query t attend to cache slot s
        logits_for: torch.Tensor | None = None,  # [B,T'] indices of T to project (None: all)
        capture: tuple[int, ...] = (),  # layer ids whose outputs to return as features (-1: embedding)
        pack: torch.Tensor | None = None,  # [M] flat indices into B*T: compute only these rows
        recurrence=None,  # models.recurrence.Recurrence: read by recurrent layers only (none here)
    ):
        """As `Transformer.forward`: logits [B,T,V] (soft-capped where the config says so), features
        with `capture` (the last layer's final-normed); sliding layers see only their window."""
        c = self.config
        B, T = tokens.shape
        h = self.embed_tokens(tokens)  # [B,T,C]
        h = h * self.embed_scale[h.dtype]
        ids, packing = tokens, None
        if pack is not None:
            if logits_for is not None:
                raise ValueError("pack excludes logits_for")
            packing = Packing(pack, B, T)
            h, ids = packing.pack(h), packing.pack(tokens[..., None])[..., 0]  # [1,M,C], [1,M]
        per_layer = self._per_layer_inputs(ids, h) if c.per_layer_input_size else None  # [B,T,L,P]
        rows = torch.arange(B, device=tokens.device)[:, None].expand(B, T)
        kept: dict[int, torch.Tensor] = {-1: h} if -1 in capture else {}
        rope = {False: (self.rope_cos, self.rope_sin), True: (self.rope_cos_sliding, self.rope_sin_sliding)}
        rope = {kind: (cos[positions].to(h.dtype).unsqueeze(2), sin[positions].to(h.dtype).unsqueeze(2))
                for kind, (cos, sin) in rope.items()}  # [B,T,1,D] per layer type
        ring = getattr(cache, "ring", None)
        fresh = {} if ring is not None and T > ring.slack else None  # a long chunk: see `ring_cache`
        masks = {False: mask}  # [B,1,T,S or R or R+T] bool per layer type
        if c.sliding_layers:
            masks[True] = window_mask(mask, c.sliding_window)
            if ring is not None and fresh is None:
                ring.record(rows, slots)  # the layers write first, then attend over the ring
                masks[True] = gather_columns(masks[True], ring.columns())
            elif ring is not None:
                cols = torch.cat([ring.columns(before=slots.min(1).values), slots], 1)  # [B,R+T]
                masks[True] = gather_columns(masks[True], cols)
        base = {kind: ops.attention_bias(m, h.dtype) for kind, m in masks.items()}
        biases: dict[tuple[bool, int], torch.Tensor] = {}  # per (sliding, G): [B,1,G*T,S']
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            G = c.num_heads // attn.Hkv
            if (attn.sliding, G) not in biases:
                S = base[attn.sliding].shape[-1]
                biases[attn.sliding, G] = base[attn.sliding].expand(B, G, T, S).reshape(B, 1, G * T, S)
            cos, sin = rope[attn.sliding]
            h = layer(h, cos, sin, cache, rows, slots, biases[attn.sliding, G], packing,
                      per_layer[:, :, i] if per_layer is not None else None, fresh)
            if i in capture:
                kept[i] = h
        if fresh:  # the chunk's last R slots into the ring, after every layer has read it as it was
            R = ring.size
            at = ring.entries(slots[:, -R:])
            for j, (k, v) in fresh.items():
                cache.k[j][rows[:, -R:], :, at] = k[:, -R:]
                cache.v[j][rows[:, -R:], :, at] = v[:, -R:]
            ring.record(rows, slots)
        x = self.norm(h)
        if c.num_layers - 1 in capture:
            kept[c.num_layers - 1] = x  # HF's last hidden state is final-normed
        if logits_for is not None:
            x = torch.gather(x, 1, logits_for[..., None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(x)
        if c.final_logit_softcapping:
            logits = torch.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
        if capture:
            features = torch.cat([kept[i] for i in capture], dim=-1)
            return logits, packing.unpack(features) if packing is not None else features
        return logits

    def forward_causal(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()):
        """Logits [B,T,V] of tokens [B,T] starting at position 0 (through a fresh cache of T slots);
        with `capture`, (logits, features) as `forward` returns them."""
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device).expand(B, T)
        mask = (pos[0][None, :] <= pos[0][:, None]).expand(B, 1, T, T)  # [B,1,T,S=T]
        return self(tokens, pos, self.new_cache(B, T), pos, mask, capture=capture)


# ---- Hugging Face layout ------------------------------------------------------------------

# where the text model's tensors live: ForCausalLM; a ForConditionalGeneration wrapper as
# transformers 5 names it in memory; the same as it saves Gemma-3's (and the Hub's Gemma-3 files)
PREFIXES = ("model.", "model.language_model.", "language_model.model.")


def hf_prefix(hf_names) -> str:
    """The prefix of `hf_names`' text model (`PREFIXES`; 'model.' when none matches)."""
    return next((p for p in PREFIXES[1:] if p + "embed_tokens.weight" in hf_names), "model.")


def lm_head_name(prefix: str) -> str:
    return "language_model.lm_head.weight" if prefix.startswith("language_model.") else "lm_head.weight"

def hf_tensor_shapes(config: ModelConfig, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of this config must hold, with its shape (`prefix`
    'model.language_model.' for a ForConditionalGeneration checkpoint)."""
    c = config
    C, V, H, L, P = c.hidden_size, c.vocab_size, c.num_heads, c.num_layers, c.per_layer_input_size
    shapes = {prefix + "embed_tokens.weight": (V, C), prefix + "norm.weight": (C,)}
    if not c.tie_word_embeddings:
        shapes[lm_head_name(prefix)] = (V, C)
    if P:
        shapes.update({prefix + "embed_tokens_per_layer.weight": (c.per_layer_input_vocab, L * P),
                       prefix + "per_layer_model_projection.weight": (L * P, C),
                       prefix + "per_layer_projection_norm.weight": (P,)})
    first_shared = L - c.num_kv_shared_layers
    for i, (D, Hkv) in enumerate(zip(c.layer_head_dims, c.layer_kv_heads)):
        p, a = f"{prefix}layers.{i}.", f"{prefix}layers.{i}.self_attn."
        I = c.intermediate_size * (2 if c.double_wide_mlp and i >= first_shared else 1)
        shapes.update({p + n + ".weight": (C,) for n in ("input_layernorm", "post_attention_layernorm",
                                                          "pre_feedforward_layernorm", "post_feedforward_layernorm")})
        shapes.update({a + "q_proj.weight": (H * D, C), a + "o_proj.weight": (C, H * D), a + "q_norm.weight": (D,),
                       p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
                       p + "mlp.down_proj.weight": (C, I)})
        if i < first_shared:
            shapes.update({a + "k_proj.weight": (Hkv * D, C), a + "k_norm.weight": (D,)})
            if not (c.attention_k_eq_v and i not in c.sliding_layers):
                shapes[a + "v_proj.weight"] = (Hkv * D, C)
        if P:
            shapes.update({p + "per_layer_input_gate.weight": (P, C), p + "per_layer_projection.weight": (C, P),
                           p + "post_per_layer_input_norm.weight": (C,)})
        if c.family == "gemma4":
            shapes[p + "layer_scalar"] = (1,)
    return shapes


# HF tensors (under the model prefix) that map onto a parameter of the same name
_SAME = ("embed_tokens_per_layer.weight", "per_layer_model_projection.weight", "per_layer_projection_norm.weight")
_LAYER_SAME = ("input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
               "post_feedforward_layernorm.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
               "self_attn.k_norm.weight", "mlp.down_proj.weight", "per_layer_input_gate.weight",
               "per_layer_projection.weight", "post_per_layer_input_norm.weight", "layer_scalar")


def to_fused_state(config: ModelConfig, hf: dict) -> dict:
    """HF names (ForCausalLM or the wrapper's `model.language_model.`) -> our parameter names
    (values may be tensors or W12 weights)."""
    pre = hf_prefix(hf)
    wanted = hf_tensor_shapes(config, pre)
    out = {"embed_tokens.weight": hf[pre + "embed_tokens.weight"], "norm.weight": hf[pre + "norm.weight"]}
    out["lm_head.weight"] = hf[pre + "embed_tokens.weight" if config.tie_word_embeddings else lm_head_name(pre)]
    out.update({n: hf[pre + n] for n in _SAME if pre + n in wanted})
    for i in range(config.num_layers):
        p, q = f"{pre}layers.{i}.", f"layers.{i}."
        out.update({q + n: hf[p + n] for n in _LAYER_SAME if p + n in wanted})
        out[q + "self_attn.qkv_proj.weight"] = concat_rows([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"
                                                            if p + f"self_attn.{n}_proj.weight" in wanted])
        out[q + "mlp.gate_up_proj.weight"] = concat_rows([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
    return out


def to_hf_state(model: GemmaTransformer) -> dict[str, torch.Tensor]:
    """Our parameters -> HF names of a ForCausalLM checkpoint, contiguous CPU tensors."""
    c = model.config
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    wanted = hf_tensor_shapes(c)
    hf = {"model." + n: sd[n] for n in ("embed_tokens.weight", "norm.weight", *_SAME) if "model." + n in wanted}
    if not c.tie_word_embeddings:
        hf["lm_head.weight"] = sd["lm_head.weight"]
    for i, layer in enumerate(model.layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        hf.update({p + n: sd[q + n] for n in _LAYER_SAME if p + n in wanted})
        names = [f"self_attn.{n}_proj.weight" for n in "qkv" if p + f"self_attn.{n}_proj.weight" in wanted]
        for n, w in zip(names, sd[q + "self_attn.qkv_proj.weight"].split([wanted[p + n][0] for n in names])):
            hf[p + n] = w
        gate, up = sd[q + "mlp.gate_up_proj.weight"].chunk(2)
        hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = gate, up
    return {k: v.contiguous() for k, v in hf.items()}
