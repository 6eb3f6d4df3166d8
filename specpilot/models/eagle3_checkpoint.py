"""Read and write EAGLE-3 head directories in the public layout (SafeAILab EAGLE, SpecForge; what
SGLang and vLLM load).

`config.json` is a Llama config of the head's one layer plus `architectures:
["LlamaForCausalLMEagle3"]`, `num_hidden_layers: 1`, `draft_vocab_size` (default: `vocab_size`),
`target_hidden_size` when the target is wider or narrower than the head, and optionally
`eagle_config: {eagle_aux_hidden_state_layer_ids}`. Tensors in `*.safetensors`:
`midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`,
`midlayer.self_attn.{q,k,v,o}_proj.weight` (q/k/v read 2C), `midlayer.mlp.{gate,up,down}_proj.weight`,
`fc.weight` [C, 3*C_t], `norm.weight`, `lm_head.weight` [Vd, C], `d2t` [Vd] int64, `t2d` [V] bool,
optionally `embed_tokens.weight` (else the target's embedding is shared, as SGLang and vLLM do).
A leading `model.`, vLLM's `layers.0.` for `midlayer.`, and SafeAILab's `pytorch_model.bin` instead
of safetensors are accepted.

Feature layer ids, two conventions in the wild: `eagle_config.eagle_aux_hidden_state_layer_ids`
names layer *outputs* (SpecForge trains on them, SGLang captures the input of id + 1), a top-level
`eagle_aux_hidden_state_layer_ids` (vLLM / speculators) names layer *inputs*. Without either, the
inputs of (2, L//2, L-3), which every implementation agrees on; the writer therefore omits the field
when the ids are that default, and otherwise writes SpecForge's form.

Targets of every family give the head the same two things. Features: the residual stream as
transformers' `hidden_states` reports it (what SpecForge trains on): for Gemma, entry 0 is the
embedding scaled by sqrt(C) and each layer's output includes Gemma-4's per-layer input and layer
scalar; for mixture-of-experts targets, the output after the sparse MLP (`GemmaTransformer.forward`,
`Transformer.forward` with `capture`). Token embedding: the raw row of the target's table (or the
head's own `embed_tokens`), unscaled on every family: SGLang hands the head the target's
`embed_tokens.weight` (`get_embed_and_head`), which the head's plain embedding reads as is.

Owns: detection (`is_eagle3_dir`), loading against a target with one-line errors for a mismatch
(hidden size, vocabulary, layer ids, the draft-vocabulary map), and the writer. Does not own the
network (`eagle3.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specpilot.errors import CheckpointError
from specpilot.models.config import ModelConfig
from specpilot.models.eagle3 import Eagle3Model, Eagle3Spec, default_layer_ids, expand_eagle3
from specpilot.models.loading import read_hf_tensors

ARCHITECTURE = "LlamaForCausalLMEagle3"
IDS = "eagle_aux_hidden_state_layer_ids"


def _read_json(path: Path) -> dict | None:
    file = path / "config.json"
    if not file.is_file():
        return None
    try:
        cfg = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return cfg if isinstance(cfg, dict) else None


def is_eagle3_dir(path: str | Path) -> bool:
    """True when `path` holds an EAGLE-3 head (by its config.json)."""
    cfg = _read_json(Path(path))
    if cfg is None:
        return False
    archs = cfg.get("architectures") or []
    return any("eagle3" in a.lower() for a in archs) or "eagle_config" in cfg


def read_eagle3_config(path: str | Path, num_target_layers: int) -> tuple[ModelConfig, Eagle3Spec]:
    """The head's layer config and its `Eagle3Spec` (layer ids resolved for an L-layer target)."""
    path = Path(path)
    where = str(path / "config.json")
    cfg = _read_json(path)
    if cfg is None:
        raise CheckpointError(f"{path}: no readable config.json (not an EAGLE-3 head directory)")
    if "transformer_layer_config" in cfg:
        raise CheckpointError(f"{where}: the speculators format is not supported; use the SpecForge/EAGLE layout")
    eagle = cfg.get("eagle_config") or {}
    if not eagle.get("use_aux_hidden_state", True):
        raise CheckpointError(f"{where}: use_aux_hidden_state = false (an EAGLE-1/2 head) is not supported")
    layer_cfg = {k: v for k, v in cfg.items() if k != "architectures"}
    layer_cfg.update(model_type="llama", tie_word_embeddings=False)
    config = ModelConfig.from_hf_dict(layer_cfg, where=where)
    if config.num_layers != 1:
        raise CheckpointError(f"{where}: num_hidden_layers = {config.num_layers}; only one-layer EAGLE-3 heads are supported")
    try:
        if cfg.get(IDS):
            ids = tuple(int(i) for i in cfg[IDS])  # layer inputs (vLLM)
        elif eagle.get(IDS):
            ids = tuple(int(i) + 1 for i in eagle[IDS])  # layer outputs (SpecForge, SGLang)
        else:
            ids = default_layer_ids(num_target_layers)
        spec = Eagle3Spec(
            layer_ids=ids,
            target_hidden_size=int(cfg.get("target_hidden_size") or config.hidden_size),
            draft_vocab_size=int(cfg.get("draft_vocab_size") or config.vocab_size),
            norm_before_residual=bool(cfg.get("norm_before_residual", eagle.get("norm_before_residual", False))),
            num_target_layers=num_target_layers,
        )
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: {IDS}, target_hidden_size and draft_vocab_size must be integers") from None
    if not 1 <= spec.draft_vocab_size <= config.vocab_size:
        raise CheckpointError(f"{where}: draft_vocab_size {spec.draft_vocab_size} is not in 1..vocab_size {config.vocab_size}")
    return config, spec


def check_target(config: ModelConfig, spec: Eagle3Spec, target: ModelConfig, where: str, own_embedding: bool) -> None:
    """One line naming the first way this head does not fit `target`."""
    if spec.target_hidden_size != target.hidden_size:
        raise CheckpointError(
            f"{where}: EAGLE-3 head target_hidden_size {spec.target_hidden_size} != target hidden_size {target.hidden_size}"
        )
    if config.vocab_size != target.vocab_size:
        raise CheckpointError(f"{where}: EAGLE-3 head vocab_size {config.vocab_size} != target vocab_size {target.vocab_size}")
    bad = [i for i in spec.layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise CheckpointError(
            f"{where}: EAGLE-3 feature layer ids {list(spec.layer_ids)} (layer inputs) name layer(s) {bad} "
            f"outside the target's {target.num_layers} layers"
        )
    if not own_embedding and config.hidden_size != target.hidden_size:
        raise CheckpointError(
            f"{where}: EAGLE-3 head hidden_size {config.hidden_size} != target hidden_size {target.hidden_size} "
            "and no embed_tokens.weight of its own"
        )


def expected_shapes(config: ModelConfig, spec: Eagle3Spec) -> dict[str, tuple[int, ...]]:
    C, I, D = config.hidden_size, config.intermediate_size, config.head_dim
    H, Hkv = config.num_heads, config.num_kv_heads
    p = "midlayer."
    return {
        p + "input_layernorm.weight": (C,), p + "hidden_norm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
        p + "self_attn.q_proj.weight": (H * D, 2 * C), p + "self_attn.k_proj.weight": (Hkv * D, 2 * C),
        p + "self_attn.v_proj.weight": (Hkv * D, 2 * C), p + "self_attn.o_proj.weight": (C, H * D),
        p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C), p + "mlp.down_proj.weight": (C, I),
        "fc.weight": (C, len(spec.layer_ids) * spec.target_hidden_size), "norm.weight": (C,),
    }


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The directory's tensors: `*.safetensors` (SpecForge), else `pytorch_model.bin` (SafeAILab's
    published heads, read with `weights_only`)."""
    binary = path / "pytorch_model.bin"
    if binary.is_file() and not any(path.glob("*.safetensors")):
        try:
            state = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file is one line
            raise CheckpointError(f"{binary}: not a readable PyTorch state dict ({type(err).__name__})") from None
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return read_hf_tensors(path)


def _public_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        name = name.removeprefix("model.")
        if name.startswith("layers.0."):
            name = "midlayer." + name.removeprefix("layers.0.")
        out[name] = t
    return out


def _vocab_map(tensors: dict, config: ModelConfig, spec: Eagle3Spec, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd], t2d [V]) from the file, checked; identity when absent and Vd == V."""
    V, Vd = config.vocab_size, spec.draft_vocab_size
    if "d2t" not in tensors:
        if Vd != V:
            raise CheckpointError(f"{where}: draft_vocab_size {Vd} < vocab_size {V} but no d2t tensor maps the two")
        return torch.zeros(Vd, dtype=torch.int64), torch.ones(V, dtype=torch.bool)
    d2t = tensors["d2t"].to(torch.int64)
    if tuple(d2t.shape) != (Vd,):
        raise CheckpointError(f"{where}: d2t has shape {list(d2t.shape)}, expected [{Vd}] (draft_vocab_size)")
    ids = torch.arange(Vd) + d2t
    if bool(((ids < 0) | (ids >= V)).any()) or ids.unique().numel() != Vd:
        raise CheckpointError(f"{where}: d2t maps draft ids outside the target vocabulary or onto one id twice")
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    if "t2d" in tensors and not torch.equal(tensors["t2d"].to(torch.bool).reshape(-1), t2d):
        raise CheckpointError(f"{where}: t2d does not mark exactly the target ids d2t maps to")
    return d2t, t2d


def load_eagle3(path: str | Path, target, device="cpu", dtype: torch.dtype = torch.float32,
                factor: int = 1) -> Eagle3Model:
    """An EAGLE-3 head directory, checked against `target` (a loaded `Transformer`), widened
    `factor` times (`eagle3.expand_eagle3`) when the target was widened that much at load."""
    from specpilot.models.expand import expanded_config

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: EAGLE-3 head directory does not exist")
    L = target.config.num_layers
    config, spec = read_eagle3_config(path, L)
    tensors = _public_names(read_tensors(path))
    own_embedding = "embed_tokens.weight" in tensors
    wide_spec = Eagle3Spec(spec.layer_ids, spec.target_hidden_size * factor, spec.draft_vocab_size)
    check_target(expanded_config(config, factor), wide_spec, target.config, str(path), own_embedding)
    C = config.hidden_size
    shapes = expected_shapes(config, spec)
    shapes["lm_head.weight"] = (spec.draft_vocab_size, C)
    if own_embedding:
        shapes["embed_tokens.weight"] = (config.vocab_size, C)
    if "lm_head.weight" not in tensors and spec.draft_vocab_size == config.vocab_size:
        # as SGLang: a head without its own lm_head uses the target's (copy 0 of a widened one, unscaled)
        tensors["lm_head.weight"] = target.lm_head.weight[:, :C].detach().float().cpu() * factor
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor {name} is missing")
        if tuple(tensors[name].shape) != shape:
            got = list(tensors[name].shape)
            raise CheckpointError(f"{path}: tensor {name} has shape {got}, config implies {list(shape)}")
    d2t, t2d = _vocab_map(tensors, config, spec, str(path))
    p = "midlayer."
    fused = tuple(p + n for n in ("self_attn.q_", "self_attn.k_", "self_attn.v_", "mlp.gate_", "mlp.up_"))
    state = {k: tensors[k] for k in shapes if not k.startswith(fused)}
    state[p + "self_attn.qkv_proj.weight"] = torch.cat([tensors[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
    state[p + "mlp.gate_up_proj.weight"] = torch.cat([tensors[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")])
    state = {k: v.to(dtype) for k, v in state.items()}
    state.update(d2t=d2t, t2d=t2d)
    model = Eagle3Model(config, spec, max_positions=target.rope_cos.shape[0], own_embedding=own_embedding)
    model.load_state_dict(state, strict=True)
    cos, sin = model.rope_cos, model.rope_sin  # float32, as the target's
    model.to(device=device, dtype=dtype)  # floating tensors only: d2t / t2d keep their types
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return expand_eagle3(model.eval().requires_grad_(False), factor)


def to_public_state(model: Eagle3Model) -> dict[str, torch.Tensor]:
    """Our parameters and buffers -> the public tensor names (unfused), contiguous CPU tensors."""
    c = model.config
    H, Hkv, D, I = c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    p = "midlayer."
    out = {}
    for name, t in sd.items():
        if name == p + "self_attn.qkv_proj.weight":
            for n, part in zip("qkv", t.split([H * D, Hkv * D, Hkv * D])):
                out[p + f"self_attn.{n}_proj.weight"] = part
        elif name == p + "mlp.gate_up_proj.weight":
            out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = t.split([I, I])
        else:
            out[name] = t
    return {k: v.contiguous() for k, v in out.items()}


def write_eagle3(model: Eagle3Model, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `model` as an EAGLE-3 head directory in the public layout."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    spec = model.spec
    cfg = model.config.with_changes(family="llama", qk_norm=False, tie_word_embeddings=False).to_hf_dict()
    cfg["architectures"] = [ARCHITECTURE]
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    cfg["draft_vocab_size"] = spec.draft_vocab_size
    if spec.target_hidden_size != model.config.hidden_size:
        cfg["target_hidden_size"] = spec.target_hidden_size
    if spec.num_target_layers is None or spec.layer_ids != default_layer_ids(spec.num_target_layers):
        cfg["eagle_config"] = {IDS: [i - 1 for i in spec.layer_ids], "use_aux_hidden_state": True}
    if spec.norm_before_residual:
        cfg["norm_before_residual"] = True
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in to_public_state(model).items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path
