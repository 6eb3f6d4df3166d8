"""Exact width expansion: a checkpoint `factor` times wider that computes the same function.

Owns: the expanded `ModelConfig`, the per-tensor expansion rule, building an expanded
`Transformer` directly on the target device from a small checkpoint (`load_expanded`), and the
size of a model in parameters and bytes (`ModelSize`).

Does not own: reading or writing checkpoints (`loading.py`); which deployments expand what
(`specpilot.config.Deployment.target_expand` / `drafter_expand`). Nothing expanded is stored:
expansion happens at load time.

Layout. Every widened axis is *copy-major*: an axis of N entries becomes f·N entries holding f
copies of the original, copy j at [j·N, (j+1)·N). This applies to hidden features (C -> f·C),
MLP neurons (I -> f·I), query heads (H -> f·H) and kv heads (Hkv -> f·Hkv), and in a hybrid
decoder's Gated DeltaNet layers to key and value heads (Hk, Hv -> f·Hk, f·Hv: each part of the
conv channels [q | k | v], of z, b, a, and the per-head A_log, dt_bias); head dims are
unchanged. Copy-major keeps the GQA mapping: query head h' = j·H + h uses kv head
h' // G = j·Hkv + h // G (G = H / Hkv, unchanged), which is copy j of the kv head that head h
used in the original.

Why the function is unchanged (exactly, in real arithmetic):
- a weight *producing* a widened axis has its rows copied, so it produces f copies of its output;
- a weight *consuming* a widened axis gets each copy scaled by 1/f: sum_j (w/f)·x = w·x;
- RMSNorm over f copies of C features has the same mean square, so it normalises identically,
  and its weight is copied like the features;
- duplicated attention heads compute identical outputs, and 1/sqrt(D) is unchanged; likewise
  duplicated GDN heads (value head j·Hv + h reads key head j·Hk + h // r, copy j of its own) keep
  identical recurrent states, and the depthwise conv is copied per channel, unscaled;
- the embedding is copied but not scaled (it produces the residual stream), while lm_head
  consumes the residual stream and is scaled, so tied embeddings become untied.
Scaling by 1/f is exact in binary floating point for a power-of-two f (barring underflow to
subnormals, far below any trained weight), so the expanded weights are bit-exact copies of
w/f. What differs in floating point is only summation order and length (f·C terms instead of C),
i.e. ordinary rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.errors import CheckpointError
from specpilot.models.config import GEMMA_FAMILIES, ModelConfig
from specpilot.models.loading import build_model, check_tensors, load_model, read_hf_tensors, to_fused_state
from specpilot.models.transformer import Transformer


def check_factor(factor: int) -> None:
    if not isinstance(factor, int) or factor < 1 or factor & (factor - 1):
        raise CheckpointError(f"expansion factor must be a power of two >= 1 (got {factor!r})")


def expanded_config(config: ModelConfig, factor: int) -> ModelConfig:
    """The config of `config` widened `factor` times (D unchanged, embeddings untied)."""
    check_factor(factor)
    if factor == 1:
        return config
    if config.moe_layers:
        raise CheckpointError(f"width expansion of mixture-of-experts layers ({config.family}, "
                              f"num_experts={config.num_experts}) is not supported yet")
    if config.family in GEMMA_FAMILIES:  # sqrt(C) embedding scale, per-layer inputs: another rule
        raise CheckpointError(f"width expansion of {config.family} decoders is not supported yet")
    return config.with_changes(
        hidden_size=config.hidden_size * factor,
        intermediate_size=config.intermediate_size * factor,
        num_heads=config.num_heads * factor,
        num_kv_heads=config.num_kv_heads * factor,
        tie_word_embeddings=False,
        linear_num_key_heads=config.linear_num_key_heads * factor,
        linear_num_value_heads=config.linear_num_value_heads * factor,
    )


def tile(parts: list[torch.Tensor], rows: int, cols: int, factor: int, scale: bool) -> torch.Tensor:
    """Copy-major tiling of row-stacked parts p_i [R_i, K]: [sum_i rows·R_i, cols·K], part i's
    `rows` x `cols` copies (each p_i / factor when `scale`) in its own row range.

    Allocates only the result: every copy is written through a broadcast view, so a fused weight
    (q|k|v, gate|up) never exists twice.
    """
    K = parts[0].shape[1]
    out = torch.empty(rows * sum(p.shape[0] for p in parts), cols * K, dtype=parts[0].dtype, device=parts[0].device)
    r0 = 0
    for p in parts:
        R = p.shape[0]
        src = p / factor if scale else p  # exact: factor is a power of two
        out[r0 : r0 + rows * R].view(rows, R, cols, K).copy_(src[None, :, None, :])
        r0 += rows * R
    return out


def expand_tensor(name: str, w: torch.Tensor, config: ModelConfig, factor: int) -> torch.Tensor:
    """Expand one tensor of our fused layout (see `Transformer`) by `factor`."""
    f = factor
    c = config
    if name == "embed_tokens.weight":  # [V, C] produces the residual stream: copied, not scaled
        return tile([w], 1, f, f, scale=False)
    if name == "lm_head.weight":  # [V, C] consumes it
        return tile([w], 1, f, f, scale=True)
    if name.endswith(("q_norm.weight", "k_norm.weight", "linear_attn.norm.weight")):  # [D], [Dv]: per head
        return w.clone()
    if name.endswith("norm.weight"):  # [C]
        return w.repeat(f)
    if name.endswith("self_attn.qkv_proj.weight"):  # [(H + 2 Hkv) D, C], or [(2H + 2 Hkv) D, C] with a gate
        D = c.head_dim
        parts = [c.num_heads * D, c.num_kv_heads * D, c.num_kv_heads * D] + ([c.num_heads * D] if c.attn_output_gate
                                                                            else [])
        return tile(list(w.split(parts)), f, f, f, scale=True)
    if name.endswith("linear_attn.in_proj.weight"):  # [q | k | v | z | b | a] rows, every part per head
        Hv = c.linear_num_value_heads
        return tile(list(w.split(_linear_parts(c) + [c.linear_value_dim, Hv, Hv])), f, f, f, scale=True)
    if name.endswith("linear_attn.conv_weight"):  # [Cc, K] depthwise: channels copied per part
        return tile(list(w.split(_linear_parts(c))), f, 1, f, scale=False)
    if name.endswith(("linear_attn.A_log", "linear_attn.dt_bias")):  # [Hv]
        return w.repeat(f)
    if name.endswith("linear_attn.out_proj.weight"):  # [C, Hv Dv]
        return tile([w], f, f, f, scale=True)
    if name.endswith("mlp.gate_up_proj.weight"):  # [2 I, C]
        return tile(list(w.split([c.intermediate_size, c.intermediate_size])), f, f, f, scale=True)
    if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):  # [C, H D], [C, I]
        return tile([w], f, f, f, scale=True)
    raise CheckpointError(f"cannot expand tensor {name!r}: not part of a decoder SpecPilot expands")


def _linear_parts(c: ModelConfig) -> list[int]:
    """Row counts of a Gated DeltaNet layer's conv channels: [q | k | v]."""
    return [c.linear_key_dim, c.linear_key_dim, c.linear_value_dim]


def expand_state(
    config: ModelConfig, state: dict[str, torch.Tensor], factor: int
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(expanded config, expanded state) from a state in our fused names, on the state's device.

    Tensors are expanded one at a time, so peak memory is the result plus one tensor.
    """
    check_factor(factor)
    if factor == 1:
        return config, dict(state)
    out = {}
    for name, w in state.items():
        if not isinstance(w, torch.Tensor):
            raise CheckpointError(f"cannot expand {name!r}: only plain (non-W12) weights can be expanded")
        if name == "lm_head.weight" and config.tie_word_embeddings:
            w = state["embed_tokens.weight"]  # tied: lm_head is the embedding, then untied by scaling
        out[name] = expand_tensor(name, w, config, factor)
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = expand_tensor("lm_head.weight", state["embed_tokens.weight"], config, factor)
    return expanded_config(config, factor), out


def expand(model: Transformer, factor: int) -> Transformer:
    """`model` widened `factor` times, on its device and in its dtype (factor 1: `model` itself)."""
    check_factor(factor)
    if factor == 1:
        return model
    state = {k: v.detach() for k, v in model.state_dict().items()}
    config, state = expand_state(model.config, state, factor)
    return build_model(config, state, model.device, model.dtype, max_positions=model.rope_cos.shape[0])


def load_expanded(
    path: str | Path,
    factor: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_positions: int | None = None,
) -> Transformer:
    """Load an HF model directory widened `factor` times, building the wide tensors on `device`.

    The small checkpoint is read on the CPU, each tensor is moved to `device` in `dtype` and
    expanded there, so a multi-GB expanded model never exists on the host.
    """
    check_factor(factor)
    if factor == 1:
        return load_model(path, device, dtype, max_positions)
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: model directory does not exist")
    config = ModelConfig.from_dir(path)
    tensors = read_hf_tensors(path)
    check_tensors(config, tensors, str(path))
    small = to_fused_state(config, tensors)
    if config.tie_word_embeddings:
        small.pop("lm_head.weight")
    wide_config = expanded_config(config, factor)
    wide = {}
    for name in list(small):
        w = small.pop(name).to(device=device, dtype=dtype)
        wide[name] = expand_tensor(name, w, config, factor)
        if name == "embed_tokens.weight" and config.tie_word_embeddings:
            wide["lm_head.weight"] = expand_tensor("lm_head.weight", w, config, factor)
        del w
    return build_model(wide_config, wide, device, dtype, max_positions)


@dataclass(frozen=True)
class ModelSize:
    """Parameter count and bytes of a model, and the bytes one decode step must read."""

    params: int
    gathered_params: int  # an untied input embedding table: a decode step reads only B rows

    @classmethod
    def of(cls, config: ModelConfig) -> ModelSize:
        table = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
        return cls(config.num_params, table)

    def bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        return self.params * dtype.itemsize

    def decode_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Weight bytes streamed per decode step: everything but an untied input embedding table
        (a tied table is lm_head too, so it is streamed and counted)."""
        return (self.params - self.gathered_params) * dtype.itemsize

    def summary(self, dtype: torch.dtype = torch.bfloat16) -> dict:
        return {
            "params": self.params,
            "params_millions": round(self.params / 1e6, 3),
            "bytes": self.bytes(dtype),
            "megabytes": round(self.bytes(dtype) / 1e6, 2),
            "decode_bytes": self.decode_bytes(dtype),
            "dtype": str(dtype).removeprefix("torch."),
        }
