"""FP8 checkpoints: reading the layouts users have into `FP8Weight`s, `convert_fp8` (BF16 or
float32 directory -> block-wise or per-channel FP8 directory) and `quantize_model` (a loaded
decoder -> the FP8 decoder that converting and loading it gives), both through one quantizer,
`quantize_tensors`.

Layouts read, from `quantization_config` in config.json:
  - `quant_method: "fp8"` (DeepSeek/Qwen FP8 releases, transformers' finegrained FP8): `fmt`
    "e4m3"; `weight_block_size` [bn, bk] with each quantized `X.weight` e4m3 [N, K] beside
    `X.weight_scale_inv` float32 [ceil(N/bn), ceil(K/bk)]; without a block size, per-tensor (a
    scalar or [1]) or per-channel ([N, 1]) `weight_scale_inv` or `weight_scale`. `activation_scheme`
    "dynamic" (or "static", with `X.input_scale`).
  - `quant_method: "compressed-tensors"` with `format` "float-quantized"/"naive-quantized" and
    config groups of 8-bit float weights, strategy "tensor", "channel" or "block"
    (`block_structure`): `X.weight_scale`; input activations absent (weight-only), dynamic
    per-token (FP8_DYNAMIC) or static (`X.input_scale`).
  - `quant_method: "w8a8_fp8"` (SGLang): per-channel or per-tensor `X.weight_scale`, dynamic
    per-token activations.
Every scale multiplies the codes (W = code * scale). A scale of the wrong shape, dtype or value
(non-finite, <= 0), a code tensor without its scale, a scale without its codes, an unknown method,
format or strategy, and FP8 MoE experts are refused with one `CheckpointError` line. Which tensors
are quantized is read from the tensors themselves (an e4m3 `X.weight`), so `modules_to_not_convert`
and `ignore` lists need no parsing. Does not own the module (`models.fp8_linear`).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specpilot.errors import CheckpointError
from specpilot.models.fp8_linear import E4M3, E4M3_MAX, Activation, FP8Weight
from specpilot.w12.checkpoint import MANIFEST, save_tensors

BLOCK = 128  # `fp8 convert` writes 128x128 blocks, as the public block-wise releases do
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")
INPUT_SCALE = ".input_scale"
# HF projection names `fp8 convert` quantizes (dense, GQA, hybrid Gated DeltaNet blocks); never experts
PROJECTION = re.compile(r"layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|"
                        r"linear_attn\.(in_proj_\w+|out_proj))\.weight$")


@dataclass(frozen=True)
class FP8Scheme:
    """What a `quantization_config` says about the FP8 tensors of its checkpoint."""
    block: tuple[int, int] | None  # (bn, bk) of a block-wise grid; None: per-tensor or per-channel
    activation: Activation


def fp8_scheme(config_json: dict, where: str) -> FP8Scheme | None:
    """The FP8 scheme of a config.json dict, None when it has no `quantization_config`."""
    qc = config_json.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise CheckpointError(f"{where}: quantization_config is not an object")
    method = qc.get("quant_method")
    if method == "fp8":
        if qc.get("fmt", "e4m3") != "e4m3":
            raise CheckpointError(f"{where}: FP8 fmt {qc.get('fmt')!r} is not supported (only e4m3)")
        act = {"dynamic": Activation.DYNAMIC, "static": Activation.STATIC}.get(qc.get("activation_scheme", "dynamic"))
        if act is None:
            raise CheckpointError(f"{where}: unknown FP8 activation_scheme {qc.get('activation_scheme')!r}")
        return FP8Scheme(_block(qc.get("weight_block_size"), where), act)
    if method == "w8a8_fp8":
        return FP8Scheme(None, Activation.DYNAMIC)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    raise CheckpointError(f"{where}: quant_method {method!r} is not supported (fp8, compressed-tensors, w8a8_fp8)")


def _block(value, where: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2 or
            not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise CheckpointError(f"{where}: weight_block_size must be two positive integers, got {value!r}")
    return tuple(value)


def _compressed_tensors(qc: dict, where: str) -> FP8Scheme:
    fmt = qc.get("format")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise CheckpointError(f"{where}: compressed-tensors format {fmt!r} is not supported (float-quantized)")
    groups = list((qc.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise CheckpointError(f"{where}: compressed-tensors needs exactly one config group, got {len(groups)}")
    weights, inputs = groups[0].get("weights") or {}, groups[0].get("input_activations")
    if weights.get("type") != "float" or weights.get("num_bits") != 8 or weights.get("dynamic"):
        raise CheckpointError(f"{where}: compressed-tensors weights must be static 8-bit float, got {weights}")
    strategy = weights.get("strategy")
    if strategy not in ("tensor", "channel", "block"):
        raise CheckpointError(f"{where}: compressed-tensors weight strategy {strategy!r} is not supported")
    block = _block(weights.get("block_structure"), where) if strategy == "block" else None
    if strategy == "block" and block is None:
        raise CheckpointError(f"{where}: compressed-tensors block strategy without block_structure")
    if inputs is None:
        return FP8Scheme(block, Activation.NONE)
    if inputs.get("type") != "float" or inputs.get("num_bits") != 8:
        raise CheckpointError(f"{where}: compressed-tensors input activations must be 8-bit float, got {inputs}")
    return FP8Scheme(block, Activation.DYNAMIC if inputs.get("dynamic") else Activation.STATIC)


def pair_fp8_tensors(tensors: dict, scheme: FP8Scheme | None, where: str) -> dict:
    """`tensors` with each e4m3 `X.weight` and its scales replaced by one `FP8Weight` under `X.weight`."""
    out = dict(tensors)
    codes = [n for n, t in tensors.items() if t.dtype == E4M3]
    other_fp8 = [n for n, t in tensors.items() if t.dtype.itemsize == 1 and t.dtype.is_floating_point and t.dtype != E4M3]
    if other_fp8:
        raise CheckpointError(f"{where}: tensor {other_fp8[0]} is {tensors[other_fp8[0]].dtype}; only e4m3 is supported")
    if codes and scheme is None:
        raise CheckpointError(f"{where}: tensor {codes[0]} is float8 but config.json has no quantization_config")
    for name in codes:
        if ".experts." in name:
            raise CheckpointError(f"{where}: {name}: FP8 MoE experts are not supported (dense and hybrid FP8 only)")
        if not name.endswith(".weight") or tensors[name].dim() != 2:
            raise CheckpointError(f"{where}: FP8 tensor {name} is not a 2-D projection weight")
        stem = name.removesuffix(".weight")
        found = [stem + s for s in SCALE_SUFFIXES if stem + s in tensors]
        if not found:
            raise CheckpointError(f"{where}: FP8 tensor {name} has no {stem}.weight_scale_inv or .weight_scale")
        scale = tensors[found[0]]
        out[name] = fp8_weight(tensors[name], scale, scheme, tensors.get(stem + INPUT_SCALE), found[0], where)
        for n in found + [stem + INPUT_SCALE]:
            out.pop(n, None)
    leftover = [n for n in out if n.endswith(SCALE_SUFFIXES + (INPUT_SCALE,))]
    if leftover:
        raise CheckpointError(f"{where}: scale {leftover[0]} has no float8 weight beside it")
    return out


def fp8_weight(codes: torch.Tensor, scale: torch.Tensor, scheme: FP8Scheme, input_scale, name: str,
               where: str) -> FP8Weight:
    """One projection's codes [N, K] and checkpoint scale as an `FP8Weight` (row-wise grid)."""
    N, K = codes.shape
    if not scale.dtype.is_floating_point or scale.dtype.itemsize < 2:
        raise CheckpointError(f"{where}: scale {name} has dtype {scale.dtype}, expected float32 (or bf16/fp16)")
    scale = scale.float()
    if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
        raise CheckpointError(f"{where}: scale {name} holds non-finite or non-positive values")
    shape = tuple(scale.shape)
    if scheme.block is not None:
        bn, bk = scheme.block
        want = (-(-N // bn), -(-K // bk))
        if shape != want:
            raise CheckpointError(f"{where}: scale {name} has shape {list(shape)}, block {bn}x{bk} over "
                                  f"[{N}, {K}] implies {list(want)}")
        grid, block_k = scale.repeat_interleave(bn, dim=0)[:N], bk  # [N, Kb]
    elif math.prod(shape) == 1 and len(shape) <= 2:
        grid, block_k = scale.reshape(1, 1).expand(N, 1), K  # per-tensor
    elif shape == (N, 1) or shape == (N,):
        grid, block_k = scale.reshape(N, 1), K  # per-channel
    else:
        raise CheckpointError(f"{where}: scale {name} has shape {list(shape)}; expected a scalar or [{N}, 1]")
    inputs = None
    if scheme.activation is Activation.STATIC:
        if input_scale is None or input_scale.numel() != 1 or not bool(torch.isfinite(input_scale).all()) \
                or not float(input_scale.float().reshape(())) > 0:
            raise CheckpointError(f"{where}: {name.rsplit('.', 1)[0]}.input_scale must be one finite positive value "
                                  "for static activations")
        inputs = input_scale.float().reshape(1).expand(N).contiguous()
    return FP8Weight(codes, grid.contiguous(), block_k, scheme.activation, inputs)


def read_config_json(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: config.json is missing or not valid JSON") from None


# ---- conversion --------------------------------------------------------------------------------

def quantize_blockwise(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (codes [N, K] e4m3, scale_inv [ceil(N/b), ceil(K/b)] float32): per block
    scale = amax / 448 (1 for an all-zero block), codes = e4m3(W / scale), round to nearest even."""
    w = w.float()
    N, K = w.shape
    pad = torch.zeros(-(-N // block) * block, -(-K // block) * block, device=w.device)
    pad[:N, :K] = w
    blocks = pad.unflatten(0, (-1, block)).unflatten(2, (-1, block))  # [Nb, b, Kb, b]
    amax = blocks.abs().amax(dim=(1, 3))  # [Nb, Kb]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.flatten(2).flatten(0, 1)[:N, :K].contiguous(), scale.contiguous()


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (codes [N, K] e4m3, scale [N, 1] float32): `quantize_blockwise`'s rule with one
    scale per output row (amax / 448, 1 for an all-zero row), the per-channel layout's."""
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True)  # [N, 1]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).contiguous(), scale.contiguous()


@dataclass(frozen=True)
class FP8ConvertReport:
    """What `convert_fp8` wrote."""
    dst: str
    quantized: tuple[str, ...]  # HF names stored as e4m3 + weight_scale_inv
    kept: int                   # tensors left in the source dtype
    bytes_before: int
    bytes_after: int
    per_channel: bool = False   # one scale per output row; else 128x128 blocks

    def line(self) -> str:
        grid = "per-channel" if self.per_channel else f"block-wise {BLOCK}x{BLOCK}"
        return (f"quantized {len(self.quantized)} tensors to {grid} FP8 e4m3 ({self.kept} kept), "
                f"{self.bytes_before / 2**20:.2f} MiB -> {self.bytes_after / 2**20:.2f} MiB; wrote {self.dst}")


def quantize_tensors(tensors: dict[str, torch.Tensor], tie_word_embeddings: bool, lm_head: bool = False,
                     per_channel: bool = False, where: str = "") -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """HF tensors -> the `quant_method: "fp8"` layout's, and the names quantized: each projection
    (`PROJECTION`; lm_head.weight too with `lm_head`, unless tied) as e4m3 codes `X.weight` beside
    `X.weight_scale_inv` (`quantize_per_channel` with `per_channel`, else `quantize_blockwise`), every
    other tensor as it is. The one quantizer of `convert_fp8` and `quantize_model`."""
    quantize = quantize_per_channel if per_channel else quantize_blockwise
    out, quantized = {}, []
    for name, t in tensors.items():
        if not (PROJECTION.search(name) or (lm_head and name == "lm_head.weight" and not tie_word_embeddings)):
            out[name] = t.contiguous()
            continue
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32) or t.dim() != 2:
            raise CheckpointError(f"{where}: tensor {name} is {t.dtype} {list(t.shape)}; FP8 quantization needs 2-D "
                                  "float weights")
        out[name], out[name.removesuffix(".weight") + ".weight_scale_inv"] = quantize(t)
        quantized.append(name)
    if not quantized:
        raise CheckpointError(f"{where}: no projection weights to quantize")
    return out, tuple(quantized)


def quantization_config(per_channel: bool, lm_head: bool) -> dict:
    """The config.json `quantization_config` of `quantize_tensors`' output."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            **({} if per_channel else {"weight_block_size": [BLOCK, BLOCK]}),
            "modules_to_not_convert": [] if lm_head else ["lm_head"]}


def convert_fp8(src: str | Path, dst: str | Path, lm_head: bool = False, force: bool = False,
                per_channel: bool = False) -> FP8ConvertReport:
    """Write an e4m3 copy of the BF16/float32 HF directory `src` to `dst` in the `quant_method: "fp8"`
    layout: block-wise 128x128 (`weight_block_size`), or with `per_channel` one scale per output row
    (`X.weight_scale_inv` [N, 1], no block size); norms, embeddings (and lm_head unless `lm_head`)
    stay as they are."""
    from specpilot.models.config import ModelConfig
    from specpilot.models.loading import read_hf_tensors

    src, dst = Path(src), Path(dst)
    config_json = read_config_json(src)
    if "quantization_config" in config_json:
        raise CheckpointError(f"SRC {src} is already quantized (config.json has quantization_config)")
    config = ModelConfig.from_dir(src)
    if config.moe_layers:
        raise CheckpointError(f"SRC {src}: FP8 MoE experts are not supported (dense and hybrid FP8 only)")
    tensors = read_hf_tensors(src)
    if dst.exists() and any(dst.iterdir()):
        if not force:
            raise CheckpointError(f"DST {dst} exists and is not empty (use --force to replace it)")
        shutil.rmtree(dst)
    out, quantized = quantize_tensors(tensors, config.tie_word_embeddings, lm_head, per_channel, f"SRC {src}")
    dst.mkdir(parents=True, exist_ok=True)
    save_tensors(out, dst / "model.safetensors", metadata={"format": "pt"})  # the umask's mode, not 0600
    config_json["quantization_config"] = quantization_config(per_channel, lm_head)
    (dst / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    for f in src.iterdir():  # tokenizer and generation files travel with the weights
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json",
                                                                      MANIFEST):  # a W12-stored source's index
            shutil.copyfile(f, dst / f.name)
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return FP8ConvertReport(str(dst), quantized, len(out) - 2 * len(quantized),
                            size(tensors.values()), size(out.values()), per_channel)


def quantize_model(model: nn.Module, per_channel: bool, device: torch.device | str, dtype: torch.dtype,
                   where: str) -> nn.Module:
    """The FP8 twin of a loaded BF16/float32 decoder, on `device` in `dtype`: its HF tensors
    (`loading.to_hf_state`) quantized by `quantize_tensors` (lm_head kept) and read back as
    `load_model` reads an FP8 directory, so weight for weight the model that saving `model`,
    `convert_fp8` and `load_model` give. Quantize from `model` in the precision its checkpoint
    stores (float32 holds any), as `convert_fp8` reads a directory. `where` names it in errors."""
    from specpilot.models.fp8_linear import FP8Linear
    from specpilot.models.loading import (
        build_model,
        check_tensors,
        to_fused_state,
        to_hf_state,
    )
    from specpilot.models.w12_linear import W12Linear

    config = model.config
    if any(isinstance(m, (FP8Linear, W12Linear)) for m in model.modules()):
        raise CheckpointError(f"{where}: the target is stored quantized already (FP8 or W12): FP8 quantization at "
                              "load needs BF16 or float32 weights")
    if config.moe_layers:
        raise CheckpointError(f"{where}: FP8 MoE experts are not supported (dense and hybrid FP8 only)")
    tensors, _ = quantize_tensors(to_hf_state(model), config.tie_word_embeddings, per_channel=per_channel, where=where)
    scheme = fp8_scheme({"quantization_config": quantization_config(per_channel, lm_head=False)}, where)
    tensors = pair_fp8_tensors(tensors, scheme, where)
    check_tensors(config, tensors, where)
    return build_model(config, to_fused_state(config, tensors), device, dtype)
