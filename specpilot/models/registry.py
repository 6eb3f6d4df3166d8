"""Which module class and tensor layout build each model family.

`config.SUPPORTED_ARCHITECTURES` maps a checkpoint's `architectures` name to a family; `FAMILIES`
maps the family to its decoder class and its Hugging Face layout (tensor names and shapes, and the
mapping onto our fused parameters). Every decoder class has the same forward (`Transformer.forward`
plus an optional `recurrence`) and allocates its own decode cache (`new_cache`), so the engine
never branches on the family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specpilot.models import gemma, hybrid, moe, transformer
from specpilot.models.config import ModelConfig


@dataclass(frozen=True)
class Family:
    model: type  # (config, max_positions) -> module
    hf_tensor_shapes: Callable  # (config) -> {HF name: shape}
    to_fused_state: Callable  # (config, {HF name: tensor}) -> {our name: tensor}
    to_hf_state: Callable  # (model) -> {HF name: tensor}


DENSE = Family(transformer.Transformer, transformer.hf_tensor_shapes, transformer.to_fused_state,
               transformer.to_hf_state)
HYBRID = Family(hybrid.HybridTransformer, hybrid.hf_tensor_shapes, hybrid.to_fused_state, hybrid.to_hf_state)
MOE = Family(moe.MoETransformer, moe.hf_tensor_shapes, moe.to_fused_state, moe.to_hf_state)
MOE_HYBRID = Family(moe.MoEHybridTransformer, moe.hf_tensor_shapes, moe.to_fused_state, moe.to_hf_state)
GEMMA = Family(gemma.GemmaTransformer, gemma.hf_tensor_shapes, gemma.to_fused_state, gemma.to_hf_state)
FAMILIES = {"qwen3": DENSE, "llama": DENSE, "qwen3_next": HYBRID, "qwen3_5": HYBRID, "qwen3_moe": MOE,
            "gemma3": GEMMA, "gemma4": GEMMA}


def family(config: ModelConfig) -> Family:
    """The config's family; a hybrid family with sparse layers (Qwen3-Next's MoE) is `MOE_HYBRID`."""
    if config.moe_layers and FAMILIES[config.family] is HYBRID:
        return MOE_HYBRID
    return FAMILIES[config.family]
