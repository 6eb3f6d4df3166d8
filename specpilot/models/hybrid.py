"""The hybrid Gated DeltaNet decoder: Qwen3-Next (`Qwen3NextForCausalLM`) and Qwen3.5
(`Qwen3_5ForCausalLM`, and the text model of `Qwen3_5ForConditionalGeneration`), in plain PyTorch.

Layers follow the config's `layer_types`: Gated DeltaNet layers (`models.gdn`) and full-attention
layers whose output is gated by sigmoid(gate), the gate being the second half of each head's
q_proj rows; q/k norms and every block norm are zero-centred (scale 1 + w, in float32); RoPE
rotates the first `rotary_dim` dims of each head (partial rotary); the MLP is dense SwiGLU.

The forward has the dense `Transformer`'s signature (tokens, positions, cache, slots, mask,
logits_for, capture, pack) plus `recurrence` (`models.recurrence`): the attention layers read and
write the cache's K/V at `slots` under `mask`, the GDN layers continue the states `recurrence`
names. `cache.k[i]` / `cache.v[i]` are the i-th *attention* layer's, `cache.state[j]` etc. the j-th
GDN layer's (the engine's hybrid cache).

Owns: the modules, their forward, and both HF tensor layouts <-> our fused parameter names
(`hf_tensor_shapes`, `to_fused_state`, `to_hf_state`). Our layout: attention `qkv_proj` =
[q | k | v | gate] rows, GDN `in_proj` = [q | k | v | z | b | a] rows (Qwen3-Next's per-key-head
interleaved `in_proj_qkvz` / `in_proj_ba` rows are regrouped by part; a row permutation, exact).
Does not own: the cache or its commit (`specpilot.engine`), loading files (`loading.py`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.models import ops
from specpilot.models.config import ModelConfig
from specpilot.models.gdn import GatedDeltaNet
from specpilot.models.hybrid_cache import HybridCache
from specpilot.models.recurrence import Recurrence
from specpilot.models.transformer import MLP, Attention, Packing, rope_tables


class GatedAttention(Attention):
    """Full attention with a sigmoid output gate, zero-centred q/k norms and partial rotary."""

    def __init__(self, config: ModelConfig, index: int):
        nn.Module.__init__(self)
        self.config = config
        self.index = index  # this layer's position among the attention layers (its K/V in the cache)
        H, Hkv, D, C = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
        self.qkv_proj = nn.Linear(C, (2 * H + 2 * Hkv) * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.q_norm = nn.Module()
        self.q_norm.weight = nn.Parameter(torch.zeros(D))
        self.k_norm = nn.Module()
        self.k_norm.weight = nn.Parameter(torch.zeros(D))

    def forward(self, x, cos, sin, cache, rows, slots, bias, packing=None, fuse=None):
        c = self.config
        qkvg = self.qkv_proj(x)
        if packing is not None:
            qkvg = packing.unpack(qkvg)
        q, k, v, gate = (fuse or ops.gated_qkv_norm_rope)(qkvg, self.q_norm.weight, self.k_norm.weight, cos, sin,
                                                          c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps)
        o = self.attend(q, k, v, cache.k[self.index], cache.v[self.index], rows, slots, bias)
        o = o * torch.sigmoid(gate)
        return self.o_proj(packing.pack(o) if packing is not None else o)

    def forward_causal(self, x, cos, sin):
        """Plain causal attention over the chunk itself (no cache). x [B,T,C]."""
        c = self.config
        B, T, _ = x.shape
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        q, k, v, gate = ops.gated_qkv_norm_rope(self.qkv_proj(x), self.q_norm.weight, self.k_norm.weight, cos, sin,
                                                H, Hkv, D, c.rms_norm_eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if Hkv != H:
            k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B,H,T,D]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(gate))


class HybridBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        C = config.hidden_size
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.zeros(C))
        if layer in config.linear_layers:
            self.linear_attn = GatedDeltaNet(config, config.linear_layers.index(layer))
        else:
            self.self_attn = GatedAttention(config, config.attention_layers.index(layer))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.zeros(C))
        self.mlp = MLP(config)

    @property
    def recurrent(self) -> bool:
        return hasattr(self, "linear_attn")


class HybridTransformer(nn.Module):
    """Decoder-only LM with Gated DeltaNet and gated attention layers (see the module docstring)."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(config, i) for i in range(config.num_layers))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.zeros(config.hidden_size))
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

    def new_cache(self, batch: int, capacity: int, nodes: int = 1) -> HybridCache:
        """The decode cache of `batch` rows of `capacity` slots, with a scratch for trees of up to
        `nodes` nodes."""
        return HybridCache.allocate(self.config, batch, capacity, self.device, self.dtype, nodes)

    def forward(
        self,
        tokens: torch.Tensor,  # [B,T] int64
        positions: torch.Tensor,  # [B,T] int64 RoPE positions
        cache,  # the engine's hybrid cache (K/V of the attention layers, states of the GDN layers)
        slots: torch.Tensor,  # [B,T] int64 cache slots written by this chunk
        mask: torch.Tensor,  # [B,1,T,S] bool: may query t attend to cache slot s
        logits_for: torch.Tensor | None = None,  # [B,T'] indices of T to project (None: all)
        capture: tuple[int, ...] = (),  # layer ids whose outputs to return as features (-1: embedding)
        pack: torch.Tensor | None = None,  # [M] flat indices into B*T: compute only these rows
        recurrence: Recurrence | None = None,  # None: a causal chunk committing its last token
    ):
        """As `Transformer.forward`; the GDN layers continue the states `recurrence` names."""
        c = self.config
        B, T = tokens.shape
        dev = tokens.device
        eps = c.rms_norm_eps
        if recurrence is None:
            recurrence = Recurrence.chunk(torch.full((B,), T - 1, dtype=torch.int64, device=dev))
        norm, add_norm = ops.fused("rms_norm_1p", dev), ops.fused("add_rms_norm_1p", dev)
        qkv_rope, act = ops.fused("gated_qkv_norm_rope", dev), ops.fused("silu_mul", dev)
        out_norm = ops.fused("gated_rms_norm", dev)
        h = self.embed_tokens(tokens)  # [B,T,C]
        cos = self.rope_cos[positions].to(h.dtype).unsqueeze(2)  # [B,T,1,R]
        sin = self.rope_sin[positions].to(h.dtype).unsqueeze(2)
        G = c.num_heads // c.num_kv_heads
        bias = ops.attention_bias(mask, h.dtype, G)  # [B,1,G*T,S]
        rows = torch.arange(B, device=dev)[:, None].expand(B, T)
        packing = None
        if pack is not None:
            if logits_for is not None:
                raise ValueError("pack excludes logits_for")
            packing = Packing(pack, B, T)
            h = packing.pack(h)  # [1,M,C]
        x = norm(h, self.layers[0].input_layernorm.weight, eps)
        kept: dict[int, torch.Tensor] = {-1: h} if -1 in capture else {}
        for i, layer in enumerate(self.layers):
            if layer.recurrent:
                a = layer.linear_attn(x, positions, cache, recurrence, packing, fuse=out_norm)
            else:
                a = layer.self_attn(x, cos, sin, cache, rows, slots, bias, packing, fuse=qkv_rope)
            h, x = add_norm(h, a, layer.post_attention_layernorm.weight, eps)
            m = layer.mlp(x, act=act)
            nxt = self.layers[i + 1].input_layernorm.weight if i + 1 < len(self.layers) else self.norm.weight
            h, x = add_norm(h, m, nxt, eps)
            if i in capture:
                kept[i] = x if i + 1 == len(self.layers) else h
        if logits_for is not None:
            x = torch.gather(x, 1, logits_for[..., None].expand(-1, -1, x.shape[-1]))
        if capture:
            features = torch.cat([kept[i] for i in capture], dim=-1)
            return self.lm_head(x), packing.unpack(features) if packing is not None else features
        return self.lm_head(x)

    def forward_causal(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()):
        """Logits [B,T,V] of tokens [B,T] starting at position 0, no cache, differentiable (training);
        with `capture`, (logits, features [B,T,len(capture)*C]) as `forward` returns them."""
        c = self.config
        B, T = tokens.shape
        h = self.embed_tokens(tokens)
        positions = torch.arange(T, device=tokens.device)
        cos = self.rope_cos[positions].to(h.dtype)[None, :, None]  # [1,T,1,R]
        sin = self.rope_sin[positions].to(h.dtype)[None, :, None]
        kept = {-1: h} if -1 in capture else {}
        for i, layer in enumerate(self.layers):
            x = ops.rms_norm_1p(h, layer.input_layernorm.weight, c.rms_norm_eps)
            h = h + (layer.linear_attn.forward_causal(x) if layer.recurrent else layer.self_attn.forward_causal(x, cos, sin))
            h = h + layer.mlp(ops.rms_norm_1p(h, layer.post_attention_layernorm.weight, c.rms_norm_eps))
            if i in capture:
                kept[i] = ops.rms_norm_1p(h, self.norm.weight, c.rms_norm_eps) if i + 1 == len(self.layers) else h
        logits = self.lm_head(ops.rms_norm_1p(h, self.norm.weight, c.rms_norm_eps))
        return (logits, torch.cat([kept[i] for i in capture], dim=-1)) if capture else logits


# ---- Hugging Face layouts ------------------------------------------------------------------

def hf_prefix(hf_names) -> str:
    """'model.language_model.' for a `Qwen3_5ForConditionalGeneration` checkpoint, else 'model.'."""
    return "model.language_model." if any(n.startswith("model.language_model.") for n in hf_names) else "model."


def hf_tensor_shapes(config: ModelConfig, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of this config must hold, with its shape."""
    c = config
    C, I, D, V = c.hidden_size, c.intermediate_size, c.head_dim, c.vocab_size
    H, Hkv = c.num_heads, c.num_kv_heads
    Hv, Cc, Vd = c.linear_num_value_heads, c.conv_dim, c.linear_value_dim
    shapes = {prefix + "embed_tokens.weight": (V, C), prefix + "norm.weight": (C,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, C)
    for i in range(c.num_layers):
        p = f"{prefix}layers.{i}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,)})
        if i not in c.moe_layers:  # a sparse layer's experts: `models/moe.py`
            shapes.update({p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
                           p + "mlp.down_proj.weight": (C, I)})
        if i in c.linear_layers:
            a = p + "linear_attn."
            shapes.update({a + "conv1d.weight": (Cc, 1, c.linear_conv_kernel_dim), a + "A_log": (Hv,),
                           a + "dt_bias": (Hv,), a + "norm.weight": (c.linear_value_head_dim,),
                           a + "out_proj.weight": (C, Vd)})
            if c.family == "qwen3_next":
                shapes.update({a + "in_proj_qkvz.weight": (Cc + Vd, C), a + "in_proj_ba.weight": (2 * Hv, C)})
            else:
                shapes.update({a + "in_proj_qkv.weight": (Cc, C), a + "in_proj_z.weight": (Vd, C),
                               a + "in_proj_b.weight": (Hv, C), a + "in_proj_a.weight": (Hv, C)})
        else:
            a = p + "self_attn."
            shapes.update({a + "q_proj.weight": (2 * H * D, C), a + "k_proj.weight": (Hkv * D, C),
                           a + "v_proj.weight": (Hkv * D, C), a + "o_proj.weight": (C, H * D),
                           a + "q_norm.weight": (D,), a + "k_norm.weight": (D,)})
    return shapes


def _rows(w, index: torch.Tensor):
    """Rows `index` of a weight (a tensor, or a packed format with `take_rows`)."""
    return w[index] if isinstance(w, torch.Tensor) else w.take_rows(index)


def _qkvz_order(c: ModelConfig) -> torch.Tensor:
    """Qwen3-Next `in_proj_qkvz` row of each of our [q | k | v | z] rows (per key head g its rows
    are [q_g Dk | k_g Dk | v_g r*Dv | z_g r*Dv], r = Hv / Hk)."""
    Hk, Dk, r, Dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads // c.linear_num_key_heads, \
        c.linear_value_head_dim
    per = 2 * Dk + 2 * r * Dv
    base = torch.arange(Hk)[:, None] * per
    part = lambda off, n: (base + off + torch.arange(n)[None]).reshape(-1)  # noqa: E731
    return torch.cat([part(0, Dk), part(Dk, Dk), part(2 * Dk, r * Dv), part(2 * Dk + r * Dv, r * Dv)])


def _ba_order(c: ModelConfig) -> torch.Tensor:
    """Qwen3-Next `in_proj_ba` row of each of our [b | a] rows (per key head: [b_g r | a_g r])."""
    Hk, r = c.linear_num_key_heads, c.linear_num_value_heads // c.linear_num_key_heads
    base = torch.arange(Hk)[:, None] * 2 * r
    return torch.cat([(base + torch.arange(r)).reshape(-1), (base + r + torch.arange(r)).reshape(-1)])


def _gate_order(c: ModelConfig) -> torch.Tensor:
    """q_proj row of each of our [q | gate] rows (per head h its rows are [q_h D | gate_h D])."""
    H, D = c.num_heads, c.head_dim
    base = torch.arange(H)[:, None] * 2 * D
    return torch.cat([(base + torch.arange(D)).reshape(-1), (base + D + torch.arange(D)).reshape(-1)])


def to_fused_state(config: ModelConfig, hf: dict) -> dict:
    """HF names (either layout) -> our parameter names (values may be tensors or W12 weights)."""
    from specpilot.models.fusion import concat_rows

    c = config
    P = hf_prefix(hf)
    H, D = c.num_heads, c.head_dim
    out = {"embed_tokens.weight": hf[P + "embed_tokens.weight"], "norm.weight": hf[P + "norm.weight"]}
    out["lm_head.weight"] = hf[P + "embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]
    gate_order = _gate_order(c)
    for i in range(c.num_layers):
        p, q = f"{P}layers.{i}.", f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[q + n + ".weight"] = hf[p + n + ".weight"]
        if i not in c.moe_layers:
            out[q + "mlp.gate_up_proj.weight"] = concat_rows([hf[p + "mlp.gate_proj.weight"],
                                                              hf[p + "mlp.up_proj.weight"]])
            out[q + "mlp.down_proj.weight"] = hf[p + "mlp.down_proj.weight"]
        if i in c.linear_layers:
            a, b = p + "linear_attn.", q + "linear_attn."
            if c.family == "qwen3_next":
                qkvz = _rows(hf[a + "in_proj_qkvz.weight"], _qkvz_order(c))
                ba = _rows(hf[a + "in_proj_ba.weight"], _ba_order(c))
                out[b + "in_proj.weight"] = concat_rows([qkvz, ba])
            else:
                out[b + "in_proj.weight"] = concat_rows([hf[a + f"in_proj_{n}.weight"] for n in ("qkv", "z", "b", "a")])
            out[b + "conv_weight"] = hf[a + "conv1d.weight"][:, 0]
            for n in ("A_log", "dt_bias", "norm.weight", "out_proj.weight"):
                out[b + n] = hf[a + n]
        else:
            a, b = p + "self_attn.", q + "self_attn."
            q_gate = _rows(hf[a + "q_proj.weight"], gate_order)
            wq, wg = (q_gate[: H * D], q_gate[H * D:]) if isinstance(q_gate, torch.Tensor) else \
                q_gate.split_rows([H * D, H * D])
            out[b + "qkv_proj.weight"] = concat_rows([wq, hf[a + "k_proj.weight"], hf[a + "v_proj.weight"], wg])
            for n in ("o_proj.weight", "q_norm.weight", "k_norm.weight"):
                out[b + n] = hf[a + n]
    return out


def to_hf_state(model: HybridTransformer) -> dict[str, torch.Tensor]:
    """Our parameters -> HF names of the model's own layout (`config.family`), contiguous CPU tensors."""
    c = model.config
    H, Hkv, D, I = c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    Cc, Vd, Hv = c.conv_dim, c.linear_value_dim, c.linear_num_value_heads
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    hf = {"model.embed_tokens.weight": sd["embed_tokens.weight"], "model.norm.weight": sd["norm.weight"]}
    if not c.tie_word_embeddings:
        hf["lm_head.weight"] = sd["lm_head.weight"]
    inverse = lambda order: torch.argsort(order)  # noqa: E731  our row -> HF row, inverted
    for i in range(c.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            hf[p + n + ".weight"] = sd[q + n + ".weight"]
        if i not in c.moe_layers:
            wg, wu = sd[q + "mlp.gate_up_proj.weight"].split([I, I])
            hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = wg, wu
            hf[p + "mlp.down_proj.weight"] = sd[q + "mlp.down_proj.weight"]
        if i in c.linear_layers:
            a, b = p + "linear_attn.", q + "linear_attn."
            w = sd[b + "in_proj.weight"]
            if c.family == "qwen3_next":
                qkvz, ba = w.split([Cc + Vd, 2 * Hv])
                hf[a + "in_proj_qkvz.weight"] = qkvz[inverse(_qkvz_order(c))]
                hf[a + "in_proj_ba.weight"] = ba[inverse(_ba_order(c))]
            else:
                for n, part in zip(("qkv", "z", "b", "a"), w.split([Cc, Vd, Hv, Hv])):
                    hf[a + f"in_proj_{n}.weight"] = part
            hf[a + "conv1d.weight"] = sd[b + "conv_weight"][:, None]
            for n in ("A_log", "dt_bias", "norm.weight", "out_proj.weight"):
                hf[a + n] = sd[b + n]
        else:
            a, b = p + "self_attn.", q + "self_attn."
            wq, wk, wv, wg = sd[b + "qkv_proj.weight"].split([H * D, Hkv * D, Hkv * D, H * D])
            hf[a + "q_proj.weight"] = torch.cat([wq, wg])[inverse(_gate_order(c))]
            hf[a + "k_proj.weight"], hf[a + "v_proj.weight"] = wk, wv
            for n in ("o_proj.weight", "q_norm.weight", "k_norm.weight"):
                hf[a + n] = sd[b + n]
    return {k: v.contiguous() for k, v in hf.items()}
