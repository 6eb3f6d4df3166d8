"""FP8 projections on CPU: `FP8Weight`'s row operations and dequantization rule, block-wise
quantization error bound, and FP8 checkpoints in the public layouts (block-wise 128x128 `fp8`,
compressed-tensors FP8_DYNAMIC per-channel, SGLang `w8a8_fp8` per-tensor) loading to exactly the
logits of a dense float32 model holding the dequantized weights; malformed layouts are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specpilot.errors import CheckpointError
from specpilot.models.fp8_checkpoint import PROJECTION, convert_fp8, quantize_blockwise
from specpilot.models.fp8_linear import E4M3, Activation, FP8Linear, FP8Weight
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, tiny_hybrid_config, write_random_checkpoint, \
    write_random_hybrid

# partial 128-blocks everywhere: q 160 rows (128 + 32), k/v 80, gate/up 200, down K = 200
DIMS = dict(num_layers=2, hidden_size=144, intermediate_size=200, num_heads=4, num_kv_heads=2, head_dim=40)
TOKENS = torch.tensor([[5, 17, 300, 9, 4000, 2, 77, 1024]])


def logits(model, tokens=TOKENS):
    with torch.no_grad():
        return model.forward_causal(tokens)


def block_dequant(codes: torch.Tensor, scale_inv: torch.Tensor, bn: int = 128, bk: int = 128) -> torch.Tensor:
    """W = codes * scale_inv expanded over [bn, bk] blocks, written independently of `FP8Weight`."""
    N, K = codes.shape
    return codes.float() * scale_inv.repeat_interleave(bn, 0)[:N].repeat_interleave(bk, 1)[:, :K]


def write_dense_twin(fp8_dir: Path, out: Path, dequant) -> Path:
    """The float32 directory whose weights are `fp8_dir`'s dequantized weights (`dequant(name, tensors)`)."""
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    dense = {}
    for name, t in tensors.items():
        if t.dtype == E4M3:
            dense[name] = dequant(name, tensors)
        elif not name.endswith(("_scale_inv", "_scale", "input_scale")):
            dense[name] = t.float()
    out.mkdir()
    save_file(dense, str(out / "model.safetensors"))
    config = json.loads((fp8_dir / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    return out


def rewrite(src: Path, out: Path, quantization_config: dict, quantize) -> Path:
    """A copy of `src` whose projection weights `quantize(name, w)` -> {name: tensor} replaces."""
    tensors = load_file(str(src / "model.safetensors"))
    new = {}
    for name, t in tensors.items():
        new.update(quantize(name, t) if PROJECTION.search(name) else {name: t})
    out.mkdir()
    save_file(new, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config))
    return out


BLOCKWISE = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def handwritten_blockwise(name: str, w: torch.Tensor) -> dict:
    """Layout (a) as a release writes it, scales drawn per block (not amax/448: any positive scale is valid)."""
    N, K = w.shape
    g = torch.Generator().manual_seed(len(name))
    scale_inv = (torch.rand(-(-N // 128), -(-K // 128), generator=g) + 0.5) * w.abs().max() / 300
    codes = (w / block_dequant(torch.ones(N, K), scale_inv)).clamp(-448, 448).to(E4M3)
    return {name: codes, name.removesuffix("weight") + "weight_scale_inv": scale_inv}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("fp8") / "src", tiny_config(**DIMS))


def test_fp8_weight_rows_fuse_split_and_permute_exactly():
    g = torch.Generator().manual_seed(0)
    parts = []
    for N in (160, 80, 80):
        codes = (torch.randn(N, 200, generator=g) * 50).to(E4M3)
        scale = torch.rand(-(-N // 128), 2, generator=g) + 0.1
        parts.append((codes, scale, FP8Weight(codes, scale.repeat_interleave(128, 0)[:N].contiguous(), 128)))
    fused = FP8Weight.concat_rows([p[2] for p in parts])
    want = torch.cat([block_dequant(c, s) for c, s, _ in parts])
    assert fused.shape == (320, 200) and torch.equal(fused.dequantize(), want)
    assert all(torch.equal(a.dequantize(), b) for a, b in zip(fused.split_rows([160, 80, 80]), want.split([160, 80, 80])))
    index = torch.randperm(320, generator=g)
    assert torch.equal(fused.take_rows(index).dequantize(), want[index])
    module = FP8Linear(fused)
    x = torch.randn(3, 5, 200, generator=g)
    assert torch.equal(module(x), F.linear(x, want))
    assert torch.equal(module(x.bfloat16()), F.linear(x.bfloat16(), want.bfloat16()))
    with pytest.raises(ValueError, match="different scale blocks"):
        FP8Weight.concat_rows([fused, FP8Weight(fused.data, fused.scale[:, :1].contiguous(), 200)])


def test_blockwise_quantization_error_bound():
    """Each block's amax maps to +-448 exactly; every weight is within e4m3's half-ulp: 2^-4 relative
    for normals, scale * 2^-10 absolute below the normal range (2^-6 * scale)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(130, 300, generator=g) * 0.05
    w[:128, 128:256] = 0.0  # an all-zero block gets scale 1 and zero codes
    codes, scale_inv = quantize_blockwise(w)
    assert codes.dtype == E4M3 and scale_inv.shape == (2, 3) and scale_inv[0, 1] == 1.0
    back = block_dequant(codes, scale_inv)
    s = scale_inv.repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)[:, :300]
    assert bool(((w - back).abs() <= torch.maximum(w.abs() * 2**-4, s * 2**-10)).all())
    assert torch.equal(codes[:128, 128:256].float(), torch.zeros(128, 128))
    assert codes.float().abs().amax() == 448.0


def test_converted_checkpoint_equals_its_dense_twin(src, tmp_path):
    fp8 = tmp_path / "fp8"
    report = convert_fp8(src, fp8)
    assert len(report.quantized) == 2 * 7 and report.bytes_after < report.bytes_before
    model = load_model(fp8)
    assert isinstance(model.layers[0].self_attn.qkv_proj, FP8Linear)
    assert not isinstance(model.lm_head, FP8Linear)  # kept unquantized by default
    tensors = load_file(str(fp8 / "model.safetensors"))
    assert tensors["model.norm.weight"].dtype == torch.float32 and "lm_head.weight_scale_inv" not in tensors
    twin = write_dense_twin(fp8, tmp_path / "dense",
                            lambda n, ts: block_dequant(ts[n], ts[n.removesuffix("weight") + "weight_scale_inv"]))
    assert torch.equal(logits(model), logits(load_model(twin)))


def test_per_channel_conversion_equals_its_dense_twin(src, tmp_path):
    """`fp8 convert --per-channel`: one float32 scale per output row ([N, 1] weight_scale_inv, no
    block size in the config), codes by `quantize_per_channel`; loads to its dense twin's logits."""
    fp8 = tmp_path / "fp8"
    report = convert_fp8(src, fp8, per_channel=True)
    assert "per-channel" in report.line() and len(report.quantized) == 2 * 7
    assert "weight_block_size" not in json.loads((fp8 / "config.json").read_text())["quantization_config"]
    tensors = load_file(str(fp8 / "model.safetensors"))
    name = report.quantized[0].removesuffix(".weight")
    assert tensors[name + ".weight_scale_inv"].shape == (tensors[name + ".weight"].shape[0], 1)
    twin = write_dense_twin(fp8, tmp_path / "dense",
                            lambda n, ts: (ts[n].float() * ts[n.removesuffix("weight") + "weight_scale_inv"]))
    assert torch.equal(logits(load_model(fp8)), logits(load_model(twin)))


def test_converted_lm_head_is_fp8_too(src, tmp_path):
    convert_fp8(src, tmp_path / "fp8", lm_head=True)
    model = load_model(tmp_path / "fp8")
    assert isinstance(model.lm_head, FP8Linear) and model.lm_head.activation is Activation.DYNAMIC


def test_handwritten_blockwise_layout_equals_its_dense_twin(src, tmp_path):
    fp8 = rewrite(src, tmp_path / "fp8", BLOCKWISE, handwritten_blockwise)
    twin = write_dense_twin(fp8, tmp_path / "dense",
                            lambda n, ts: block_dequant(ts[n], ts[n.removesuffix("weight") + "weight_scale_inv"]))
    assert torch.equal(logits(load_model(fp8)), logits(load_model(twin)))


def per_channel(name: str, w: torch.Tensor) -> dict:
    scale = w.abs().amax(1, keepdim=True) / 448  # [N, 1]
    return {name: (w / scale).to(E4M3), name.removesuffix("weight") + "weight_scale": scale}


def per_tensor(name: str, w: torch.Tensor) -> dict:
    scale = w.abs().max() / 448
    return {name: (w / scale).to(E4M3), name.removesuffix("weight") + "weight_scale": scale.reshape(1)}


COMPRESSED = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
              "config_groups": {"group_0": {"targets": ["Linear"],
                                            "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                        "dynamic": False, "symmetric": True},
                                            "input_activations": {"num_bits": 8, "type": "float",
                                                                  "strategy": "token", "dynamic": True}}}}


@pytest.mark.parametrize("layout", ["compressed_tensors_fp8_dynamic", "w8a8_fp8_per_tensor"])
def test_per_channel_and_per_tensor_layouts_equal_their_dense_twins(src, tmp_path, layout):
    qc, quantize = (COMPRESSED, per_channel) if layout.startswith("compressed") else \
        ({"quant_method": "w8a8_fp8"}, per_tensor)
    fp8 = rewrite(src, tmp_path / "fp8", qc, quantize)
    twin = write_dense_twin(fp8, tmp_path / "dense",
                            lambda n, ts: ts[n].float() * ts[n.removesuffix("weight") + "weight_scale"].reshape(-1, 1))
    model = load_model(fp8)
    assert model.layers[1].mlp.down_proj.activation is Activation.DYNAMIC
    assert torch.equal(logits(model), logits(load_model(twin)))


def test_hybrid_checkpoint_converts_and_equals_its_dense_twin(tmp_path):
    src = write_random_hybrid(tmp_path / "src", tiny_hybrid_config())
    convert_fp8(src, tmp_path / "fp8")
    twin = write_dense_twin(tmp_path / "fp8", tmp_path / "dense",
                            lambda n, ts: block_dequant(ts[n], ts[n.removesuffix("weight") + "weight_scale_inv"]))
    model = load_model(tmp_path / "fp8")
    assert sum(isinstance(m, FP8Linear) for m in model.modules()) >= 4
    assert torch.equal(logits(model), logits(load_model(twin)))


def corrupt(fp8: Path, edit) -> None:
    tensors = load_file(str(fp8 / "model.safetensors"))
    config = json.loads((fp8 / "config.json").read_text())
    edit(tensors, config)
    save_file(tensors, str(fp8 / "model.safetensors"))
    (fp8 / "config.json").write_text(json.dumps(config))


SCALE = "model.layers.0.mlp.down_proj.weight_scale_inv"
CORRUPTIONS = {
    "wrong shape": (lambda ts, c: ts.__setitem__(SCALE, torch.ones(3, 3)), "has shape \\[3, 3\\]"),
    "non-finite": (lambda ts, c: ts[SCALE].__setitem__((0, 0), float("nan")), "non-finite"),
    "zero": (lambda ts, c: ts[SCALE].__setitem__((0, 0), 0.0), "non-positive"),
    "missing": (lambda ts, c: ts.pop(SCALE), "has no .*weight_scale_inv"),
    "orphan": (lambda ts, c: ts.__setitem__("model.norm.weight_scale_inv", torch.ones(1)), "no float8 weight"),
    "integer scale": (lambda ts, c: ts.__setitem__(SCALE, ts[SCALE].to(torch.int32)), "dtype torch.int32"),
    "method": (lambda ts, c: c["quantization_config"].__setitem__("quant_method", "gptq"), "quant_method 'gptq'"),
    "fmt": (lambda ts, c: c["quantization_config"].__setitem__("fmt", "e5m2"), "fmt 'e5m2'"),
    "block": (lambda ts, c: c["quantization_config"].__setitem__("weight_block_size", [128]), "weight_block_size"),
    "no config": (lambda ts, c: c.pop("quantization_config"), "no quantization_config"),
    "experts": (lambda ts, c: ts.__setitem__("model.layers.0.mlp.experts.0.up_proj.weight", ts[SCALE[:-10]].clone()),
                "MoE experts"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_malformed_fp8_checkpoints_are_one_line(src, tmp_path, case):
    fp8 = tmp_path / "fp8"
    convert_fp8(src, fp8)
    edit, message = CORRUPTIONS[case]
    corrupt(fp8, edit)
    with pytest.raises(CheckpointError, match=message) as err:
        load_model(fp8)
    assert "\n" not in str(err.value)


def test_convert_refuses_a_quantized_source_and_a_full_destination(src, tmp_path):
    convert_fp8(src, tmp_path / "fp8")
    with pytest.raises(CheckpointError, match="already quantized"):
        convert_fp8(tmp_path / "fp8", tmp_path / "again")
    with pytest.raises(CheckpointError, match="--force"):
        convert_fp8(src, tmp_path / "fp8")
    convert_fp8(src, tmp_path / "fp8", force=True)


def test_per_channel_quantization_error_bound():
    """One scale per row: each row's amax maps to +-448, every weight within e4m3's half-ulp."""
    from specpilot.models.fp8_checkpoint import quantize_per_channel

    g = torch.Generator().manual_seed(2)
    w = torch.randn(5, 300, generator=g) * torch.tensor([[1e-3], [1.0], [0.0], [30.0], [0.02]])
    codes, scale = quantize_per_channel(w)
    assert codes.dtype == E4M3 and scale.shape == (5, 1) and scale[2, 0] == 1.0
    assert torch.equal(codes[[0, 1, 3, 4]].float().abs().amax(1), torch.full((4,), 448.0))
    back = codes.float() * scale
    assert bool(((w - back).abs() <= torch.maximum(w.abs() * 2**-4, scale * 2**-10)).all())
