"""`specpilot generate --target DIR` on Gemma-3 and Gemma-4 checkpoints that transformers saved gives
transformers' greedy tokens, AR and speculative (a chain, a 16-node tree), with prompts and
outputs well past the sliding window."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.cli import main
from specpilot.models.loading import load_model, save_model
from specpilot.models.random_checkpoint import copy_tokenizer, tiny_config
from specpilot.models.transformer import Transformer
from tests.models.test_gemma import hf_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))"  # longer than the window of 8
SHAPES = {"ar": ["--drafter", "none"], "chain": ["--depth", "5", "--topk", "1"],
          "tree16": ["--depth", "4", "--topk", "4", "--tree-budget", "16"]}


def write_blockless_drafter(target_dir, out):
    """A one-layer dense drafter computing the target with every layer removed: its embeddings, final
    norm (as a plain scale) and head, the layer's attention and MLP zero. RMSNorm ignores Gemma's
    sqrt(C) embedding scale, so it drafts what the target's residual stream says before its layers
    add to it: tokens the target accepts often but not always."""
    target = load_model(target_dir)
    c = target.config
    drafter = Transformer(tiny_config(num_layers=1, tie_word_embeddings=c.tie_word_embeddings,
                                      rms_norm_eps=c.rms_norm_eps, eos_token_ids=c.eos_token_ids))
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name in ("embed_tokens.weight", "lm_head.weight"):
                p.copy_(target.get_parameter(name))
            elif name == "norm.weight":
                w = target.norm.weight
                p.copy_(1.0 + w if c.zero_centered_norms else w)
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.zero_()
    save_model(drafter, out, dtype=torch.float32)
    copy_tokenizer(out)
    return out


@pytest.mark.parametrize("variant", ["gemma3", "gemma4", "gemma4_shared"])
def test_generate_equals_transformers(tmp_path, variant, capsys):
    hf = hf_checkpoint(tmp_path / "target", variant, tie_word_embeddings=False)
    drafter = write_blockless_drafter(tmp_path / "target", tmp_path / "drafter")
    accepted = {}
    for name, argv in SHAPES.items():
        out = tmp_path / f"{name}.jsonl"
        args = ["generate", "--target", str(tmp_path / "target"), "--prompt", PROMPT, "--max-new-tokens", "24",
                "--device", "cpu", "--save-jsonl", str(out), "--json"]
        if name != "ar":
            args += ["--drafter", str(drafter)]
        capsys.readouterr()
        assert main(args + argv) in (0, None)
        report = json.loads(capsys.readouterr().out)
        record = json.loads(out.read_text().splitlines()[0])
        prompt = record["prompt_ids"]
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=0)
        assert record["output_ids"] == want[0, len(prompt):].tolist(), name
        accepted[name] = report["mean_accepted_length"]
    assert accepted["chain"] > 1 and accepted["tree16"] > 1.5  # drafts accepted: paths of several nodes committed


def test_a_gemma4_draft_model_drafts_for_itself(tmp_path, capsys):
    """A Gemma-4 draft model (global layers' K/V of another shape, so its draft cache is its own
    `new_cache`) drafting for the same model: transformers' tokens, every chain of 3 drafts accepted."""
    hf = hf_checkpoint(tmp_path / "m", "gemma4", tie_word_embeddings=False)
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(["generate", "--target", str(tmp_path / "m"), "--drafter", str(tmp_path / "m"), "--prompt", PROMPT,
                 "--max-new-tokens", "24", "--device", "cpu", "--depth", "3", "--topk", "1", "--save-jsonl", str(out),
                 "--json"]) in (0, None)
    report = json.loads(capsys.readouterr().out)
    record = json.loads(out.read_text().splitlines()[0])
    with torch.no_grad():
        want = hf.generate(torch.tensor([record["prompt_ids"]]), max_new_tokens=24, do_sample=False, eos_token_id=0)
    assert record["output_ids"] == want[0, len(record["prompt_ids"]):].tolist()
    assert report["mean_accepted_length"] == 4.0
