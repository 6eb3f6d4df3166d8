"""The DFlash block drafter network (`z-lab/dflash: dflash/model.py`) in our fused layout.

A few Qwen3 blocks at the target's width. Target features (the outputs of `target_layer_ids`,
concatenated, [.., n*C]) are fused into a context stream `x = hidden_norm(fc(features))`; each
layer turns it into context K/V (`k_norm(k_proj(x))` with RoPE at the token's absolute position,
`v_proj(x)`) with no layer norm and no query. The block ("noise") tokens — the last committed token
and block_size - 1 mask positions — are the only queries: they attend, non-causally, to the cached
context and to the whole block. The drafter has no embedding or head: it embeds with the target's
`embed_tokens` (the mask position uses `mask_embedding`, the embedding of the checkpoint's
`mask_token_id` or a learned vector) and projects its final-normed outputs with the target's
`lm_head`.

Target embedding and head, as the public reference computes them (`z-lab/dflash`'s current
`dflash_generate`, vLLM's DFlash2): the block's inputs are the *raw* rows of the target's input
embedding table times `dflash_config.input_embedding_scale` (default 1.0), so a drafter trained
beside a target that scales its embeddings (Gemma's sqrt(C)) states that scale itself; the draft
logits are the target's `lm_head` times `output_multiplier` (default 1.0), then soft-capped at the
drafter's own `final_logit_softcapping` (none by default; the target's cap is not applied).
`input_embeddings` and `logits` hold these rules for the drafter and the training recipe.

Owns: the module, its `DFlashSpec`, and the math of one layer. Does not own where K/V live or
what may be attended (`specpilot.engine.drafters.dflash`), or files (`dflash_checkpoint.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from specpilot.models import ops
from specpilot.models.config import ModelConfig
from specpilot.models.transformer import Block, RMSNorm, rope_tables


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default feature layers: spread uniformly over layers 1..L-3 (one per draft layer)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    return tuple(int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashSpec:
    """What a DFlash drafter needs from and promises to its target."""

    target_layer_ids: tuple[int, ...]  # target layers whose outputs are the features, in order
    block_size: int = 16  # trained block length (root + block_size - 1 mask positions)
    mask_token_id: int | None = None  # target token whose embedding is the mask; None = learned
    num_target_layers: int | None = None  # layers of the target it was built for (another depth is refused)
    input_embedding_scale: float = 1.0  # block inputs = the target's raw embedding rows x this
    output_multiplier: float = 1.0  # draft logits = the target's lm_head x this ...
    final_logit_softcapping: float = 0.0  # ... then cap * tanh(logits / cap); 0: none


class DFlashModel(nn.Module):
    """Parameters: `layers.N.*` (our fused Block layout), `fc`, `hidden_norm`, `norm`, `mask_embedding`."""

    def __init__(self, config: ModelConfig, spec: DFlashSpec, max_positions: int | None = None):
        super().__init__()
        self.config, self.spec = config, spec
        C = config.hidden_size
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.fc = nn.Linear(len(spec.target_layer_ids) * C, C, bias=False)
        self.hidden_norm = RMSNorm(C, config.rms_norm_eps)
        self.norm = RMSNorm(C, config.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(C))
        cos, sin = rope_tables(config, max_positions or config.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def cast(self, device, dtype: torch.dtype) -> "DFlashModel":
        """Parameters to `dtype` on `device`; the rotary tables stay float32, as the target's."""
        cos, sin = self.rope_cos.float(), self.rope_sin.float()
        self.to(device=device, dtype=dtype)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.spec.target_layer_ids

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return self.rope_cos[positions].to(dtype).unsqueeze(2), self.rope_sin[positions].to(dtype).unsqueeze(2)

    def input_embeddings(self, embed: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        """Block inputs [.., C] of token ids [..]: the target's raw embedding rows (`embed`, its
        `embed_tokens`) times `spec.input_embedding_scale`."""
        e = embed(ids)
        scale = self.spec.input_embedding_scale
        return e if scale == 1.0 else e * scale

    def logits(self, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits [.., V] of final-normed hidden states [.., C] through the target's `lm_head`,
        times `spec.output_multiplier`, soft-capped at `spec.final_logit_softcapping` when set."""
        logits = lm_head(hidden)
        if self.spec.output_multiplier != 1.0:
            logits = logits * self.spec.output_multiplier
        cap = self.spec.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor):
        """Per layer (k, v) [B,T,Hkv,D] of context tokens. features [B,T,n*C]; positions [B,T]."""
        x = self.hidden_norm(self.fc(features))  # [B,T,C]
        cos, sin = self._rope(positions, x.dtype)
        out = []
        for layer in self.layers:
            _, k, v = layer.self_attn.project(x, cos, sin)  # the query part is unused
            out.append((k, v))
        return out

    def block_forward(self, noise: torch.Tensor, positions: torch.Tensor, cache, slots: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states [B,T,C] of block tokens `noise [B,T,C]` (already embedded).

        Their K/V are written at `slots [B,T]` of `cache` (one entry per draft layer); `mask
        [B,1,T,S]` says which cache slots each block token sees (context and the whole block).
        """
        B, T, _ = noise.shape
        c = self.config
        h = noise
        cos, sin = self._rope(positions, h.dtype)
        G = c.num_heads // c.num_kv_heads
        bias = ops.attention_bias(mask, h.dtype, G)  # [B,1,G*T,S]
        rows = torch.arange(B, device=h.device)[:, None].expand(B, T)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = attn.project(layer.input_layernorm(h), cos, sin)
            h = h + attn.attend_cached(q, k, v, cache.k[i], cache.v[i], rows, slots, bias)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)

    def forward_dense(self, features: torch.Tensor, ctx_positions: torch.Tensor, noise: torch.Tensor,
                      positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Training forward without a cache: final-normed hidden [B,Q,C] of block tokens.

        features [B,S,n*C] at ctx_positions [B,S] give the context keys; noise [B,Q,C] at
        positions [B,Q] are the blocks' tokens (several blocks side by side); mask [B,1,Q,S+Q] bool
        over keys [context ; blocks] says what each block token sees (`tools/dflash_objective.py`).
        """
        B, Q, _ = noise.shape
        c = self.config
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        ctx = self.hidden_norm(self.fc(features))
        ctx_cos, ctx_sin = self._rope(ctx_positions, ctx.dtype)
        cos, sin = self._rope(positions, noise.dtype)
        h = noise
        for layer in self.layers:
            attn = layer.self_attn
            _, kc, vc = attn.project(ctx, ctx_cos, ctx_sin)
            q, kq, vq = attn.project(layer.input_layernorm(h), cos, sin)
            k = torch.cat([kc, kq], 1).transpose(1, 2).repeat_interleave(H // Hkv, 1)  # [B,H,S+Q,D]
            v = torch.cat([vc, vq], 1).transpose(1, 2).repeat_interleave(H // Hkv, 1)
            o = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(B, Q, H * D))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)


def expand_dflash(model: DFlashModel, factor: int) -> DFlashModel:
    """`model` widened `factor` times beside a target widened the same way (`expand.py`'s rules).

    The blocks expand like any decoder block; `fc` consumes n copy-major feature groups (each
    layer's C widened to f*C), so each group's columns are tiled and scaled and its rows copied;
    `mask_embedding` produces the residual stream, so it is copied, not scaled.
    """
    from specpilot.models.expand import check_factor, expand_tensor, expanded_config, tile

    check_factor(factor)
    if factor == 1:
        return model
    c, f = model.config, factor
    wide = DFlashModel(expanded_config(c, f), model.spec, max_positions=model.rope_cos.shape[0])
    state = {}
    for name, w in model.state_dict().items():
        w = w.detach()
        if name == "fc.weight":  # [C, n*C] -> [f*C, n*f*C]
            state[name] = torch.cat([tile([part], f, f, f, scale=True) for part in w.split(c.hidden_size, 1)], 1)
        elif name == "mask_embedding":
            state[name] = w.repeat(f)
        else:
            state[name] = expand_tensor(name, w, c, f)
    wide.load_state_dict(state, strict=True)
    return wide.cast(model.device, model.dtype).eval().requires_grad_(False)


def random_dflash(target_config: ModelConfig, num_layers: int = 2, block_size: int = 16,
                  target_layer_ids: tuple[int, ...] | None = None, mask_token_id: int | None = None,
                  seed: int = 0) -> DFlashModel:
    """A randomly initialised DFlash drafter for `target_config` (tests, training start)."""
    ids = target_layer_ids or build_target_layer_ids(target_config.num_layers, num_layers)
    config = target_config.dense().with_changes(family="qwen3", qk_norm=True, num_layers=num_layers)
    spec = DFlashSpec(tuple(ids), block_size, mask_token_id, target_config.num_layers)
    model = DFlashModel(config, spec)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "mask_embedding":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model
