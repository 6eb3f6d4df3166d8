"""Model hyper-parameters of the dense decoders SpecPilot runs, read from a Hugging Face
`config.json`.

Owns: the mapping from HF config fields (Llama and Qwen3 families, transformers 4.x and 5.x
spellings of RoPE settings) to one frozen `ModelConfig`, and refusing what we do not support
with one clear line. Does not own weights or tokenizers (see `loading.py`, `tokenizer.py`).
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
}


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

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )

    @property
    def num_params(self) -> int:
        C, I, D = self.hidden_size, self.intermediate_size, self.head_dim
        attn = C * D * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * C * I
        norms = 2 * C + (2 * D if self.qk_norm else 0)
        embed = self.vocab_size * C * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + norms) + embed + C

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
            family = {"qwen3": "qwen3", "llama": "llama"}.get(hf.get("model_type", ""))
        if family is None:
            name = archs[0] if archs else hf.get("model_type", "unknown")
            raise CheckpointError(
                f"{where}: unsupported architecture {name!r} "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
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
        return cls(
            **cfg,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
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
        arch = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.family]
        hf = {
            "architectures": [arch],
            "model_type": self.family,
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
        return hf
