"""convert / verify / load: a W12 directory is a complete model that loads to identical logits."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.errors import CheckpointError
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint
from specpilot.models.w12_linear import W12Linear
from specpilot.w12 import W12Weight
from specpilot.w12.checkpoint import MANIFEST, is_w12_checkpoint, read_w12_tensors
from specpilot.models.convert import convert_checkpoint, verify_checkpoint

PROJECTIONS_PER_LAYER = 7  # q, k, v, o, gate, up, down


@pytest.fixture(autouse=True)
def reference_forward(monkeypatch):
    """Exact CPU forward: W12Linear must not route to the Triton interpreter here."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("w12src") / "src"
    return write_random_checkpoint(out, tiny_config(), seed=3, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    config = tiny_config("llama", tie_word_embeddings=True)
    return write_random_checkpoint(tmp_path_factory.mktemp("w12tied") / "src", config, seed=4, dtype=torch.bfloat16)


def logits(path) -> torch.Tensor:
    model = load_model(path)
    tokens = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.forward_causal(tokens)


def test_convert_verify_and_load_give_identical_logits(bf16_dir, tmp_path):
    dst = tmp_path / "w12"
    report = convert_checkpoint(bf16_dir, dst)
    layers = tiny_config().num_layers
    assert len(report.tensors) == PROJECTIONS_PER_LAYER * layers
    assert "lm_head.weight" in report.kept and "model.embed_tokens.weight" in report.kept
    assert is_w12_checkpoint(dst) and not is_w12_checkpoint(bf16_dir)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors", MANIFEST):
        assert (dst / f).is_file()
    verified = verify_checkpoint(bf16_dir, dst)
    assert verified.ok and len(verified.tensors) == len(report.tensors) and verified.kept_checked == len(report.kept)
    assert verified.bits_per_weight == pytest.approx(report.bits_per_weight)
    model = load_model(dst)
    assert isinstance(model.layers[0].self_attn.qkv_proj, W12Linear)
    assert isinstance(model.layers[0].mlp.gate_up_proj, W12Linear)
    assert torch.equal(logits(dst), logits(bf16_dir))


def test_lm_head_and_embeddings_on_request(bf16_dir, tmp_path):
    dst = tmp_path / "w12"
    report = convert_checkpoint(bf16_dir, dst, include_embeddings=True, include_lm_head=True)
    names = {t.name for t in report.tensors}
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= names
    tensors = read_w12_tensors(dst)
    assert isinstance(tensors["lm_head.weight"], W12Weight)
    assert isinstance(tensors["model.embed_tokens.weight"], torch.Tensor)  # decoded at load
    assert verify_checkpoint(bf16_dir, dst).ok
    assert isinstance(load_model(dst).lm_head, W12Linear)
    assert torch.equal(logits(dst), logits(bf16_dir))


def test_tied_embeddings(tied_dir, tmp_path):
    dst = tmp_path / "w12"
    convert_checkpoint(tied_dir, dst, include_embeddings=True, include_lm_head=True)
    assert verify_checkpoint(tied_dir, dst).ok
    assert torch.equal(logits(dst), logits(tied_dir))


def shard(src, out):
    """Rewrite a single-file checkpoint as two shards with an index, as HF does for big models."""
    shutil.copytree(src, out)
    tensors = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in parts.items():
        save_file({n: tensors[n] for n in part}, str(out / file), metadata={"format": "pt"})
    weight_map = {n: file for file, part in parts.items() for n in part}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def test_sharded_source_and_several_w12_shards(bf16_dir, tmp_path):
    src = shard(bf16_dir, tmp_path / "sharded")
    dst = tmp_path / "w12"
    report = convert_checkpoint(src, dst, shard_bytes=20_000)
    assert len(list(dst.glob("w12-*.safetensors"))) > 2
    assert not (dst / "model.safetensors.index.json").exists()  # it would name shards DST lacks
    assert len(report.tensors) == PROJECTIONS_PER_LAYER * tiny_config().num_layers
    assert verify_checkpoint(src, dst).ok
    assert torch.equal(logits(dst), logits(bf16_dir))


def test_verify_reports_every_difference(bf16_dir, tmp_path):
    dst = tmp_path / "w12"
    convert_checkpoint(bf16_dir, dst)
    other = write_random_checkpoint(tmp_path / "other", tiny_config(), seed=9, dtype=torch.bfloat16)
    report = verify_checkpoint(other, dst)
    assert not report.ok
    assert all(t.mismatches > 0 for t in report.tensors)
    assert any("unconverted tensor differs" in p for p in report.problems)
    assert "FAILED" in report.lines()[-1]


def test_existing_destination_is_never_replaced_silently(bf16_dir, tmp_path):
    dst = tmp_path / "w12"
    dst.mkdir()
    (dst / "precious.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="--force"):
        convert_checkpoint(bf16_dir, dst)
    assert (dst / "precious.txt").read_text() == "keep me"
    convert_checkpoint(bf16_dir, dst, force=True)
    assert not (dst / "precious.txt").exists() and is_w12_checkpoint(dst)
    empty = tmp_path / "empty"
    empty.mkdir()
    convert_checkpoint(bf16_dir, empty)  # an empty directory is fine
    with pytest.raises(CheckpointError, match="outside SRC"):
        convert_checkpoint(bf16_dir, bf16_dir / "inside", force=True)
    with pytest.raises(CheckpointError, match="outside SRC"):
        convert_checkpoint(bf16_dir, bf16_dir.parent, force=True)
    assert not list(tmp_path.glob(".*w12-tmp*"))  # no temporary directories left behind


def test_bad_sources_are_one_line_errors(bf16_dir, tmp_path):
    f32 = write_random_checkpoint(tmp_path / "f32", tiny_config(), seed=1)  # float32 weights
    with pytest.raises(CheckpointError, match="bfloat16"):
        convert_checkpoint(f32, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match="config.json"):
        convert_checkpoint(tmp_path / "nowhere", tmp_path / "out")
    dst = tmp_path / "w12"
    convert_checkpoint(bf16_dir, dst)
    with pytest.raises(CheckpointError, match="already a W12"):
        convert_checkpoint(dst, tmp_path / "again")
    with pytest.raises(CheckpointError, match="not a W12 checkpoint"):
        verify_checkpoint(bf16_dir, bf16_dir)


def test_storage_conversion_loads_as_the_bf16_original(bf16_dir, tmp_path):
    """--storage: every 2-D BF16 tensor (embeddings included) in W12, loaded decoded: plain modules,
    identical tensors; a hybrid checkpoint too, through its own layout."""
    from specpilot.models.random_checkpoint import tiny_hybrid_config, write_random_hybrid
    from specpilot.w12.checkpoint import is_storage_checkpoint

    hybrid = write_random_hybrid(tmp_path / "hybrid", tiny_hybrid_config(), dtype=torch.bfloat16)
    for src in (bf16_dir, hybrid):
        dst = tmp_path / f"{src.name}-stored"
        report = convert_checkpoint(src, dst, storage=True)
        assert is_storage_checkpoint(dst) and not is_storage_checkpoint(src)
        assert any(t.name.endswith("embed_tokens.weight") for t in report.tensors)
        assert verify_checkpoint(src, dst).ok
        a, b = load_model(src, dtype=torch.bfloat16), load_model(dst, dtype=torch.bfloat16)
        assert not any(isinstance(m, W12Linear) for m in b.modules())
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
