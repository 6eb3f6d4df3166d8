"""The EAGLE-3 draft head (`SafeAILab/EAGLE: eagle/model/cnets.py`, SpecForge `llama3_eagle.py`,
SGLang and vLLM `llama_eagle3.py`) in our fused layout.

One Llama decoder layer over two streams. `h` is either the fused target features
`fc(cat(f_low, f_mid, f_high))` (3*C_t -> C; the residual stream *entering* target layers
`layer_ids`, default (2, L//2, L-3)) or, deeper in a draft tree, the head's own output of the
parent node. With `e` the token's embedding (the target's, or the checkpoint's own table):

    x = cat(input_layernorm(e), hidden_norm(h))        # [.., 2C] -> q/k/v projections
    h' = h + o_proj(attention(x))                      # residual: h (vLLM's norm_before_residual
    h' = h' + mlp(post_attention_layernorm(h'))        #   variant: hidden_norm(h))
    logits = lm_head(norm(h'))                         # over the draft vocabulary [Vd]

Pairing (EAGLE's `input_ids[:, 1:]`): slot t consumes (feature of token t, embedding of token
t + 1) at RoPE position t and predicts token t + 2. A draft vocabulary smaller than the target's
maps draft id i to target id `i + d2t[i]`; `t2d[v]` marks the target ids it covers.

Owns: the module, its `Eagle3Spec`, the math of the layer (cached forward; the pieces the training
recipe assembles), and exact width expansion. Does not own where K/V live or what may be attended
(`specpilot.engine.drafters.eagle3`) or files (`eagle3_checkpoint.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from specpilot.models import ops
from specpilot.models.config import ModelConfig
from specpilot.models.transformer import Block, RMSNorm, rope_tables


def default_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's feature layers: the inputs of layers 2, L//2 and L-3 (SafeAILab, SGLang, vLLM)."""
    L = num_target_layers
    return (2, L // 2, L - 3)


@dataclass(frozen=True)
class Eagle3Spec:
    """What an EAGLE-3 head needs from and promises to its target."""

    layer_ids: tuple[int, ...]  # target layers whose *input* is fused, in order (0 = the embedding)
    target_hidden_size: int  # C_t of each feature (fc consumes len(layer_ids) * C_t)
    draft_vocab_size: int  # Vd: rows of lm_head
    norm_before_residual: bool = False  # residual = hidden_norm(h) instead of h (vLLM option)
    num_target_layers: int | None = None  # layers of the target it was made for (informative)

    @property
    def capture_ids(self) -> tuple[int, ...]:
        """The same features as `Transformer.forward(capture=...)` ids: layer i's input is layer
        i - 1's output, the embedding's id is -1."""
        return tuple(i - 1 for i in self.layer_ids)


class Eagle3Layer(Block):
    """A decoder block whose q/k/v projections read [input_layernorm(e) ; hidden_norm(h)] (2C)."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        c = config
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        width = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        self.self_attn.qkv_proj = nn.Linear(2 * c.hidden_size, width, bias=False)


class Eagle3Model(nn.Module):
    """Parameters: `midlayer.*` (fused qkv / gate_up), `fc`, `norm`, `lm_head`, optionally
    `embed_tokens`; buffers `d2t` [Vd] int64 and `t2d` [V] bool."""

    def __init__(self, config: ModelConfig, spec: Eagle3Spec, max_positions: int | None = None,
                 own_embedding: bool = False):
        super().__init__()
        self.config, self.spec = config, spec
        C = config.hidden_size
        self.midlayer = Eagle3Layer(config)
        self.fc = nn.Linear(len(spec.layer_ids) * spec.target_hidden_size, C, bias=False)
        self.norm = RMSNorm(C, config.rms_norm_eps)
        self.lm_head = nn.Linear(C, spec.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(config.vocab_size, C) if own_embedding else None
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        cos, sin = rope_tables(config, max_positions or config.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Target capture ids (layer outputs, -1 = embedding) of the fused features."""
        return self.spec.capture_ids

    def token_ids(self) -> torch.Tensor | None:
        """[Vd] target id of each draft id, or None when the draft vocabulary is the target's."""
        if self.spec.draft_vocab_size == self.config.vocab_size and not bool(self.d2t.any()):
            return None
        return torch.arange(self.spec.draft_vocab_size, device=self.d2t.device) + self.d2t

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return self.rope_cos[positions].to(dtype).unsqueeze(2), self.rope_sin[positions].to(dtype).unsqueeze(2)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """features [.., n*C_t] -> h [.., C]."""
        return self.fc(features)

    def project(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """(q [B,T,H,D], k, v [B,T,Hkv,D], residual [B,T,C]) of embeddings and hidden states [B,T,C]."""
        layer, eps, dev = self.midlayer, self.config.rms_norm_eps, emb.device
        norm = ops.fused("rms_norm", dev)  # the elementwise pieces compiled as in the target (`ops.py`)
        h = norm(hidden, layer.hidden_norm.weight, eps)
        x = torch.cat([norm(emb, layer.input_layernorm.weight, eps), h], dim=-1)  # [B,T,2C]
        cos, sin = self._rope(positions, x.dtype)
        q, k, v = layer.self_attn.project(x, cos, sin, fuse=ops.fused("qkv_norm_rope", dev))
        return q, k, v, h if self.spec.norm_before_residual else hidden

    def finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer's output (pre-norm) [B,T,C] from the residual and the attention output
        (after o_proj) [B,T,C]."""
        layer, dev = self.midlayer, residual.device
        h, x = ops.fused("add_rms_norm", dev)(residual, attn, layer.post_attention_layernorm.weight, self.config.rms_norm_eps)
        return h + layer.mlp(x, act=ops.fused("silu_mul", dev))

    def forward_cached(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache,
                       slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Output hidden states [B,T,C] (pre-norm) of (emb, hidden) [B,T,C] at positions [B,T].

        K/V are written at `slots [B,T]` of `cache` (one layer); `mask [B,1,T,S]` says which cache
        slots each query sees.
        """
        B, T, _ = emb.shape
        c = self.config
        q, k, v, residual = self.project(emb, hidden, positions)
        G = c.num_heads // c.num_kv_heads
        bias = ops.attention_bias(mask, q.dtype, G)  # [B,1,G*T,S]
        rows = torch.arange(B, device=q.device)[:, None].expand(B, T)
        o = self.midlayer.self_attn.attend_cached(q, k, v, cache.k[0], cache.v[0], rows, slots, bias)
        return self.finish(residual, o)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., Vd] draft-vocabulary logits of output hidden states."""
        return self.lm_head(ops.fused("rms_norm", hidden.device)(hidden, self.norm.weight, self.config.rms_norm_eps))


def expand_eagle3(model: Eagle3Model, factor: int) -> Eagle3Model:
    """`model` widened `factor` times beside a target widened the same way (`expand.py`'s rules).

    The layer's q/k/v read two copy-major groups ([e ; h], each C widened to f*C), so each group's
    columns are tiled and scaled and q/k/v rows copied; `fc` reads n feature groups the same way;
    `lm_head` consumes the residual stream (scaled), `embed_tokens` produces it (copied);
    `d2t`/`t2d` are unchanged.
    """
    from specpilot.models.expand import check_factor, expand_tensor, expanded_config, tile

    check_factor(factor)
    if factor == 1:
        return model
    c, f = model.config, factor
    D, C, Ct = c.head_dim, c.hidden_size, model.spec.target_hidden_size
    wide_spec = replace(model.spec, target_hidden_size=Ct * f)
    wide = Eagle3Model(expanded_config(c, f), wide_spec, max_positions=model.rope_cos.shape[0],
                       own_embedding=model.embed_tokens is not None)
    state = {}
    for name, w in model.state_dict().items():
        w = w.detach()
        if name in ("d2t", "t2d"):
            state[name] = w.clone()
        elif name == "midlayer.self_attn.qkv_proj.weight":  # [(H+2Hkv)D, 2C]
            rows = [c.num_heads * D, c.num_kv_heads * D, c.num_kv_heads * D]
            state[name] = torch.cat([tile(list(g.split(rows)), f, f, f, scale=True) for g in w.split(C, 1)], 1)
        elif name == "fc.weight":  # [C, n*C_t] -> [f*C, n*f*C_t]
            state[name] = torch.cat([tile([g], f, f, f, scale=True) for g in w.split(Ct, 1)], 1)
        else:  # norms, o_proj, gate_up / down, lm_head, embed_tokens: as in any decoder
            state[name] = expand_tensor(name, w, c, f)
    wide.load_state_dict(state, strict=True)
    cos, sin = wide.rope_cos, wide.rope_sin  # float32, as the target's
    wide.to(device=model.device, dtype=model.dtype)
    wide.rope_cos, wide.rope_sin = cos.to(model.device), sin.to(model.device)
    return wide.eval().requires_grad_(False)


def random_eagle3(target_config: ModelConfig, layer_ids: tuple[int, ...] | None = None,
                  draft_vocab: torch.Tensor | None = None, intermediate_size: int | None = None,
                  own_embedding: bool = False, seed: int = 0) -> Eagle3Model:
    """A randomly initialised EAGLE-3 head for `target_config` (tests, training start).

    `draft_vocab` (sorted target ids) gives a reduced draft vocabulary with its d2t/t2d.
    """
    ids = layer_ids or default_layer_ids(target_config.num_layers)
    config = target_config.dense().with_changes(family="llama", qk_norm=False, num_layers=1, tie_word_embeddings=False,
                                        intermediate_size=intermediate_size or target_config.intermediate_size)
    Vd = target_config.vocab_size if draft_vocab is None else int(draft_vocab.numel())
    spec = Eagle3Spec(tuple(ids), target_config.hidden_size, Vd, num_target_layers=target_config.num_layers)
    model = Eagle3Model(config, spec, own_embedding=own_embedding)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / p.shape[1] ** 0.5))
            elif name == "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        if draft_vocab is not None:
            model.d2t.copy_(draft_vocab - torch.arange(Vd))
            model.t2d.zero_()
            model.t2d[draft_vocab] = True
    return model
