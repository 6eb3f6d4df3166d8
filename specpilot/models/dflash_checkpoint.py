"""Read and write DFlash drafter directories in the public layout (z-lab/dflash, SpecForge).

`config.json` is a Qwen3 config of the drafter's own layers (`num_hidden_layers`, `hidden_size`,
heads, ...) plus `architectures: ["DFlashDraftModel"]`, `block_size`, `num_target_layers` and
`dflash_config: {target_layer_ids, mask_token_id}` (some exports put `block_size` or
`mask_token_id` inside or beside `dflash_config`: both are read), and for a target whose trunk
scales or caps what the drafter sees (Gemma) `dflash_config.{input_embedding_scale,
output_multiplier, final_logit_softcapping}` (`dflash.py`: absent, 1.0 / 1.0 / none). Tensors in
`*.safetensors` carry the module names of `DFlashDraftModel`: `layers.N.self_attn.{q,k,v,o}_proj.weight`,
`layers.N.self_attn.{q,k}_norm.weight`, `layers.N.mlp.{gate,up,down}_proj.weight`,
`layers.N.{input,post_attention}_layernorm.weight`, `fc.weight`, `hidden_norm.weight`,
`norm.weight` (a leading `model.` is tolerated). A drafter trained here with a learned mask vector
instead of a mask token also has `mask_embedding` (our one extension; absent in public files): the
block input of a mask position as is (a mask token's is its raw embedding row x
`input_embedding_scale`, as any block token's).

Owns: detection (`is_dflash_dir`), loading against a target with one-line errors for a mismatch
(hidden size, vocabulary, feature layer ids, the target depth it was built for), and the writer.
Does not own the network (`dflash.py`).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from specpilot.errors import CheckpointError
from specpilot.models.config import ModelConfig
from specpilot.models.dflash import DFlashModel, DFlashSpec, build_target_layer_ids
from specpilot.models.loading import read_hf_tensors

ARCHITECTURE = "DFlashDraftModel"
# `dflash_config` numbers of the target's embedding and head as the drafter sees them, and their
# defaults (`dflash.py`); final_logit_softcapping 0 (or absent / null) is no cap
SCALES = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": 0.0}


def _read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: no config.json (not a DFlash drafter directory)")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{file}: not valid JSON") from None


def is_dflash_dir(path: str | Path) -> bool:
    """True when `path` holds a DFlash drafter (by its config.json)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        return False
    try:
        cfg = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    archs = cfg.get("architectures") or []
    return any("DFlash" in a for a in archs) or "dflash_config" in cfg


def read_dflash_config(path: str | Path) -> tuple[ModelConfig, DFlashSpec]:
    """The drafter's layer config and its `DFlashSpec` from `path/config.json`."""
    path = Path(path)
    cfg = _read_config(path)
    where = str(path / "config.json")
    dcfg = cfg.get("dflash_config") or {}
    layer_cfg = {k: v for k, v in cfg.items() if k != "architectures"}
    layer_cfg["model_type"] = "qwen3"
    config = ModelConfig.from_hf_dict(layer_cfg, where=where)
    n_target = cfg.get("num_target_layers", dcfg.get("num_target_layers"))
    ids = dcfg.get("target_layer_ids", cfg.get("target_layer_ids"))
    if ids is None:
        if n_target is None:
            raise CheckpointError(f"{where}: neither dflash_config.target_layer_ids nor num_target_layers is set")
        ids = build_target_layer_ids(int(n_target), config.num_layers)
    block = cfg.get("block_size", dcfg.get("block_size", 16))
    mask = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
    try:
        spec = DFlashSpec(tuple(int(i) for i in ids), int(block), None if mask is None else int(mask),
                          None if n_target is None else int(n_target))
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: target_layer_ids, block_size and mask_token_id must be integers") from None
    if not spec.target_layer_ids or spec.block_size < 2:
        raise CheckpointError(f"{where}: needs at least one target layer id and block_size >= 2")
    scales = {}
    for name, default in SCALES.items():
        value = dcfg.get(name, cfg.get(name))
        try:
            value = default if value is None else float(value)
        except (TypeError, ValueError):
            raise CheckpointError(f"{where}: {name} must be a number") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "final_logit_softcapping"):
            raise CheckpointError(f"{where}: {name} = {value} must be finite and "
                                  + (">= 0" if name == "final_logit_softcapping" else "> 0"))
        scales[name] = value
    return config, replace(spec, **scales)


def check_target(config: ModelConfig, spec: DFlashSpec, target: ModelConfig, where: str) -> None:
    """One line naming the first way this drafter does not fit `target`."""
    if config.hidden_size != target.hidden_size:
        raise CheckpointError(
            f"{where}: DFlash drafter hidden_size {config.hidden_size} != target hidden_size {target.hidden_size}"
        )
    if config.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"{where}: DFlash drafter vocab_size {config.vocab_size} != target vocab_size {target.vocab_size}"
        )
    bad = [i for i in spec.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise CheckpointError(
            f"{where}: DFlash target_layer_ids {list(spec.target_layer_ids)} name layer(s) {bad} "
            f"outside the target's {target.num_layers} layers"
        )
    if spec.num_target_layers is not None and spec.num_target_layers != target.num_layers:
        raise CheckpointError(
            f"{where}: DFlash drafter was built for a target of {spec.num_target_layers} layers (num_target_layers); "
            f"this target has {target.num_layers}"
        )
    if spec.mask_token_id is not None and not 0 <= spec.mask_token_id < target.vocab_size:
        raise CheckpointError(f"{where}: DFlash mask_token_id {spec.mask_token_id} is outside the target vocabulary")


def expected_shapes(config: ModelConfig, spec: DFlashSpec) -> dict[str, tuple[int, ...]]:
    C, I, D = config.hidden_size, config.intermediate_size, config.head_dim
    H, Hkv = config.num_heads, config.num_kv_heads
    shapes = {"fc.weight": (C, len(spec.target_layer_ids) * C), "hidden_norm.weight": (C,), "norm.weight": (C,)}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
            p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (Hkv * D, C),
            p + "self_attn.v_proj.weight": (Hkv * D, C), p + "self_attn.o_proj.weight": (C, H * D),
            p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C), p + "mlp.down_proj.weight": (C, I),
        })
    return shapes


def load_dflash(path: str | Path, target, device="cpu", dtype: torch.dtype = torch.float32,
                factor: int = 1) -> DFlashModel:
    """A DFlash drafter directory, checked against `target` (a loaded `Transformer`), widened
    `factor` times (`dflash.expand_dflash`) when the target was widened that much at load."""
    from specpilot.models.dflash import expand_dflash
    from specpilot.models.expand import expanded_config

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: DFlash drafter directory does not exist")
    config, spec = read_dflash_config(path)
    check_target(expanded_config(config, factor), spec, target.config, str(path))
    tensors = {k.removeprefix("model."): v for k, v in read_hf_tensors(path).items()}
    for name, shape in expected_shapes(config, spec).items():
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor {name} is missing")
        if tuple(tensors[name].shape) != shape:
            got = list(tensors[name].shape)
            raise CheckpointError(f"{path}: tensor {name} has shape {got}, config implies {list(shape)}")
    C = config.hidden_size
    if "mask_embedding" in tensors:
        mask = tensors["mask_embedding"]
    elif spec.mask_token_id is not None:  # the token's raw row (copy 0 if widened), scaled as any block input
        mask = target.embed_tokens.weight[spec.mask_token_id, : config.hidden_size].detach().cpu()
        mask = mask * spec.input_embedding_scale if spec.input_embedding_scale != 1.0 else mask
    else:
        raise CheckpointError(f"{path}: no dflash_config.mask_token_id and no mask_embedding tensor")
    if tuple(mask.shape) != (C,):
        raise CheckpointError(f"{path}: mask_embedding has shape {list(mask.shape)}, expected [{C}]")
    state = {"fc.weight": tensors["fc.weight"], "hidden_norm.weight": tensors["hidden_norm.weight"],
             "norm.weight": tensors["norm.weight"], "mask_embedding": mask}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            state[p + n + ".weight"] = tensors[p + n + ".weight"]
        for n in ("q_norm", "k_norm", "o_proj"):
            state[p + f"self_attn.{n}.weight"] = tensors[p + f"self_attn.{n}.weight"]
        state[p + "self_attn.qkv_proj.weight"] = torch.cat([tensors[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        state[p + "mlp.gate_up_proj.weight"] = torch.cat([tensors[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")])
        state[p + "mlp.down_proj.weight"] = tensors[p + "mlp.down_proj.weight"]
    model = DFlashModel(config, spec, max_positions=target.rope_cos.shape[0])
    model.load_state_dict(state, strict=True)
    return expand_dflash(model.cast(device, dtype).eval().requires_grad_(False), factor)


def to_public_state(model: DFlashModel) -> dict[str, torch.Tensor]:
    """Our parameters -> the public tensor names (unfused), contiguous CPU tensors."""
    c = model.config
    H, Hkv, D, I = c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    out = {k: sd[k] for k in ("fc.weight", "hidden_norm.weight", "norm.weight")}
    if model.spec.mask_token_id is None:
        out["mask_embedding"] = sd["mask_embedding"]
    for i in range(c.num_layers):
        p = f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm",
                  "self_attn.o_proj", "mlp.down_proj"):
            out[p + n + ".weight"] = sd[p + n + ".weight"]
        wq, wk, wv = sd[p + "self_attn.qkv_proj.weight"].split([H * D, Hkv * D, Hkv * D])
        out[p + "self_attn.q_proj.weight"], out[p + "self_attn.k_proj.weight"] = wq, wk
        out[p + "self_attn.v_proj.weight"] = wv
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = sd[p + "mlp.gate_up_proj.weight"].split([I, I])
    return {k: v.contiguous() for k, v in out.items()}


def write_dflash(model: DFlashModel, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `model` as a DFlash drafter directory in the public layout."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    spec = model.spec
    cfg = model.config.with_changes(family="qwen3", tie_word_embeddings=False).to_hf_dict()
    cfg["architectures"] = [ARCHITECTURE]
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    cfg["block_size"] = spec.block_size
    cfg["num_target_layers"] = spec.num_target_layers
    dflash = {"target_layer_ids": list(spec.target_layer_ids)}
    if spec.mask_token_id is not None:
        dflash["mask_token_id"] = spec.mask_token_id
    dflash.update({name: getattr(spec, name) for name, default in SCALES.items() if getattr(spec, name) != default})
    cfg["dflash_config"] = dflash
    tensors = {k: v.to(dtype) for k, v in to_public_state(model).items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path
