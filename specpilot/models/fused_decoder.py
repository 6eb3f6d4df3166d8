"""A dense draft model whose cached forward runs each decoder layer in four fused kernels
(`draft_kernel = "fused"`).

Owns: `FusedDecoder`, a `Transformer` whose `forward` over the static cache runs, per layer,
`kernels.draft_layer`'s norm+qkv+q/k norm+RoPE+cache write, the attention the `attention` knob picks,
the output projection with the residual add, norm+gate|up+SiLU*up, and the down projection with the
residual add; then the final norm with the lm_head. The reference `Transformer.forward` launches
about a dozen kernels per layer for the same work (projections, the fused elementwise pieces, two
cache writes, the adds and norms). `use_fused_layers` turns a (cloned) Transformer into one.

Falls back to `Transformer.forward` (the same function up to float32 summation order) where the kernels
do not apply: more than `draft_layer.MAX_ROWS` rows (prefill), packed rows or captured features,
off CUDA without the interpreter, projections another kernel owns (`replace_linears`), or shapes the
kernels do not take (`supported`).

Does not own the kernels (`kernels.draft_layer`) or which drafters use it (`engine.session`).
"""

from __future__ import annotations

import torch
from torch import nn

from specpilot.kernels import draft_layer
from specpilot.models import ops
from specpilot.models.transformer import Transformer


def supported(model: Transformer) -> bool:
    """Whether `model`'s shapes fit the kernels: a dense Transformer, plain projections, RoPE over the
    whole head, a head size the kernels take."""
    c = model.config
    plain = all(isinstance(getattr(layer.self_attn, n), nn.Linear) for layer in model.layers for n in ("qkv_proj", "o_proj"))
    plain = plain and all(isinstance(getattr(layer, "mlp", None), nn.Module) and
                          isinstance(getattr(layer.mlp, "gate_up_proj", None), nn.Linear) and
                          isinstance(getattr(layer.mlp, "down_proj", None), nn.Linear) for layer in model.layers)
    return (plain and isinstance(model.lm_head, nn.Linear) and c.rotary_dim == c.head_dim
            and c.head_dim in draft_layer.HEAD_DIMS and not c.moe_layers and not c.hybrid)


class FusedDecoder(Transformer):
    """A Transformer whose cached forward of few rows runs the fused draft-layer kernels."""

    def forward(self, tokens, positions, cache, slots, mask, logits_for=None, capture=(), pack=None, recurrence=None):
        """`Transformer.forward`'s logits [B,T,V] (or [B,T',V] with `logits_for`) by the fused kernels
        where they apply, else by `Transformer.forward` itself."""
        B, T = tokens.shape
        if capture or pack is not None or not draft_layer.applies(self.embed_tokens.weight, B * T) or not supported(self):
            return super().forward(tokens, positions, cache, slots, mask, logits_for, capture, pack, recurrence)
        c = self.config
        H, Hkv, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        h = self.embed_tokens(tokens).view(B * T, -1)  # [M,C]
        # the additive mask with GQA groups folded in, as `Transformer.forward` builds it
        G = H // Hkv
        bias = ops.attention_bias(mask, h.dtype, G)  # [B,1,G*T,S]
        pos, slot = positions.reshape(B * T), slots.reshape(B * T)  # [M]
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qw = attn.q_norm.weight if attn.q_norm is not None else None
            kw = attn.k_norm.weight if attn.k_norm is not None else None
            q = draft_layer.norm_qkv_rope(h, layer.input_layernorm.weight, attn.qkv_proj.weight, qw, kw,
                                          self.rope_cos, self.rope_sin, pos, slot, cache.k[i], cache.v[i],
                                          T, H, Hkv, eps)  # [M,H,D]; k, v in the cache
            o = attn.attend_over_cache(q.view(B, T, H, D), cache.k[i], cache.v[i], bias)  # [B,T,H*D]
            h = draft_layer.gemv_residual(h, o.reshape(B * T, H * D), attn.o_proj.weight)
            a = draft_layer.norm_gate_up_silu(h, layer.post_attention_layernorm.weight, mlp.gate_up_proj.weight, eps)
            h = draft_layer.gemv_residual(h, a, mlp.down_proj.weight)
        h = h.view(B, T, -1)
        if logits_for is not None:  # the norm is per row: gathering before it is gathering after it
            h = torch.gather(h, 1, logits_for[..., None].expand(-1, -1, h.shape[-1]))
        Bo, To, C = h.shape  # To may be 0 (no logits asked for)
        logits = draft_layer.norm_gemv(h.reshape(Bo * To, C), self.norm.weight, self.lm_head.weight, eps)
        return logits.view(Bo, To, self.lm_head.weight.shape[0])


def use_fused_layers(model: Transformer) -> Transformer:
    """`model` (a plain Transformer, e.g. a clone sharing the session's tensors) turned, in place,
    into a `FusedDecoder`; returns it."""
    if type(model) is not Transformer:
        raise TypeError(f"fused draft layers need a dense Transformer, got {type(model).__name__}")
    model.__class__ = FusedDecoder
    return model
