"""`specpilot generate --target DIR` on mixture-of-experts checkpoints that transformers saved
(Qwen3-MoE, Qwen3-Next with sparse layers) gives transformers' greedy tokens, AR and speculative (a
chain, a 16-node tree)."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.cli import main
from specpilot.models.random_checkpoint import write_mixerless_drafter, write_truncated_drafter
from tests.models.test_moe import hf_checkpoint

transformers = pytest.importorskip("transformers")

PROMPT = "def add(a, b):\n    return"
SHAPES = {"ar": ["--drafter", "none"], "chain": ["--depth", "5", "--topk", "1"],
          "tree16": ["--depth", "4", "--topk", "4", "--tree-budget", "16"]}


@pytest.mark.parametrize("variant", ["qwen3_moe", "qwen3_next_moe"])
def test_generate_equals_transformers(tmp_path, variant, capsys):
    hf = hf_checkpoint(tmp_path / "target", variant, sparse_scale=0.3)
    if variant == "qwen3_moe":  # its dense first layer (mlp_only_layers = [0]) with the embeddings and head
        drafter = write_truncated_drafter(tmp_path / "target", tmp_path / "drafter", num_layers=1)
    else:
        drafter = write_mixerless_drafter(tmp_path / "target", tmp_path / "drafter")
    for name, argv in SHAPES.items():
        out = tmp_path / f"{name}.jsonl"
        args = ["generate", "--target", str(tmp_path / "target"), "--prompt", PROMPT, "--max-new-tokens", "24",
                "--device", "cpu", "--save-jsonl", str(out)]
        if name != "ar":
            args += ["--drafter", str(drafter)]
        assert main(args + argv) in (0, None)
        record = json.loads(out.read_text().splitlines()[0])
        prompt = record["prompt_ids"]
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=0)
        assert record["output_ids"] == want[0, len(prompt):].tolist(), name
    capsys.readouterr()
