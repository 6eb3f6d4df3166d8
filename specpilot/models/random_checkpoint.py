"""Small random-weight checkpoints in Hugging Face format, for tests and demos.

`write_random_checkpoint` writes config.json, model.safetensors and a real trained byte-level BPE
tokenizer (shipped in specpilot/data/tokenizers) so the directory loads exactly like a downloaded
model, in SpecPilot and in transformers. `write_truncated_drafter` derives a drafter sharing the
target's first layers, embeddings and head, so drafts are accepted often but not always;
`write_noisy_drafter` perturbs a copy of the target, so drafts are accepted to full depth often.
`write_random_hybrid` writes a hybrid Gated DeltaNet target (either HF layout) whose token mixers
are scaled down, and `write_mixerless_drafter` the dense decoder that is that target without its
mixers (same embeddings, MLPs, norms and head): a drafter it accepts often but not always.

Weights are scaled so logits spread over several units: random models then rarely produce
near-ties, which keeps AR-vs-speculative equality tests meaningful in float32.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import torch

from specpilot.models.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from specpilot.models.loading import build_model, load_model, save_model
from specpilot.models.transformer import Transformer

TEST_TOKENIZER = "bpe4k"


def tokenizer_dir(name: str = TEST_TOKENIZER) -> Path:
    return Path(str(resources.files("specpilot") / "data" / "tokenizers" / name))


def tiny_config(family: str = "qwen3", **overrides) -> ModelConfig:
    """A few-layer model over the shipped 4k-token tokenizer."""
    base = dict(
        family=family,
        vocab_size=4096,
        hidden_size=64,
        intermediate_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        qk_norm=family == "qwen3",
        eos_token_ids=(0,),
    )
    base.update(overrides)
    return ModelConfig(**base)


def random_model(config: ModelConfig, seed: int = 0, router_scale: float = 1.0) -> Transformer:
    """The decoder of `config` (with its sparse layers' experts where it has some) with random
    weights: norms near 1, embeddings N(0, 1), every projection and expert stack N(0, 1/fan-in),
    the lm_head 3x and a MoE router `router_scale` x that (a sharper router: routes do not tie)."""
    g = torch.Generator().manual_seed(seed)
    if config.moe_layers:
        from specpilot.models.registry import family

        model = family(config).model(config)
    else:
        model = Transformer(config)
    C = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / C**0.5))
            elif name.endswith("mlp.gate.weight"):  # a sparse layer's router
                p.copy_(torch.randn(p.shape, generator=g) * router_scale / p.shape[-1] ** 0.5)
            else:
                fan_in = p.shape[-1]  # an expert stack [E, N, K] too
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
    return model


def copy_tokenizer(out: Path, name: str = TEST_TOKENIZER) -> None:
    src = tokenizer_dir(name)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / f, out / f)


def write_random_checkpoint(out: str | Path, config: ModelConfig | None = None, seed: int = 0,
                            dtype: torch.dtype = torch.float32) -> Path:
    """Write a random model directory; float32 by default so CPU tests are exact."""
    out = Path(out)
    config = config or tiny_config()
    save_model(random_model(config, seed), out, dtype=dtype)
    copy_tokenizer(out)
    return out


def truncated_layers(config: ModelConfig, num_layers: int) -> list[int]:
    """The target layers a `num_layers`-layer truncated drafter keeps: the first ones, except that a
    Gemma-4 drafter's last layer must be global (its loader makes the last layer global), so it is
    the target's first global layer from there on."""
    keep = list(range(num_layers))
    if config.family == "gemma4" and config.layer_types and config.layer_types[keep[-1]] != FULL_ATTENTION:
        keep[-1] = next(i for i in range(num_layers - 1, config.num_layers) if config.layer_types[i] == FULL_ATTENTION)
    if config.num_kv_shared_layers and keep[-1] >= config.num_layers - config.num_kv_shared_layers:
        raise ValueError(f"a truncated drafter of {num_layers} layers would keep KV-shared layers")
    return keep


def write_truncated_drafter(target_dir: str | Path, out: str | Path, num_layers: int = 1) -> Path:
    """A drafter made of the target's first `num_layers` blocks (`truncated_layers`) with its
    embeddings, norm and head, in the target's family (per-layer fields and Gemma-4's per-layer
    input embeddings cut to the kept layers)."""
    target = load_model(target_dir)
    c = target.config
    keep = truncated_layers(c, num_layers)
    config = c.with_changes(num_layers=num_layers, num_kv_shared_layers=0,
                            layer_types=tuple(c.layer_types[i] for i in keep) if c.layer_types else (),
                            mlp_only_layers=tuple(j for j, i in enumerate(keep) if i in c.mlp_only_layers))
    P = c.per_layer_input_size
    state = {}
    for name, value in target.state_dict().items():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            if int(i) in keep:
                state[f"layers.{keep.index(int(i))}.{rest}"] = value
        elif P and name in ("embed_tokens_per_layer.weight", "per_layer_model_projection.weight"):
            dim = 1 if name.startswith("embed") else 0  # [V, L*P] table; [L*P, C] projection
            state[name] = torch.cat([value.narrow(dim, i * P, P) for i in keep], dim=dim)
        else:
            state[name] = value
    drafter = build_model(config, state, device="cpu", dtype=target.dtype)
    out = Path(out)
    save_model(drafter, out, dtype=target.dtype)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(target_dir) / f, out / f)
    return out


def write_noisy_drafter(target_dir: str | Path, out: str | Path, noise: float = 0.2, seed: int = 1) -> Path:
    """A drafter that is the target plus Gaussian noise of `noise` x each block weight's std.

    It agrees with the target on most tokens but not all, so trees are often accepted to full
    depth and sometimes wrong there: what `--fault accept-unverified` needs to show up (a copy of
    the target never mis-drafts; a truncated drafter rarely reaches full depth).
    """
    target = load_model(target_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name.startswith("layers.") and p.ndim == 2:
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * (noise * p.float().std()).to(p.dtype))
    out = Path(out)
    save_model(target, out, dtype=target.dtype)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(target_dir) / f, out / f)
    return out


def tiny_hybrid_config(family: str = "qwen3_5", **overrides) -> ModelConfig:
    """A few-layer hybrid decoder (3 Gated DeltaNet : 1 gated attention) over the shipped tokenizer."""
    base = dict(
        family=family, vocab_size=4096, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048,
        tie_word_embeddings=False, qk_norm=True, eos_token_ids=(0,),
        layer_types=(LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,),
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, partial_rotary_factor=0.5, attn_output_gate=True, zero_centered_norms=True,
    )
    base.update(overrides)
    return ModelConfig(**base)


def random_hybrid(config: ModelConfig, seed: int = 0, mixer_scale: float = 0.5):
    """A random hybrid decoder; the token mixers' output projections scaled by `mixer_scale`."""
    from specpilot.models.hybrid import HybridTransformer

    g = torch.Generator().manual_seed(seed)
    model = HybridTransformer(config)
    C = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "linear_attn" not in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))  # zero-centred: scale 1 + w
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) - 2.0)
            elif name.endswith("conv_weight"):
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / C**0.5))
            else:
                scale = mixer_scale if name.endswith(("out_proj.weight", "o_proj.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * scale / p.shape[1] ** 0.5)
    return model


def write_random_hybrid(out: str | Path, config: ModelConfig | None = None, seed: int = 0,
                        dtype: torch.dtype = torch.float32, mixer_scale: float = 0.5) -> Path:
    """Write a random hybrid model directory (HF layout of `config.family`), float32 by default."""
    out = Path(out)
    config = config or tiny_hybrid_config()
    save_model(random_hybrid(config, seed, mixer_scale), out, dtype=dtype)
    copy_tokenizer(out)
    return out


def write_mixerless_drafter(hybrid_dir: str | Path, out: str | Path) -> Path:
    """The dense decoder computing `hybrid_dir`'s model with every token mixer removed: its
    embeddings, MLPs, head and norms (zero-centred weights w become 1 + w), attention projections
    zero (and the MLPs of sparse mixture-of-experts layers zero too). A draft model the hybrid
    accepts often, since its mixers only perturb the residual stream."""
    hybrid = load_model(hybrid_dir)
    c = hybrid.config
    config = c.dense().with_changes(family="qwen3")
    drafter = Transformer(config)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")) or name == "norm.weight":
                p.copy_(1.0 + hybrid.get_parameter(name).float())
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                p.fill_(1.0)
            elif "self_attn" in name or (".mlp." in name and int(name.split(".")[1]) in c.moe_layers):
                p.zero_()
            else:
                p.copy_(hybrid.get_parameter(name))
    out = Path(out)
    save_model(drafter, out, dtype=hybrid.dtype)
    copy_tokenizer(out)
    return out
