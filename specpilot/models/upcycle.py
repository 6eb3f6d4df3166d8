"""A dense decoder upcycled into a mixture of identical experts (a deployment's `target_experts`).

Every MLP of a Qwen3 decoder (or of a Qwen3.5 / Qwen3-Next hybrid decoder) becomes a sparse layer
(`models.moe.SparseMoE`) of E experts that are copies of that MLP, k of them routed per token by a
router of seeded random weights (normal, std C^-1/2: logits of order one, so a token's experts
follow its hidden state), with the k routing weights renormalised to sum to 1
(`norm_topk_prob`). The rules:

- The function is the dense model's up to rounding: a token's output is sum_j w_j * MLP(x) with
  sum_j w_j = 1 in float32, cast to the model dtype. The upcycled model is its own reference
  (AR, every system and the guard decode with it), and drafters built for the dense model keep
  their acceptance.
- Routing, the union of experts a verify of N tokens reads (`moe.experts_read`) and the bytes are
  an MoE's: a decode step reads k of each layer's E expert copies, a tree up to all E.
- The same (model, E, k, seed) gives the same router on every machine (a CPU generator).

Owns: `upcycle`, `upcycled_config`. Does not own the sparse layer or its kernels (`moe.py`, `kernels.moe_gemv`).
"""

from __future__ import annotations

import torch

from specpilot.errors import CheckpointError
from specpilot.models.config import HYBRID_FAMILIES

SEED = 0  # the router's generator seed


def upcycled_config(c, experts: int, k: int):
    """The sparse config of dense config `c` upcycled into `experts` copies of each MLP, k routed."""
    if c.moe_layers or c.family not in ("qwen3", *HYBRID_FAMILIES):
        raise CheckpointError(f"target_experts upcycles a dense Qwen3 or Qwen3.5/Qwen3-Next decoder "
                              f"(this target: family {c.family!r}{', already sparse' if c.moe_layers else ''})")
    if not 1 <= k <= experts:
        raise CheckpointError(f"target_experts: k = {k} must be between 1 and E = {experts}")
    return c.with_changes(family="qwen3_moe" if c.family == "qwen3" else c.family, num_experts=experts,
                          num_experts_per_tok=k, moe_intermediate_size=c.intermediate_size, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=(), shared_expert_intermediate_size=0)


def upcycle(model, experts: int, k: int, seed: int = SEED):
    """`model` (dense, its weights plain tensors) with each MLP replaced by E identical experts, k
    routed per token (see the module docstring); on the model's device, in its dtype."""
    from specpilot.models.loading import build_model

    c = model.config
    config = upcycled_config(c, experts, k)
    for i in config.moe_layers:
        mlp = model.layers[i].mlp
        if not all(type(getattr(mlp, n, None)) is torch.nn.Linear for n in ("gate_up_proj", "down_proj")):
            raise CheckpointError("target_experts needs the dense MLPs as plain BF16/float weights (not W12 or FP8)")
    state = dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    C = c.hidden_size
    for i in config.moe_layers:
        p = f"layers.{i}.mlp."
        gate_up, down = state.pop(p + "gate_up_proj.weight"), state.pop(p + "down_proj.weight")  # [2I,C], [C,I]
        # contiguous stacks, each expert its own memory (an expanded view would share one copy)
        state[p + "experts.gate_up_proj"] = gate_up.repeat(experts, 1, 1)  # [E,2I,C]
        state[p + "experts.down_proj"] = down.repeat(experts, 1, 1)  # [E,C,I]
        router = torch.randn(experts, C, generator=g) * C ** -0.5  # [E,C]
        state[p + "gate.weight"] = router.to(device=gate_up.device, dtype=gate_up.dtype)
    dev, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    return build_model(config, state, dev, dtype, max_positions=model.rope_cos.shape[0])
