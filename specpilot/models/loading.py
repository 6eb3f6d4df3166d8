"""Load and save Hugging Face model directories.

Owns: reading `config.json` + single or sharded `*.safetensors` (with `model.safetensors.index.json`),
mapping HF tensor names onto our fused layout (q/k/v -> qkv_proj, gate/up -> gate_up_proj), checking
that every tensor is present with the right shape, and writing our models back out in HF format
(so `transformers` loads them too). A directory converted to W12 (see `specpilot.w12`) loads
through the same call: its projections come back as W12 weights and become `W12Linear` modules;
so does an FP8 directory (a `quantization_config` in config.json, `models.fp8_checkpoint`), whose
e4m3 projections become `FP8Linear` modules.

Does not own: the tokenizer (`tokenizer.py`) or width expansion (`expand.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specpilot.errors import CheckpointError
from specpilot.models.config import GEMMA_FAMILIES, ModelConfig
from specpilot.models.registry import family
from specpilot.models.transformer import rope_tables
from specpilot.models.w12_linear import W12Linear

HF_PREFIX = "model."


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of this config must hold, with its shape."""
    return family(config).hf_tensor_shapes(config)


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError):
            raise CheckpointError(f"{index}: not a valid safetensors index") from None
        files = sorted({path / name for name in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{path}: shard {f.name} named in the index is missing")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights found")
    return files


def read_hf_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF directory (CPU), with a clear error for truncated/corrupt files. W12
    payloads are left to `specpilot.w12`, except in a directory stored in W12 for its size
    (`is_storage_checkpoint`), whose tensors come back decoded: bit for bit the BF16 original."""
    from specpilot.w12.checkpoint import is_storage_checkpoint, iter_w12_tensors
    from specpilot.w12.codec import decode

    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    for f in safetensors_files(path):
        if f.name.startswith("w12"):
            continue  # W12 payload files are read by specpilot.w12
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{f}: unreadable safetensors file ({str(err).splitlines()[0]})") from None
    if is_storage_checkpoint(path):
        tensors.update({name: decode(w) for name, w in iter_w12_tensors(path)})
    return tensors


def check_tensors(config: ModelConfig, tensors: dict, where: str) -> None:
    shapes = hf_tensor_shapes(config)
    if config.hybrid:
        from specpilot.models.hybrid import hf_prefix

        shapes = family(config).hf_tensor_shapes(config, hf_prefix(tensors))
    if config.family in GEMMA_FAMILIES:  # also a multimodal wrapper's text model, under its prefix
        from specpilot.models.gemma import hf_prefix as gemma_prefix

        shapes = family(config).hf_tensor_shapes(config, gemma_prefix(tensors))
    if config.moe_layers:  # per-expert or transformers' fused expert tensors, whichever the checkpoint holds
        from specpilot.models.moe import checkpoint_shapes

        shapes = checkpoint_shapes(config, tensors)
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name} is missing")
        t = tensors[name]
        got = tuple(t.shape)
        if got != shape:
            raise CheckpointError(f"{where}: tensor {name} has shape {list(got)}, config implies {list(shape)}")
        dtype = getattr(t, "dtype", None)
        if isinstance(t, torch.Tensor) and not dtype.is_floating_point:
            raise CheckpointError(f"{where}: tensor {name} has dtype {dtype}, expected a float type")


def to_fused_state(config: ModelConfig, hf: dict) -> dict:
    """HF names -> our parameter names (values may be tensors or W12 weights)."""
    return family(config).to_fused_state(config, hf)


def to_hf_state(model) -> dict[str, torch.Tensor]:
    """Our parameters -> HF names (unfused), contiguous CPU tensors."""
    return family(model.config).to_hf_state(model)


def build_model(
    config: ModelConfig,
    state: dict,
    device: torch.device | str,
    dtype: torch.dtype,
    max_positions: int | None = None,
):
    """The family's decoder (`registry`) holding `state` (our names) on `device` in `dtype`.

    Entries that are W12 weights become `W12Linear` modules, FP8 weights `FP8Linear` modules (both
    must name an `nn.Linear` of the model); everything else is cast to `dtype`.
    """
    from specpilot.models.fp8_linear import FP8Linear, FP8Weight

    with torch.device("meta"):
        model = family(config).model(config, max_positions=max_positions)
    special = {}
    plain = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            plain[name] = value.to(device=device, dtype=dtype)
        else:
            special[name] = value
    if config.tie_word_embeddings and "lm_head.weight" in plain:
        plain.pop("lm_head.weight")
    missing, unexpected = model.load_state_dict(plain, strict=False, assign=True)
    missing = [m for m in missing if m not in special and not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"state does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    for name, value in special.items():
        module_name = name.rsplit(".", 1)[0]
        parent_name, attr = module_name.rsplit(".", 1) if "." in module_name else ("", module_name)
        parent = model.get_submodule(parent_name) if parent_name else model
        if not isinstance(getattr(parent, attr, None), torch.nn.Linear):
            raise CheckpointError(f"{name} is stored quantized but is not a projection of the model")
        value = value if device is None else value.to(device)
        setattr(parent, attr, FP8Linear(value) if isinstance(value, FP8Weight) else W12Linear(value))
    own = getattr(model, "rope_buffers", None)  # a family with RoPE per layer type builds its own tables
    if own is not None:
        for name, table in own(max_positions).items():
            setattr(model, name, table.to(device))
    else:
        cos, sin = rope_tables(config, max_positions or config.max_position_embeddings)
        model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def load_model(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_positions: int | None = None,
):
    """Load an HF model directory (plain, W12-converted or FP8) into its family's decoder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: model directory does not exist")
    config = ModelConfig.from_dir(path)
    tensors = read_hf_tensors(path)
    from specpilot.models.fp8_checkpoint import fp8_scheme, pair_fp8_tensors, read_config_json

    scheme = fp8_scheme(read_config_json(path), str(path / "config.json"))
    if scheme is not None or any(t.dtype == torch.float8_e4m3fn for t in tensors.values()):
        tensors = pair_fp8_tensors(tensors, scheme, str(path))
    from specpilot.w12.checkpoint import is_storage_checkpoint, is_w12_checkpoint, read_w12_tensors

    if is_w12_checkpoint(path) and not is_storage_checkpoint(path):
        tensors.update(read_w12_tensors(path))
        warn_if_reference_decode(path, device)
    check_tensors(config, tensors, str(path))
    return build_model(config, to_fused_state(config, tensors), device, dtype, max_positions)


def warn_if_reference_decode(path: Path, device: torch.device | str) -> None:
    """A `Notice` when no Triton kernel will run this W12 checkpoint's projections on `device`."""
    import warnings

    from specpilot import env
    from specpilot.errors import Notice
    from specpilot.kernels.dispatch import triton_installed

    device = torch.device("cpu" if device is None else device)
    if triton_installed() and (device.type == "cuda" or env.triton_interpret()):
        return
    why = "without Triton" if device.type == "cuda" else "on CPU"
    warnings.warn(f"{path} is a W12 checkpoint: {why} every projection decodes its W12 weights to BF16 through "
                  "the reference codec on each forward, so it runs slower than the BF16 original (same tokens); "
                  "the W12 speedup needs the Triton kernels on a CUDA GPU", Notice, stacklevel=3)


def save_model(model, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write `config.json` + `model.safetensors` (HF names, `dtype`) into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf = {k: v.to(dtype) for k, v in to_hf_state(model).items()}
    cfg = model.config.to_hf_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    save_file(hf, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
