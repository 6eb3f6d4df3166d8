"""Loading HF directories: plain, sharded, and every way a checkpoint can be broken."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.errors import CheckpointError
from specpilot.models.loading import load_model


def logits(model, tokens):
    with torch.no_grad():
        return model.forward_causal(tokens)


def test_sharded_checkpoint_loads_identically(target_dir, tmp_path):
    tensors = load_file(str(target_dir / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    out = tmp_path / "sharded"
    out.mkdir()
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(out / fname))
        weight_map.update({k: fname for k in keys})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target_dir / f, out / f)
    x = torch.randint(0, 4096, (2, 9))
    assert torch.equal(logits(load_model(out), x), logits(load_model(target_dir), x))
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors named in the index is missing"):
        load_model(out)


def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_directory():
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model("/nonexistent/model")


def test_no_weights(target_dir, tmp_path):
    d = copy_ckpt(target_dir, tmp_path / "c")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors weights"):
        load_model(d)


def test_truncated_weights(target_dir, tmp_path):
    d = copy_ckpt(target_dir, tmp_path / "c")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="unreadable safetensors file"):
        load_model(d)


def test_missing_tensor_and_wrong_shape(target_dir, tmp_path):
    tensors = load_file(str(target_dir / "model.safetensors"))
    d = copy_ckpt(target_dir, tmp_path / "c")
    t = dict(tensors)
    t.pop("model.layers.1.mlp.up_proj.weight")
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tensor model.layers.1.mlp.up_proj.weight is missing"):
        load_model(d)
    t = dict(tensors)
    t["model.norm.weight"] = torch.ones(7)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model.norm.weight has shape \[7\], config implies \[64\]"):
        load_model(d)


def test_integer_weights_are_refused(target_dir, tmp_path):
    tensors = load_file(str(target_dir / "model.safetensors"))
    d = copy_ckpt(target_dir, tmp_path / "c")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="dtype torch.int32"):
        load_model(d)


def test_unsupported_architecture(target_dir, tmp_path):
    d = copy_ckpt(target_dir, tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(d)


def test_bf16_load_keeps_bits(target_dir):
    m = load_model(target_dir, dtype=torch.bfloat16)
    ref = load_file(str(target_dir / "model.safetensors"))["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(m.layers[0].self_attn.o_proj.weight, ref.to(torch.bfloat16))
