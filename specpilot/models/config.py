"""Model hyper-parameters of the decoders SpecPilot runs, read from a Hugging Face `config.json`.

Owns: the mapping from HF config fields to one frozen `ModelConfig` for every supported family
(`SUPPORTED_ARCHITECTURES`: dense Llama and Qwen3, transformers 4.x and 5.x spellings of RoPE
settings; the hybrid Gated DeltaNet families Qwen3-Next and Qwen3.5, whose `layer_types` interleave
linear-attention and full-attention layers; the mixture-of-experts fields of Qwen3-MoE and Qwen3-Next,
whose sparse layers `models/moe.py` builds; Gemma 3 and Gemma 4, whose `layer_types` interleave
sliding-window and global attention layers, `models/gemma.py`), and refusing what we do not support
with one clear line. Does not own weights or tokenizers (see `loading.py`, `tokenizer.py`) or which module class
builds a family (`registry.py`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specpilot.errors import CheckpointError

# HF `architectures` entry -> our family name.
SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",  # its text model (`text_config`); the vision tower is not loaded
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text model (`text_config`); the vision tower is not loaded
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",  # its text model; the vision and audio towers are not loaded
}
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5")  # Gated DeltaNet + gated full attention (`models/hybrid.py`)
MODEL_TYPES = {"qwen3": "qwen3", "llama": "llama", "qwen3_next": "qwen3_next", "qwen3_5_text": "qwen3_5",
               "qwen3_5": "qwen3_5", "qwen3_moe": "qwen3_moe", "gemma3_text": "gemma3", "gemma3": "gemma3",
               "gemma4_text": "gemma4", "gemma4": "gemma4"}
# families whose configs carry mixture-of-experts fields (`models/moe.py`), with HF's defaults for
# fields a config.json leaves out (they differ by family, as in transformers' config classes)
MOE_DEFAULTS = {
    "qwen3_moe": dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=False,
                      shared_expert_intermediate_size=0),
    "qwen3_next": dict(num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512, norm_topk_prob=True,
                       shared_expert_intermediate_size=512),
}

# `layer_types` entries of the hybrid families
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"
SLIDING_ATTENTION = "sliding_attention"  # Gemma's local layers (`sliding_window`)

# Gemma 3 / Gemma 4 text decoders (`models/gemma.py`), with transformers' defaults for the fields a
# config.json may leave out (a Gemma-3 multimodal checkpoint's `text_config` lists only a few)
GEMMA_DEFAULTS = {
    "gemma3": dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072,
                   rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
                   query_pre_attn_scalar=256, sliding_window=4096),
    "gemma4": dict(vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072,
                   rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, sliding_window=512,
                   vocab_size_per_layer_input=262_144, hidden_size_per_layer_input=256),
}
GEMMA_FAMILIES = tuple(GEMMA_DEFAULTS)


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1 style frequency scaling ("llama3" rope type)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "qwen3" | "llama"
    vocab_size: int
    hidden_size: int  # C
    intermediate_size: int
    num_layers: int
    num_heads: int  # H
    num_kv_heads: int
    head_dim: int  # D
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3 normalizes q and k per head before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # ---- hybrid families (Qwen3-Next, Qwen3.5); the defaults describe a dense decoder ----
    layer_types: tuple[str, ...] = ()  # per layer FULL_ATTENTION or LINEAR_ATTENTION; () = all full attention
    linear_num_key_heads: int = 0  # Gated DeltaNet q/k heads (Hk)
    linear_num_value_heads: int = 0  # Gated DeltaNet v heads (Hv, a multiple of Hk), one recurrent state each
    linear_key_head_dim: int = 0  # Dk
    linear_value_head_dim: int = 0  # Dv
    linear_conv_kernel_dim: int = 0  # causal depthwise conv width over [q|k|v]
    partial_rotary_factor: float = 1.0  # RoPE on the first head_dim * factor dims of q and k
    attn_output_gate: bool = False  # full attention's output times sigmoid(gate), gate from q_proj
    zero_centered_norms: bool = False  # RMSNorms scale by (1 + w), computed in float32
    # ---- mixture-of-experts MLPs (Qwen3-MoE, Qwen3-Next); the defaults describe a dense decoder ----
    num_experts: int = 0  # E routed experts of each sparse layer; 0: every MLP is dense
    num_experts_per_tok: int = 0  # k: the experts each token routes to (softmax over E, then top-k)
    moe_intermediate_size: int = 0  # each routed expert's SwiGLU width
    norm_topk_prob: bool = False  # renormalise the k routing weights to sum to 1
    decoder_sparse_step: int = 1  # layer i is sparse when (i + 1) % decoder_sparse_step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here (those keep the dense MLP)
    shared_expert_intermediate_size: int = 0  # > 0: a shared expert gated by sigmoid(x . w) in every sparse layer
    # ---- Gemma 3 / Gemma 4 (`models/gemma.py`); the defaults describe a dense decoder ----
    sliding_window: int = 0  # SLIDING_ATTENTION layers see keys with query_pos - key_pos < sliding_window
    sliding_rope_theta: float = 0.0  # RoPE base of the sliding layers (rope_theta: the full-attention layers')
    global_rope_factor: float = 1.0  # full-attention layers' RoPE frequencies / factor ("linear", "proportional")
    global_rope_proportion: float = 0.0  # > 0: Gemma-4's proportional RoPE on full-attention layers: the first
    # proportion * D/2 frequency pairs rotate (exponents over the whole D), the other pairs pass through
    global_head_dim: int = 0  # full-attention layers' head dim (0: head_dim)
    global_kv_heads: int = 0  # full-attention layers' K/V heads (0: num_kv_heads)
    query_pre_attn_scalar: float = 0.0  # attention scale = this ** -0.5 (0: head_dim's; Gemma-4: 1.0, scale 1)
    final_logit_softcapping: float = 0.0  # logits = cap * tanh(logits / cap); 0: none
    per_layer_input_size: int = 0  # P: Gemma-4's per-layer input embeddings (PLE), P per layer; 0: none
    per_layer_input_vocab: int = 0  # rows of the PLE table
    num_kv_shared_layers: int = 0  # the last n layers attend to an earlier layer's K/V (`kv_layers`)
    attention_k_eq_v: bool = False  # full-attention layers take values from the key projection (no v_proj)
    double_wide_mlp: bool = False  # the KV-shared layers' MLPs are 2 * intermediate_size wide

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise CheckpointError(f"layer_types has {len(self.layer_types)} entries for "
                                      f"num_hidden_layers={self.num_layers}")
            unknown = sorted(set(self.layer_types) - {FULL_ATTENTION, LINEAR_ATTENTION, SLIDING_ATTENTION})
            if unknown:
                raise CheckpointError(f"layer_types: unsupported layer type {unknown[0]!r}")
        if self.linear_layers:
            Hk, Hv = self.linear_num_key_heads, self.linear_num_value_heads
            if min(Hk, Hv, self.linear_key_head_dim, self.linear_value_head_dim, self.linear_conv_kernel_dim) < 1:
                raise CheckpointError("linear-attention layers need linear_num_key_heads, linear_num_value_heads, "
                                      "linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim >= 1")
            if Hv % Hk:
                raise CheckpointError(f"linear_num_value_heads={Hv} is not a multiple of linear_num_key_heads={Hk}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise CheckpointError(f"num_experts_per_tok={self.num_experts_per_tok} must be between 1 and "
                                      f"num_experts={self.num_experts}")
            if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
                raise CheckpointError("mixture-of-experts layers need moe_intermediate_size >= 1 and "
                                      "decoder_sparse_step >= 1")
        if self.sliding_layers and self.sliding_window < 1:
            raise CheckpointError("sliding_attention layers need sliding_window >= 1")
        if self.num_kv_shared_layers:
            first = self.num_layers - self.num_kv_shared_layers
            if not 0 < first <= self.num_layers or any(
                    self.layer_types[i] not in self.layer_types[:first] for i in range(first, self.num_layers)):
                raise CheckpointError(f"num_kv_shared_layers={self.num_kv_shared_layers}: every KV-shared layer needs "
                                      "an earlier layer of its type that keeps its own K/V")
        if self.rotary_dim % 2 or self.rotary_dim < 2:
            raise CheckpointError(f"partial_rotary_factor={self.partial_rotary_factor} gives a rotary dimension of "
                                  f"{self.rotary_dim} for head_dim={self.head_dim} (needs an even number >= 2)")

    @property
    def hybrid(self) -> bool:
        """True when some layers are Gated DeltaNet (linear attention) layers."""
        return bool(self.linear_layers)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        """Indices of the Gated DeltaNet layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the softmax-attention layers, full or sliding-window (every layer of a dense decoder)."""
        if not self.layer_types:
            return tuple(range(self.num_layers))
        return tuple(i for i, t in enumerate(self.layer_types) if t != LINEAR_ATTENTION)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the sliding-window attention layers (Gemma's local layers)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING_ATTENTION)

    @property
    def layer_head_dims(self) -> tuple[int, ...]:
        """Each layer's head dim (D; Gemma-4's full-attention layers may use `global_head_dim`)."""
        return tuple(self.global_head_dim if self.global_head_dim and i not in self.sliding_layers else self.head_dim
                     for i in range(self.num_layers))

    @property
    def layer_kv_heads(self) -> tuple[int, ...]:
        """Each layer's K/V heads (Gemma-4's full-attention layers may use `global_kv_heads`)."""
        return tuple(self.global_kv_heads if self.global_kv_heads and i not in self.sliding_layers
                     else self.num_kv_heads for i in range(self.num_layers))

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """For each layer, the layer whose K/V it attends: itself, or for each of Gemma-4's last
        `num_kv_shared_layers` layers the last earlier layer of its type that keeps its own K/V."""
        first = self.num_layers - self.num_kv_shared_layers
        own = tuple(range(first))
        return own + tuple(max(j for j in own if self.layer_types[j] == self.layer_types[i])
                           for i in range(first, self.num_layers))

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the sparse mixture-of-experts layers (transformers' rule: E > 0, (i + 1) a
        multiple of decoder_sparse_step, i not in mlp_only_layers); the others keep a dense MLP."""
        if not self.num_experts:
            return ()
        return tuple(i for i in range(self.num_layers)
                     if i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of a Gated DeltaNet layer's causal conv: [q | k | v]."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def num_params(self) -> int:
        if self.family in GEMMA_FAMILIES:
            return _gemma_num_params(self)
        C, I, D = self.hidden_size, self.intermediate_size, self.head_dim
        gate = self.num_heads if self.attn_output_gate else 0
        attn = C * D * (self.num_heads * 2 + self.num_kv_heads * 2 + gate) + (2 * D if self.qk_norm else 0)
        Hv, Vd = self.linear_num_value_heads, self.linear_value_dim
        linear = (C * (self.conv_dim + Vd + 2 * Hv) + self.conv_dim * self.linear_conv_kernel_dim + 2 * Hv
                  + self.linear_value_head_dim + Vd * C)
        mlp = 3 * C * I
        Is = self.shared_expert_intermediate_size
        sparse = self.num_experts * C * (1 + 3 * self.moe_intermediate_size) + (3 * C * Is + C if Is else 0)
        mixers = len(self.attention_layers) * attn + len(self.linear_layers) * linear
        embed = self.vocab_size * C * (1 if self.tie_word_embeddings else 2)
        mlps = (self.num_layers - len(self.moe_layers)) * mlp + len(self.moe_layers) * sparse
        return mixers + mlps + self.num_layers * 2 * C + embed + C

    def dense(self) -> "ModelConfig":
        """This config with the hybrid and mixture-of-experts fields cleared: the dense decoder of the
        same width (what a drafter built from a target's dimensions uses)."""
        return replace(self, layer_types=(), linear_num_key_heads=0, linear_num_value_heads=0,
                       linear_key_head_dim=0, linear_value_head_dim=0, linear_conv_kernel_dim=0,
                       partial_rotary_factor=1.0, attn_output_gate=False, zero_centered_norms=False,
                       num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, norm_topk_prob=False,
                       decoder_sparse_step=1, mlp_only_layers=(), shared_expert_intermediate_size=0,
                       sliding_window=0, sliding_rope_theta=0.0, global_rope_factor=1.0, global_rope_proportion=0.0,
                       global_head_dim=0, global_kv_heads=0, query_pre_attn_scalar=0.0, final_logit_softcapping=0.0,
                       per_layer_input_size=0, per_layer_input_vocab=0, num_kv_shared_layers=0,
                       attention_k_eq_v=False, double_wide_mlp=False,
                       family=self.family if self.family not in (*HYBRID_FAMILIES, *MOE_DEFAULTS, *GEMMA_FAMILIES)
                       else "qwen3")

    def with_changes(self, **changes) -> "ModelConfig":
        return replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, hf: dict, where: str = "config.json") -> "ModelConfig":
        archs = hf.get("architectures") or []
        family = None
        for arch in archs:
            family = SUPPORTED_ARCHITECTURES.get(arch)
            if family:
                break
        if family is None:
            family = MODEL_TYPES.get(hf.get("model_type", ""))
        if family is None:
            name = archs[0] if archs else hf.get("model_type", "unknown")
            raise CheckpointError(
                f"{where}: unsupported architecture {name!r} "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        top = hf
        if isinstance(hf.get("text_config"), dict):  # a multimodal wrapper: the decoder is its text model
            hf = {**hf["text_config"], **{k: top[k] for k in ("eos_token_id", "bos_token_id", "tie_word_embeddings")
                                          if k in top and k not in hf["text_config"]}}
        if family in GEMMA_FAMILIES:
            hf = {**GEMMA_DEFAULTS[family], **hf}
        try:
            hidden = int(hf["hidden_size"])
            heads = int(hf["num_attention_heads"])
            cfg = dict(
                family=family,
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(hf["intermediate_size"]),
                num_layers=int(hf["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                head_dim=int(hf.get("head_dim") or hidden // heads),
            )
        except KeyError as missing:
            raise CheckpointError(f"{where}: missing field {missing}") from None
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{where}: invalid field value ({err})") from None
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise CheckpointError(f"{where}: attention/MLP biases are not supported")
        if family not in GEMMA_FAMILIES and hf.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported")
        rope = hf.get("rope_parameters") or {}
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
        gemma = _gemma_fields(hf, family, cfg, where, "text_config" in top) if family in GEMMA_FAMILIES else {}
        if gemma:  # RoPE per layer type (`_gemma_fields`)
            theta, scaling = gemma.pop("rope_theta"), None
        rope_scaling = None
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind == "llama3":
                rope_scaling = RopeScaling(
                    factor=float(scaling["factor"]),
                    low_freq_factor=float(scaling["low_freq_factor"]),
                    high_freq_factor=float(scaling["high_freq_factor"]),
                    original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
                )
            elif kind not in (None, "default"):
                raise CheckpointError(f"{where}: rope scaling type {kind!r} is not supported")
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        hybrid = _hybrid_fields(hf, family, cfg["num_layers"], where) if family in HYBRID_FAMILIES else {}
        moe = _moe_fields(hf, family, where) if family in MOE_DEFAULTS else {}
        return cls(
            **cfg,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=family in ("qwen3", "qwen3_moe", *HYBRID_FAMILIES, *GEMMA_FAMILIES),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **hybrid,
            **moe,
            **gemma,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        file = Path(path) / "config.json"
        if not file.is_file():
            raise CheckpointError(f"{path}: no config.json (not a Hugging Face model directory)")
        try:
            hf = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{file}: not valid JSON ({err.msg if hasattr(err, 'msg') else err})") from None
        return cls.from_hf_dict(hf, where=str(file))

    def to_hf_dict(self) -> dict:
        """The config.json that transformers and SpecPilot both load."""
        arch = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
                "qwen3_5": "Qwen3_5ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gemma3": "Gemma3ForCausalLM",
                "gemma4": "Gemma4ForCausalLM"}[self.family]
        hf = {
            "architectures": [arch],
            "model_type": {"qwen3_5": "qwen3_5_text", "gemma3": "gemma3_text", "gemma4": "gemma4_text"}.get(self.family,
                                                                                                    self.family),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }
        if self.family == "llama":
            hf["mlp_bias"] = False
        if self.rope_scaling:
            hf["rope_scaling"] = {"rope_type": "llama3", **asdict(self.rope_scaling)}
        if self.family in HYBRID_FAMILIES:
            del hf["rope_theta"]
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta,
                                     "partial_rotary_factor": self.partial_rotary_factor}
            hf.update(layer_types=list(self.layer_types), linear_num_key_heads=self.linear_num_key_heads,
                      linear_num_value_heads=self.linear_num_value_heads,
                      linear_key_head_dim=self.linear_key_head_dim,
                      linear_value_head_dim=self.linear_value_head_dim,
                      linear_conv_kernel_dim=self.linear_conv_kernel_dim)
        if self.family in GEMMA_FAMILIES:
            _gemma_hf_fields(self, hf)
        if self.family in MOE_DEFAULTS:  # written even when 0: transformers' defaults are sparse
            hf.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                      moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                      decoder_sparse_step=self.decoder_sparse_step, mlp_only_layers=list(self.mlp_only_layers))
            if self.family == "qwen3_next":
                hf["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
        return hf


def _hybrid_fields(hf: dict, family: str, num_layers: int, where: str) -> dict:
    """The ModelConfig fields of a Qwen3-Next / Qwen3.5 config (HF field names and defaults)."""
    if family == "qwen3_5" and int(hf.get("num_experts") or 0) > 0:
        raise CheckpointError(f"{where}: Qwen3.5 mixture-of-experts layers (num_experts={hf['num_experts']}) are not "
                              "supported; Qwen3.5 targets load with dense MLPs (Qwen3-Next's MoE layers do load)")
    layer_types = hf.get("layer_types")
    if layer_types is None:
        interval = int(hf.get("full_attention_interval", 4))
        layer_types = [LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(num_layers)]
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
    if hf.get("attn_output_gate", True) is False:
        raise CheckpointError(f"{where}: attn_output_gate = false is not supported (the Qwen3-Next/3.5 layouts gate)")
    return dict(
        layer_types=tuple(layer_types),
        linear_num_key_heads=int(hf.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(hf.get("linear_num_value_heads", 32)),
        linear_key_head_dim=int(hf.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(hf.get("linear_value_head_dim", 128)),
        linear_conv_kernel_dim=int(hf.get("linear_conv_kernel_dim", 4)),
        partial_rotary_factor=float(factor),
        attn_output_gate=True,
        zero_centered_norms=True,
    )


def _moe_fields(hf: dict, family: str, where: str) -> dict:
    """The mixture-of-experts ModelConfig fields of a Qwen3-MoE / Qwen3-Next config (HF field names;
    transformers 5 writes Qwen3-MoE's expert count as `num_local_experts`; absent fields take the
    family's transformers defaults, `MOE_DEFAULTS`)."""
    d = MOE_DEFAULTS[family]
    experts = hf.get("num_experts", hf.get("num_local_experts", d["num_experts"]))
    try:
        fields = dict(
            num_experts=int(experts or 0),
            num_experts_per_tok=int(hf.get("num_experts_per_tok", d["num_experts_per_tok"])),
            moe_intermediate_size=int(hf.get("moe_intermediate_size", d["moe_intermediate_size"])),
            norm_topk_prob=bool(hf.get("norm_topk_prob", d["norm_topk_prob"])),
            decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
            mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=int(hf.get("shared_expert_intermediate_size",
                                                       d["shared_expert_intermediate_size"]) or 0),
        )
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: invalid mixture-of-experts field ({err})") from None
    if family == "qwen3_next" and fields["num_experts"] and not fields["shared_expert_intermediate_size"]:
        raise CheckpointError(f"{where}: shared_expert_intermediate_size = 0 is not supported (Qwen3-Next's sparse "
                              "layers always have a shared expert)")
    if not fields["num_experts"]:  # every MLP dense: keep the dense decoder's defaults
        return {}
    return fields


def _gemma_fields(hf: dict, family: str, cfg: dict, where: str, wrapped: bool) -> dict:
    """The Gemma fields of a Gemma-3 / Gemma-4 text config (transformers' field names; absent ones
    took `GEMMA_DEFAULTS`), with `rope_theta` (the full-attention layers'); refuses with one line
    what `models/gemma.py` does not build. As in transformers: Gemma-3's `attn_logit_softcapping`
    changes nothing (its attention never reads it), and a Gemma-3 multimodal wrapper (`wrapped`)
    does not soft-cap its logits."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise CheckpointError(f"{where}: hidden_activation {act!r} is not supported (Gemma's MLP: gelu_pytorch_tanh)")
    bidirectional = hf.get("use_bidirectional_attention")
    if bidirectional and bidirectional != "vision":  # "vision": bidirectional among image tokens only
        raise CheckpointError(f"{where}: use_bidirectional_attention={bidirectional!r} is not supported "
                              "(SpecPilot decodes causally)")
    if family == "gemma4" and (hf.get("enable_moe_block") or int(hf.get("num_experts") or 0)):
        raise CheckpointError(f"{where}: Gemma-4 mixture-of-experts blocks (enable_moe_block) are not supported")
    layers = cfg["num_layers"]
    layer_types = hf.get("layer_types")
    if layer_types is None:  # transformers' default: every `sliding_window_pattern`-th layer is global
        pattern = int(hf.get("sliding_window_pattern") or 6)
        layer_types = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(layers)]
    layer_types = list(layer_types)
    if family == "gemma4" and layer_types:
        layer_types[-1] = FULL_ATTENTION  # transformers forces Gemma-4's last layer global
    full, sliding = _gemma_rope(hf, family, where)
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear", "proportional") or sliding.get("rope_type", "default") != "default":
        raise CheckpointError(f"{where}: Gemma RoPE types {kind!r} (full attention) / "
                              f"{sliding.get('rope_type')!r} (sliding) are not supported")
    if kind == "linear" and float(full.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError(f"{where}: partial rotary with linear RoPE scaling is not supported")
    global_head_dim, global_kv_heads = _gemma_global_dims(hf, family, cfg, layer_types, where)
    vocab_per_layer = int(hf.get("vocab_size_per_layer_input") or cfg["vocab_size"]) if family == "gemma4" else 0
    return dict(
        layer_types=tuple(layer_types),
        sliding_window=int(hf.get("sliding_window") or 0),
        rope_theta=float(full.get("rope_theta", 1_000_000.0)),
        sliding_rope_theta=float(sliding.get("rope_theta", 10_000.0)),
        global_rope_factor=float(full.get("factor", 1.0)) if kind != "default" else 1.0,
        global_rope_proportion=float(full.get("partial_rotary_factor", 1.0)) if kind == "proportional" else 0.0,
        global_head_dim=global_head_dim,
        global_kv_heads=global_kv_heads,
        query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or 256) if family == "gemma3" else 1.0,
        final_logit_softcapping=0.0 if family == "gemma3" and wrapped
        else float(hf.get("final_logit_softcapping") or 0.0),
        per_layer_input_size=int(hf.get("hidden_size_per_layer_input") or 0) if family == "gemma4" else 0,
        per_layer_input_vocab=vocab_per_layer if family == "gemma4" and hf.get("hidden_size_per_layer_input") else 0,
        num_kv_shared_layers=int(hf.get("num_kv_shared_layers") or 0) if family == "gemma4" else 0,
        attention_k_eq_v=bool(hf.get("attention_k_eq_v")) if family == "gemma4" else False,
        double_wide_mlp=bool(hf.get("use_double_wide_mlp")) if family == "gemma4" else False,
        zero_centered_norms=family == "gemma3",
    )


def _gemma_rope(hf: dict, family: str, where: str) -> tuple[dict, dict]:
    """(full-attention, sliding) RoPE parameters: transformers 5's `rope_parameters` per layer type,
    or Gemma-3's older `rope_theta`, `rope_local_base_freq` and `rope_scaling` (the global layers')."""
    params = hf.get("rope_parameters")
    if params and not (FULL_ATTENTION in params or SLIDING_ATTENTION in params):
        raise CheckpointError(f"{where}: Gemma rope_parameters must be given per layer type")
    if family == "gemma4" and not params:
        params = {FULL_ATTENTION: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
                  SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10_000.0}}
    full, sliding = dict((params or {}).get(FULL_ATTENTION) or {}), dict((params or {}).get(SLIDING_ATTENTION) or {})
    if family == "gemma3":
        full.update(hf.get("rope_scaling") or {})
        full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        sliding.setdefault("rope_theta", hf.get("rope_local_base_freq", 10_000.0))
    return full, sliding


def _gemma_global_dims(hf: dict, family: str, cfg: dict, layer_types: list, where: str) -> tuple[int, int]:
    """(global_head_dim, global_kv_heads) of Gemma-4's full-attention layers, 0 where they keep the
    sliding layers' value: transformers 5.25 writes them as `per_layer_config` overrides (older
    configs: `global_head_dim`, `num_global_key_value_heads` with `attention_k_eq_v`)."""
    D, Hkv = cfg["head_dim"], cfg["num_kv_heads"]
    overrides = hf.get("per_layer_config")
    if family == "gemma3":
        if overrides:
            raise CheckpointError(f"{where}: per_layer_config is not supported for Gemma-3")
        return 0, 0
    if overrides is None:
        kv = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
        overrides = {i: {"head_dim": hf.get("global_head_dim", 512), **({"num_key_value_heads": kv} if kv else {})}
                     for i, t in enumerate(layer_types) if t == FULL_ATTENTION}
    dims = set()
    for key, o in overrides.items():
        try:
            i = int(key)
        except ValueError:
            raise CheckpointError(f"{where}: per_layer_config key {key!r} is not a layer index") from None
        if set(o) - {"head_dim", "num_key_value_heads"} or not 0 <= i < len(layer_types) or \
                layer_types[i] != FULL_ATTENTION:
            raise CheckpointError(f"{where}: per_layer_config overrides {sorted(o)} of layer {key} are not supported "
                                  "(only head_dim and num_key_value_heads of full-attention layers)")
    for i, t in enumerate(layer_types):
        if t == FULL_ATTENTION:
            o = overrides.get(i, overrides.get(str(i), {}))
            dims.add((int(o.get("head_dim") or D), int(o.get("num_key_value_heads") or Hkv)))
    if len(dims) > 1:
        raise CheckpointError(f"{where}: full-attention layers of different shapes {sorted(dims)} are not supported")
    gd, gkv = dims.pop() if dims else (D, Hkv)
    return (gd if gd != D else 0), (gkv if gkv != Hkv else 0)


def _gemma_num_params(c: ModelConfig) -> int:
    """Parameters of a Gemma-3 / Gemma-4 decoder (`models/gemma.py`)."""
    C, H, L, P = c.hidden_size, c.num_heads, c.num_layers, c.per_layer_input_size
    total = c.vocab_size * C * (1 if c.tie_word_embeddings else 2) + C
    if P:
        total += c.per_layer_input_vocab * L * P + C * L * P + P
    first_shared = L - c.num_kv_shared_layers
    for i, (D, Hkv) in enumerate(zip(c.layer_head_dims, c.layer_kv_heads)):
        shared = i >= first_shared
        kv = 0 if shared else (1 if c.attention_k_eq_v and i not in c.sliding_layers else 2) * Hkv * D * C + D
        I = c.intermediate_size * (2 if c.double_wide_mlp and shared else 1)
        total += 2 * H * D * C + D + kv + 3 * C * I + 4 * C + (2 * C * P + C if P else 0)
        total += 1 if c.family == "gemma4" else 0  # layer_scalar
    return total


def _gemma_hf_fields(c: ModelConfig, hf: dict) -> None:
    """`to_hf_dict`'s Gemma fields, in place (transformers' Gemma3TextConfig / Gemma4TextConfig names)."""
    del hf["hidden_act"], hf["rope_theta"]
    full = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.global_rope_proportion:
        full.update(rope_type="proportional", partial_rotary_factor=c.global_rope_proportion,
                    factor=c.global_rope_factor)
    elif c.global_rope_factor != 1.0:
        full.update(rope_type="linear", factor=c.global_rope_factor)
    hf.update(hidden_activation="gelu_pytorch_tanh", layer_types=list(c.layer_types), sliding_window=c.sliding_window,
              rope_parameters={FULL_ATTENTION: full,
                               SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": c.sliding_rope_theta}},
              final_logit_softcapping=c.final_logit_softcapping or None)
    if c.family == "gemma3":
        scalar = c.query_pre_attn_scalar  # an int in transformers' strict config class, when it is one
        hf.update(query_pre_attn_scalar=int(scalar) if scalar.is_integer() else scalar,
                  use_bidirectional_attention=False)
        return
    override = {**({"head_dim": c.global_head_dim} if c.global_head_dim else {}),
                **({"num_key_value_heads": c.global_kv_heads} if c.global_kv_heads else {})}
    hf.update(hidden_size_per_layer_input=c.per_layer_input_size,
              vocab_size_per_layer_input=c.per_layer_input_vocab or c.vocab_size,
              num_kv_shared_layers=c.num_kv_shared_layers, attention_k_eq_v=c.attention_k_eq_v,
              use_double_wide_mlp=c.double_wide_mlp, enable_moe_block=False,
              per_layer_config={str(i): override for i, t in enumerate(c.layer_types) if t == FULL_ATTENTION}
              if override else {})
