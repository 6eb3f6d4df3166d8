"""`specpilot fp8 convert` and FP8 targets through the real CLI: a converted directory and a
hand-written block-wise one decode with `generate --target FP8DIR` to the FP8 model's own greedy
AR tokens (AR, a chain, a 16-node tree), which are the tokens of the dense twin holding the
dequantized weights; bad input is one `error:` line with exit 2."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch

from specpilot.cli import fp8 as fp8_cli
from specpilot.cli import main
from specpilot.models.random_checkpoint import copy_tokenizer, tiny_config, write_random_checkpoint, \
    write_truncated_drafter
from tests.models.test_fp8_linear import BLOCKWISE, DIMS, block_dequant, handwritten_blockwise, rewrite, \
    write_dense_twin

PROMPT = "def add(a, b):\n    return"
SHAPES = {"ar": ["--drafter", "none"], "chain": ["--depth", "5", "--topk", "1"],
          "tree16": ["--depth", "4", "--topk", "4", "--tree-budget", "16"]}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8cli")
    src = write_random_checkpoint(root / "src", tiny_config(**DIMS))
    return root, src, write_truncated_drafter(src, root / "drafter")


def generate(target, out, argv, drafter=None) -> list[int]:
    args = ["generate", "--target", str(target), "--prompt", PROMPT, "--max-new-tokens", "24", "--device", "cpu",
            "--save-jsonl", str(out)]
    assert main(args + (["--drafter", str(drafter)] if drafter else []) + argv) in (0, None)
    return json.loads(out.read_text().splitlines()[0])["output_ids"]


def test_register_adds_convert():
    parser = argparse.ArgumentParser()
    fp8_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["fp8", "convert", "a", "b", "--lm-head", "--force"])
    assert args.func is fp8_cli.run_convert and args.lm_head and args.force and not args.per_channel
    assert parser.parse_args(["fp8", "convert", "a", "b", "--per-channel"]).per_channel


@pytest.mark.parametrize("made_by", ["fp8 convert", "hand-written"])
def test_generate_on_fp8_target_is_its_own_ar(dirs, tmp_path, capsys, made_by):
    root, src, drafter = dirs
    fp8 = tmp_path / "fp8"
    if made_by == "fp8 convert":
        assert main(["fp8", "convert", str(src), str(fp8)]) == 0
        assert "quantized 14 tensors" in capsys.readouterr().out
    else:
        rewrite(src, fp8, BLOCKWISE, handwritten_blockwise)
        copy_tokenizer(fp8)
    twin = write_dense_twin(fp8, tmp_path / "dense",
                            lambda n, ts: block_dequant(ts[n], ts[n.removesuffix("weight") + "weight_scale_inv"]))
    copy_tokenizer(twin)
    tokens = {name: generate(fp8, tmp_path / f"{name}.jsonl", argv, None if name == "ar" else drafter)
              for name, argv in SHAPES.items()}
    assert len(tokens["ar"]) == 24 and tokens["chain"] == tokens["ar"] and tokens["tree16"] == tokens["ar"]
    assert generate(twin, tmp_path / "twin.jsonl", SHAPES["ar"]) == tokens["ar"]
    capsys.readouterr()


def test_bad_fp8_input_is_one_error_line(dirs, tmp_path, capsys):
    root, src, _ = dirs
    fp8 = tmp_path / "fp8"
    assert main(["fp8", "convert", str(src), str(fp8)]) == 0
    assert main(["fp8", "convert", str(src), str(fp8)]) == 2  # DST not empty
    assert main(["fp8", "convert", str(fp8), str(tmp_path / "again")]) == 2  # already quantized
    config = json.loads((fp8 / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [64, 128]  # the scales were written for 128x128
    (fp8 / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["generate", "--target", str(fp8), "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu",
                 "--drafter", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "block 64x128" in err[0], err


def test_transformers_loads_the_blockwise_layout_to_the_same_logits(tmp_path):
    """transformers dequantizes FP8 on CPU (float32 codes x scales, then the load dtype): float32 logits
    are equal. Its CPU dequantizer derives the block from the scale grid (rows // scale rows), which is
    128 only where every dimension is a multiple of 128, so this model's are."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers' FP8 quantizer requires it
    from specpilot.models.loading import load_model

    src = write_random_checkpoint(tmp_path / "src", tiny_config(num_layers=2, hidden_size=256, intermediate_size=384,
                                                                num_heads=4, num_kv_heads=2, head_dim=64))
    fp8 = tmp_path / "fp8"
    assert main(["fp8", "convert", str(src), str(fp8)]) == 0
    tokens = torch.tensor([[5, 17, 300, 9, 4000, 2, 77, 1024]])
    hf = transformers.AutoModelForCausalLM.from_pretrained(fp8, dtype=torch.float32)
    with torch.no_grad():
        want = hf(tokens).logits
        got = load_model(fp8).forward_causal(tokens)
    assert torch.equal(got, want), (got - want).abs().max()
    shutil.rmtree(fp8)


def test_a_w12_stored_source_converts_to_the_same_fp8_directory(tmp_path, capsys):
    """A source stored in W12 (as the shipped fixture is) converts to the FP8 directory its BF16 original
    gives, without the W12 index (which would name shards the FP8 directory does not have)."""
    from safetensors.torch import load_file

    src = write_random_checkpoint(tmp_path / "bf16", tiny_config(**DIMS), dtype=torch.bfloat16)
    assert main(["w12", "convert", "--storage", str(src), str(tmp_path / "w12")]) in (0, None)
    for name in ("bf16", "w12"):
        assert main(["fp8", "convert", str(tmp_path / name), str(tmp_path / f"fp8-{name}")]) in (0, None)
    assert not (tmp_path / "fp8-w12" / "w12_index.json").exists()
    a, b = (load_file(tmp_path / f"fp8-{name}" / "model.safetensors") for name in ("bf16", "w12"))
    assert a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.float8_e4m3fn
                                                    else a[k], b[k].view(torch.uint8) if b[k].dtype ==
                                                    torch.float8_e4m3fn else b[k]) for k in a)
    assert generate(tmp_path / "fp8-w12", tmp_path / "out.jsonl", ["--drafter", "none"])
    capsys.readouterr()
