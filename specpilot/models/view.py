"""An 8-bit view of a decoder: the same model with its projections in FP8 e4m3, for proposals.

`fp8_view(model)` returns a decoder of the same class and config whose projections (`nn.Linear`,
or `W12Linear` decoded to its exact BF16 first; the lm_head included) are `FP8Linear` modules
quantized per output channel (`fp8_checkpoint.
quantize_per_channel`: scale = row amax / 448), and whose every other tensor (embeddings, norms,
RoPE tables, a MoE layer's expert tensors) *is* the model's: shared, not copied. Its memory is
the e4m3 codes plus one float32 scale per row (`view_bytes`). A view only proposes tokens (two-
level verification, `engine.drafters.two_level`): the exact target verifies every one, so its
rounding never reaches the output.

Which decoders: any decoder without recurrent layers (a view drafts through its own KV cache,
re-reading committed tokens each round, which a recurrent state cannot do: it would advance
twice), and not an FP8 target (its view would read as many bytes as the target).

Owns: building the view and counting its bytes. Does not own the FP8 kernels (`FP8Linear`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from specpilot.errors import ConfigError
from specpilot.models.fp8_checkpoint import quantize_per_channel
from specpilot.models.fp8_linear import FP8Linear, FP8Weight
from specpilot.models.w12_linear import W12Linear
from specpilot.w12.codec import decode


def fp8_view(model: nn.Module) -> nn.Module:
    """The 8-bit view of `model` (module docstring); `model` is left unchanged."""
    config = model.config
    if config.linear_layers:
        raise ConfigError("an 8-bit view needs a target without recurrent layers (its draft cache re-reads "
                          f"committed tokens each round); this {config.family} target has Gated DeltaNet layers")
    if any(isinstance(m, FP8Linear) for m in model.modules()):
        raise ConfigError("the target is FP8 already: an 8-bit view of it would read as many bytes as it does")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, W12Linear))}
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    view = copy.deepcopy(model, memo=dict(shared))  # the module tree copied, every tensor shared
    for name, m in linears.items():
        weight = decode(m.weight_w12) if isinstance(m, W12Linear) else m.weight.detach()  # [N,K]
        codes, scale = quantize_per_channel(weight)
        parent_name, _, attr = name.rpartition(".")
        parent = view.get_submodule(parent_name) if parent_name else view
        setattr(parent, attr, FP8Linear(FP8Weight(codes, scale, block_k=m.in_features)))
    return view


def view_bytes(view: nn.Module) -> int:
    """Bytes the view holds beyond its model's: its FP8 codes and scales."""
    return sum(t.numel() * t.element_size() for m in view.modules() if isinstance(m, FP8Linear)
               for t in (m.weight_e4m3, m.weight_scale))


def agreement(view: nn.Module, model: nn.Module, tokens: torch.Tensor) -> float:
    """Share of positions of tokens [B,T] where the view's greedy next token equals the model's
    (teacher forcing through both, `forward_causal`): how often a view's chain keeps going."""
    with torch.no_grad():
        a = view.forward_causal(tokens).argmax(-1)
        b = model.forward_causal(tokens).argmax(-1)
    return float((a == b).float().mean())
