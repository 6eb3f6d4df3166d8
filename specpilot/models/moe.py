"""Mixture-of-experts MLPs: Qwen3-MoE (`Qwen3MoeForCausalLM`) and the sparse layers of Qwen3-Next.

A sparse layer replaces the dense SwiGLU MLP by a router and E SwiGLU experts (plus, in Qwen3-Next,
a shared expert). The rules, as transformers computes them:
- routing: p = softmax(x @ Wr.T) over the E experts in float32; each token takes its k experts of
  largest p (`num_experts_per_tok`), with weights p_top (renormalised to sum to 1 when
  `norm_topk_prob`), cast back to x's dtype;
- experts: out = sum over the token's k experts e of w_e * down_e(silu(gate_e x) * up_e x), summed in
  increasing expert order;
- shared expert (`shared_expert_intermediate_size` > 0): out += sigmoid(x . w_gate) * shared(x);
- which layers are sparse: `ModelConfig.moe_layers` (`decoder_sparse_step`, `mlp_only_layers`);
  the others keep the family's dense MLP.

Decoding computes only the experts the tokens route to: the T*k (token, expert) pairs are grouped
by expert and each routed expert runs one matmul over its tokens (`Experts.forward`). A verify of N
tree nodes therefore reads the *union* of its tokens' experts (`experts_read`), not k or E of them.
A decode step or a small verify (up to `kernels.moe_gemv.MAX_PAIRS` pairs, on CUDA or the Triton
interpreter) runs instead one GEMV per pair that reads its expert's weights through the ids
(`kernels.moe_gemv`): no sort, no gathers, and batch invariant.

Owns: the sparse MLP module, the two decoders that carry it (`MoETransformer`: the dense
`Transformer` with sparse MLPs in `moe_layers`; `MoEHybridTransformer`: Qwen3-Next's hybrid decoder
likewise), and the experts' HF layouts <-> our parameters (`hf_tensor_shapes`, `to_fused_state`,
`to_hf_state`, `checkpoint_shapes`). Reads both HF expert layouts: per expert
`mlp.experts.{e}.{gate,up,down}_proj.weight` (what transformers 5 `save_pretrained` writes, and older
checkpoints) and transformers' fused `mlp.experts.gate_up_proj` [E,2I,C] / `mlp.experts.down_proj`
[E,C,I]; writes the per-expert one. Our parameters keep the fused 3-D layout.
Does not own: attention, caches or the engine (the decoders keep `Transformer.forward`'s signature
and `new_cache`), the cost model's use of `experts_read`, or the GPU kernels (`kernels.moe_gemv`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from specpilot.kernels import moe_gemv
from specpilot.models import hybrid, ops, transformer
from specpilot.models.config import HYBRID_FAMILIES, ModelConfig
from specpilot.models.fusion import concat_rows
from specpilot.models.hybrid import HybridTransformer
from specpilot.models.transformer import MLP, Transformer


def experts_read(expert_ids: torch.Tensor) -> int:
    """Distinct experts that a forward over N tokens reads in one sparse layer: the size of the
    union of the tokens' top-k sets. expert_ids [N,k] (any shape) of router-chosen expert ids."""
    return int(torch.unique(expert_ids).numel())


class Experts(nn.Module):
    """E SwiGLU experts stored fused: gate_up_proj [E,2I,C] ([gate | up] rows), down_proj [E,C,I]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        E, C, I = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, C))
        self.down_proj = nn.Parameter(torch.empty(E, C, I))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, act=None,
                grouped: bool | None = None, masked: bool | None = None, kernel: bool | None = None
                ) -> torch.Tensor:
        """sum_j weights[t,j] * expert_{ids[t,j]}(x[t]) for each token t, running only the routed
        experts, each once over the tokens routed to it, a token's experts summed in increasing
        expert order. x [T,C]; weights [T,k] in x's dtype; ids [T,k] int64 -> [T,C].
        `kernel` (default: where `kernels.moe_gemv.applies`, T*k <= MAX_PAIRS pairs, and `act` is
        the SwiGLU) runs the pair-wise GEMV kernels on ids and weights as they come (no host read,
        batch invariant); else
        `grouped` (default: on CUDA in BF16, where torch has it) runs both projections as one grouped
        GEMM each over the expert-sorted pairs with device-side offsets: no host read, so CUDA
        graphs can capture it; else one matmul per routed expert, its loop bounds read on the host,
        or (`masked`, default: while a CUDA graph is being captured) every expert over every pair,
        each pair keeping its own expert's rows (no host read)."""
        T, k = ids.shape
        if kernel is None:
            swiglu = act is None or getattr(act, "__wrapped__", act) is ops.silu_mul  # plain or compiled
            kernel = swiglu and moe_gemv.applies(x, self.gate_up_proj, T * k)
        if kernel:
            return moe_gemv.moe_experts(x, weights, ids, self.gate_up_proj, self.down_proj)
        act = act or ops.silu_mul
        E = self.gate_up_proj.shape[0]
        ids, perm = ids.sort(dim=-1)  # each token's experts in increasing order
        weights = weights.gather(-1, perm)
        flat = ids.reshape(-1)  # [T*k] token-major (t*k + j)
        grouped_ids, order = flat.sort(stable=True)  # the pairs grouped by expert, in increasing expert order
        token = order // k  # [T*k] token of each grouped pair
        scale = weights.reshape(-1)[order, None]  # [T*k,1]
        if grouped is None:
            grouped = x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
        if grouped:  # y [T*k,C]: the pairs' outputs, expert-sorted
            experts = torch.arange(E, device=x.device, dtype=flat.dtype)
            offs = torch.searchsorted(grouped_ids, experts, right=True).to(torch.int32)  # [E] group ends (no sync)
            h = act(torch._grouped_mm(x[token], self.gate_up_proj.transpose(-2, -1), offs=offs))  # [T*k,I]
            y = torch._grouped_mm(h, self.down_proj.transpose(-2, -1), offs=offs) * scale
        elif masked if masked is not None else x.is_cuda and torch.cuda.is_current_stream_capturing():
            # a graph cannot read the loop bounds: every expert runs over every pair and keeps its
            # own pairs' rows (E times the arithmetic; only where the grouped GEMM is not available)
            y = torch.zeros(T * k, x.shape[-1], dtype=x.dtype, device=x.device)
            xs = x[token]  # [T*k,C]
            for e in range(E):
                ye = F.linear(act(F.linear(xs, self.gate_up_proj[e])), self.down_proj[e]) * scale  # [T*k,C]
                y = torch.where((grouped_ids == e)[:, None], ye, y)
        else:
            # the one host read of a sparse layer: how many tokens each expert got (the loop bounds)
            counts = torch.bincount(flat, minlength=E).tolist()
            y = torch.empty(T * k, x.shape[-1], dtype=x.dtype, device=x.device)
            start = 0
            for e, n in enumerate(counts):
                if n:
                    rows = token[start:start + n]  # [n]
                    h = act(F.linear(x[rows], self.gate_up_proj[e]))  # [n,I]
                    y[start:start + n] = F.linear(h, self.down_proj[e]) * scale[start:start + n]
                    start += n
        pairs = torch.empty_like(y)
        pairs[order] = y  # back to token-major [T*k,C], each token's experts in increasing order
        pairs = pairs.view(T, k, -1)
        out = torch.zeros_like(x)
        for j in range(k):  # the same order of sums on both paths
            out = out + pairs[:, j]
        return out


class SparseMoE(nn.Module):
    """Router (`gate`, [E,C]), routed experts, and an optional sigmoid-gated shared expert."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        C = config.hidden_size
        self.gate = nn.Linear(C, config.num_experts, bias=False)
        self.experts = Experts(config)
        if config.shared_expert_intermediate_size:
            self.shared_expert = MLP(config.with_changes(intermediate_size=config.shared_expert_intermediate_size))
            self.shared_expert_gate = nn.Linear(C, 1, bias=False)
        else:
            self.shared_expert = self.shared_expert_gate = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights [T,k] (x's dtype) and expert ids [T,k] int64 of tokens x [T,C]."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [T,E]
        weights, ids = torch.topk(probs, self.config.num_experts_per_tok, dim=-1)
        if self.config.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor, act=None) -> torch.Tensor:
        """x [...,C] -> [...,C] (as the dense `MLP`: any leading shape, `act` the fused SwiGLU)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T,C]
        weights, ids = self.route(x)
        out = self.experts(x, weights, ids, act)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x, act=act)
        return out.reshape(shape)


def _use_experts(model: nn.Module) -> None:
    for i in model.config.moe_layers:
        model.layers[i].mlp = SparseMoE(model.config)


class MoETransformer(Transformer):
    """Qwen3-MoE: the dense decoder with a `SparseMoE` MLP in each of `config.moe_layers`."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__(config, max_positions)
        _use_experts(self)


class MoEHybridTransformer(HybridTransformer):
    """Qwen3-Next with sparse layers: the hybrid decoder with a `SparseMoE` MLP in each of
    `config.moe_layers`."""

    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__(config, max_positions)
        _use_experts(self)


# ---- Hugging Face layouts ------------------------------------------------------------------

def _base(config: ModelConfig):
    """The layout module of everything but the sparse MLPs."""
    return hybrid if config.family in HYBRID_FAMILIES else transformer


def hf_tensor_shapes(config: ModelConfig, prefix: str = "model.", fused_layers: tuple[int, ...] = ()
                     ) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of this config must hold, with its shape: the per-expert layout,
    or transformers' fused one in the sparse layers listed in `fused_layers`."""
    c = config
    E, C, I, Is = c.num_experts, c.hidden_size, c.moe_intermediate_size, c.shared_expert_intermediate_size
    shapes = _base(c).hf_tensor_shapes(c, prefix)
    for i in c.moe_layers:
        p = f"{prefix}layers.{i}.mlp."
        shapes[p + "gate.weight"] = (E, C)
        if i in fused_layers:
            shapes.update({p + "experts.gate_up_proj": (E, 2 * I, C), p + "experts.down_proj": (E, C, I)})
        else:
            for e in range(E):
                x = f"{p}experts.{e}."
                shapes.update({x + "gate_proj.weight": (I, C), x + "up_proj.weight": (I, C),
                               x + "down_proj.weight": (C, I)})
        if Is:
            shapes.update({p + "shared_expert.gate_proj.weight": (Is, C), p + "shared_expert.up_proj.weight": (Is, C),
                           p + "shared_expert.down_proj.weight": (C, Is), p + "shared_expert_gate.weight": (1, C)})
    return shapes


def _prefix(config: ModelConfig, hf_names) -> str:
    return hybrid.hf_prefix(hf_names) if config.family in HYBRID_FAMILIES else "model."


def _fused_layers(config: ModelConfig, prefix: str, hf_names) -> tuple[int, ...]:
    """The sparse layers whose experts a checkpoint stores in transformers' fused layout."""
    return tuple(i for i in config.moe_layers if f"{prefix}layers.{i}.mlp.experts.gate_up_proj" in hf_names)


def checkpoint_shapes(config: ModelConfig, tensors: dict) -> dict[str, tuple[int, ...]]:
    """`hf_tensor_shapes` of the layout (prefix, per-expert or fused experts) that `tensors` use."""
    prefix = _prefix(config, tensors)
    return hf_tensor_shapes(config, prefix, _fused_layers(config, prefix, tensors))


def to_fused_state(config: ModelConfig, hf: dict) -> dict:
    """HF names (either expert layout) -> our parameter names; experts are stacked into [E,2I,C] and
    [E,C,I] (plain tensors: `w12 convert` leaves expert weights alone)."""
    c = config
    P = _prefix(c, hf)
    fused = _fused_layers(c, P, hf)
    out = _base(c).to_fused_state(c, hf)
    for i in c.moe_layers:
        p, q = f"{P}layers.{i}.mlp.", f"layers.{i}.mlp."
        out[q + "gate.weight"] = hf[p + "gate.weight"]
        if i in fused:
            out[q + "experts.gate_up_proj"] = hf[p + "experts.gate_up_proj"]
            out[q + "experts.down_proj"] = hf[p + "experts.down_proj"]
        else:
            x = [f"{p}experts.{e}." for e in range(c.num_experts)]
            out[q + "experts.gate_up_proj"] = torch.stack(
                [torch.cat([hf[n + "gate_proj.weight"], hf[n + "up_proj.weight"]]) for n in x])
            out[q + "experts.down_proj"] = torch.stack([hf[n + "down_proj.weight"] for n in x])
        if c.shared_expert_intermediate_size:
            s = p + "shared_expert."
            out[q + "shared_expert.gate_up_proj.weight"] = concat_rows([hf[s + "gate_proj.weight"],
                                                                        hf[s + "up_proj.weight"]])
            out[q + "shared_expert.down_proj.weight"] = hf[s + "down_proj.weight"]
            out[q + "shared_expert_gate.weight"] = hf[p + "shared_expert_gate.weight"]
    return out


def to_hf_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Our parameters -> HF names in the per-expert layout (as transformers saves), contiguous CPU tensors."""
    c = model.config
    I, Is = c.moe_intermediate_size, c.shared_expert_intermediate_size
    hf = _base(c).to_hf_state(model)
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    for i in c.moe_layers:
        p, q = f"model.layers.{i}.mlp.", f"layers.{i}.mlp."
        hf[p + "gate.weight"] = sd[q + "gate.weight"]
        for e, (gate_up, down) in enumerate(zip(sd[q + "experts.gate_up_proj"], sd[q + "experts.down_proj"])):
            x = f"{p}experts.{e}."
            hf[x + "gate_proj.weight"], hf[x + "up_proj.weight"] = gate_up.split([I, I])
            hf[x + "down_proj.weight"] = down
        if Is:
            s = p + "shared_expert."
            hf[s + "gate_proj.weight"], hf[s + "up_proj.weight"] = sd[q + "shared_expert.gate_up_proj.weight"].split(
                [Is, Is])
            hf[s + "down_proj.weight"] = sd[q + "shared_expert.down_proj.weight"]
            hf[p + "shared_expert_gate.weight"] = sd[q + "shared_expert_gate.weight"]
    return {k: v.contiguous() for k, v in hf.items()}
