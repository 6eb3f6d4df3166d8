"""The training script's --smoke mode runs every stage on CPU and ships a loadable fixture.

Runs with fixed step counts (see conftest.SMOKE_ARGS) so the result does not depend on the
machine's speed; a second identical run must produce bit-identical checkpoints.
"""

from __future__ import annotations

import hashlib
import json

import fixture_pack
import pytest
import torch

LOGIT_BOUND = 2.0**-16  # float32 summation-order rounding, relative to the logit scale

pytestmark = pytest.mark.slow


def test_outputs_fit_the_transfer_limits(smoke_run):
    out = smoke_run.parent / "out"
    files = [p for p in out.iterdir() if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in files)


def test_log_records_the_run(smoke_run):
    log = json.loads((smoke_run / "training_log.json").read_text())
    assert log["status"] == "ok" and "checks_error" not in log
    assert log["decontamination"]["passed"]
    assert log["decontamination"]["removed_documents"].get("mbpp_train", 0) >= 1  # MBPP repeats test texts
    for stage, steps in (("target", 30), ("drafter", 20)):
        record = log["training"][stage]
        assert record["steps"] == steps and record["tokens_seen"] == steps * record["batch"] * record["seq_len"]
        losses = [p["loss"] for p in record["train_curve"]]
        assert all(0 < x < 20 for x in losses)
    target_curve = [p["loss"] for p in log["training"]["target"]["train_curve"]]
    assert target_curve[-1] < target_curve[0]  # it learns
    assert set(log["final_heldout"]["target"]) == set(log["corpus"]["sources"])
    assert log["corpus"]["fingerprint"] and log["tokenizer"]["fingerprint"]
    assert log["checks"]["acceptance_first_prompt_per_set"]["tree"]["mean_accepted_length"] >= 1.0


def test_checkpoints_load_and_generate(smoke_run):
    from specpilot.engine.drafters.draft_model import DraftModelDrafter
    from specpilot.engine.generator import Generator
    from specpilot.models.loading import load_model
    from specpilot.models.tokenizer import Tokenizer, check_same_vocabulary

    target, drafter = load_model(smoke_run / "target"), load_model(smoke_run / "drafter")
    tok = Tokenizer.from_dir(smoke_run / "target")
    check_same_vocabulary(tok, Tokenizer.from_dir(smoke_run / "drafter"))
    assert tok.eos_ids == (0,) and tok.decode([0]) == "<|endoftext|>"
    prompts = [tok.encode("Question: Tom has 3 apples and buys 2 more. How many now?\nAnswer:"),
               tok.encode('"""Write a function to add two numbers."""\n')]
    ar = Generator(target, eos_ids=tok.eos_ids, cuda_graphs=False).generate(prompts, 12)
    spec = Generator(target, {5: DraftModelDrafter(drafter, 5, 4, 7)}, eos_ids=tok.eos_ids, cuda_graphs=False)
    assert spec.generate(prompts, 12).outputs == ar.outputs  # float32 CPU: lossless exactly


def test_transformers_loads_the_checkpoints(smoke_run):
    transformers = pytest.importorskip("transformers")
    from specpilot.models.loading import load_model
    from specpilot.models.tokenizer import Tokenizer

    text = "def add(a, b):\n    return a + b  # Natalia sold 48 clips\n"
    for role in ("target", "drafter"):
        hf = transformers.AutoModelForCausalLM.from_pretrained(smoke_run / role, dtype=torch.float32).eval()
        ours = load_model(smoke_run / role)
        ids = Tokenizer.from_dir(smoke_run / role).encode(text)
        hf_tok = transformers.AutoTokenizer.from_pretrained(smoke_run / role)
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids
        tokens = torch.tensor([ids])
        with torch.no_grad():
            a, b = ours.forward_causal(tokens), hf(tokens).logits
        assert (a - b).abs().max() <= LOGIT_BOUND * a.abs().max()


def test_same_seed_same_checkpoints(smoke_run, smoke_runner, tmp_path):
    again = tmp_path / "again"
    fixture_pack.unpack(smoke_runner(tmp_path), again)
    for rel in ("target/model.safetensors", "drafter/model.safetensors", "target/tokenizer.json", "heldout.safetensors"):
        digest = [hashlib.sha256((d / rel).read_bytes()).hexdigest() for d in (smoke_run, again)]
        assert digest[0] == digest[1], rel
