"""Model hyper-parameters of the decoders SpecPilot runs, read from a Hugging Face `config.json`.

Owns: the mapping from HF config fields to one frozen `ModelConfig` for every supported family
(`SUPPORTED_ARCHITECTURES`: dense Llama and Qwen3, transformers 4.x and 5.x spellings of RoPE
settings; the hybrid Gated DeltaNet families Qwen3-Next and Qwen3.5, whose `layer_types` interleave
linear-attention and full-attention layers), and refusing what we do not support with one clear
line. Does not own weights or tokenizers (see `loading.py`, `tokenizer.py`) or which module class
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
}
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5")  # Gated DeltaNet + gated full attention (`models/hybrid.py`)
MODEL_TYPES = {"qwen3": "qwen3", "llama": "llama", "qwen3_next": "qwen3_next", "qwen3_5_text": "qwen3_5",
               "qwen3_5": "qwen3_5"}

# `layer_types` entries of the hybrid families
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


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
            unknown = sorted(set(self.layer_types) - {FULL_ATTENTION, LINEAR_ATTENTION})
            if unknown:
                raise CheckpointError(f"layer_types: unsupported layer type {unknown[0]!r}")
        if self.linear_layers:
            Hk, Hv = self.linear_num_key_heads, self.linear_num_value_heads
            if min(Hk, Hv, self.linear_key_head_dim, self.linear_value_head_dim, self.linear_conv_kernel_dim) < 1:
                raise CheckpointError("linear-attention layers need linear_num_key_heads, linear_num_value_heads, "
                                      "linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim >= 1")
            if Hv % Hk:
                raise CheckpointError(f"linear_num_value_heads={Hv} is not a multiple of linear_num_key_heads={Hk}")
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
        """Indices of the full-attention layers (every layer of a dense decoder)."""
        if not self.layer_types:
            return tuple(range(self.num_layers))
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

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
        C, I, D = self.hidden_size, self.intermediate_size, self.head_dim
        gate = self.num_heads if self.attn_output_gate else 0
        attn = C * D * (self.num_heads * 2 + self.num_kv_heads * 2 + gate) + (2 * D if self.qk_norm else 0)
        Hv, Vd = self.linear_num_value_heads, self.linear_value_dim
        linear = (C * (self.conv_dim + Vd + 2 * Hv) + self.conv_dim * self.linear_conv_kernel_dim + 2 * Hv
                  + self.linear_value_head_dim + Vd * C)
        mlp = 3 * C * I
        mixers = len(self.attention_layers) * attn + len(self.linear_layers) * linear
        embed = self.vocab_size * C * (1 if self.tie_word_embeddings else 2)
        return mixers + self.num_layers * (mlp + 2 * C) + embed + C

    def dense(self) -> "ModelConfig":
        """This config with the hybrid fields cleared: the dense decoder of the same width (what a
        drafter built from a target's dimensions uses)."""
        return replace(self, layer_types=(), linear_num_key_heads=0, linear_num_value_heads=0,
                       linear_key_head_dim=0, linear_value_head_dim=0, linear_conv_kernel_dim=0,
                       partial_rotary_factor=1.0, attn_output_gate=False, zero_centered_norms=False,
                       family=self.family if self.family not in HYBRID_FAMILIES else "qwen3")

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
        if hf.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported")
        rope = hf.get("rope_parameters") or {}
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
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
        return cls(
            **cfg,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=family in ("qwen3", *HYBRID_FAMILIES),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **hybrid,
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
                "qwen3_5": "Qwen3_5ForCausalLM"}[self.family]
        hf = {
            "architectures": [arch],
            "model_type": {"qwen3_5": "qwen3_5_text"}.get(self.family, self.family),
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
            if self.family == "qwen3_next":
                hf.update(num_experts=0, mlp_only_layers=[], decoder_sparse_step=1)
        return hf


def _hybrid_fields(hf: dict, family: str, num_layers: int, where: str) -> dict:
    """The ModelConfig fields of a Qwen3-Next / Qwen3.5 config (HF field names and defaults)."""
    if int(hf.get("num_experts") or 0) > 0:
        raise CheckpointError(f"{where}: mixture-of-experts layers (num_experts={hf['num_experts']}) are not "
                              "supported yet; hybrid targets load with dense MLPs (num_experts = 0)")
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
