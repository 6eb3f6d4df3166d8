"""The shipped fixture: name resolution, deployment files, and (once shipped) the checkpoints.

Tests marked `needs_fixture` skip until specpilot/data/fixture holds the trained pair (trained on
a GPU by tools/train_fixture.py, installed by tools/fixture_pack.py unpack).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specpilot.config import BENCHMARK_SETS, load_deployment
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.errors import CheckpointError
from specpilot.models import fixture
from specpilot.models.expand import ModelSize, expanded_config, load_expanded
from specpilot.models.loading import load_model
from specpilot.models.tokenizer import Tokenizer, check_same_vocabulary

FIXTURE_BUDGET_BYTES = 56_000_000  # dense and hybrid targets, draft model, DFlash and EAGLE-3 drafters (W12-stored)
PACKAGE_BUDGET_BYTES = 60_000_000  # the installed package, fixture included
LOGIT_BOUND = 2.0**-16  # float32 rounding relative to the logit scale (see test_expand.py)
PROMPTS = [
    "Question: A baker makes 24 rolls and sells 9 of them. How many rolls are left?\nAnswer:",
    '"""Write a function to reverse the words in a sentence."""\n',
    "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Problem: What is the sum of the first ten positive integers?\nSolution:",
    "User: Give me three tips for writing clear emails.\nAssistant:",
]

needs_fixture = pytest.mark.skipif(
    not fixture.fixture_available(),
    reason="the shipped fixture is not in specpilot/data/fixture yet (train it on a GPU with "
    "tools/train_fixture.py, install it with tools/fixture_pack.py unpack)",
)


def test_missing_fixture_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fixture, "fixture_root", lambda: tmp_path)
    assert not fixture.fixture_available()
    with pytest.raises(CheckpointError, match="train it with tools/train_fixture.py"):
        fixture.resolve_checkpoint("fixture", "target")
    with pytest.raises(ValueError):
        fixture.fixture_path("teacher")


def test_paths_resolve_to_themselves(tmp_path):
    assert fixture.resolve_checkpoint(str(tmp_path), "drafter") == tmp_path
    with pytest.raises(CheckpointError, match="not a directory"):
        fixture.resolve_checkpoint(str(tmp_path / "nope"), "target")


def test_fixture_deployments():
    default = load_deployment(None)
    assert default.name == "fixture" and (default.target, default.drafter) == ("fixture", "fixture")
    assert (default.target_expand, default.drafter_expand, default.regime.batch) == (1, 1, 1)
    assert default.sets == BENCHMARK_SETS and (default.max_new_tokens, default.n_prompts) == (2048, 10)
    for name, batch in (("fixture-x16", 1), ("fixture-x16-batch", 8)):
        d = load_deployment(name)
        assert (d.target, d.drafter, d.target_expand, d.drafter_expand) == ("fixture", "fixture", 16, 4)
        assert d.regime.batch == batch
    for d in (default, load_deployment("fixture-x16")):  # SGLang's documented defaults
        assert (d.stock.depth, d.stock.topk, d.stock.tree_budget) == (5, 4, 7)


def test_the_13b_class_deployments():
    """fixture-x32: a 13B-class target (26.4 GB a step in bf16) with all three drafters; two
    isolated workers' weights fit an 80 GB GPU; stock is SGLang's DFLASH default, and its twin's
    the EAGLE-3 default."""
    from specpilot.engine.memory_check import weight_bytes
    from specpilot.models.config import ModelConfig
    from specpilot.models.expand import expanded_config

    dflash, eagle = load_deployment("fixture-x32"), load_deployment("fixture-x32-eagle3")
    for d in (dflash, eagle):
        assert (d.target_expand, d.drafter_expand, d.dflash, d.eagle3) == (32, 8, "fixture-dflash", "fixture-eagle3")
        assert 2 * weight_bytes(d, torch.bfloat16) < 70e9
    target = expanded_config(ModelConfig.from_dir(fixture.fixture_path("target")), 32)
    assert 13e9 < target.num_params < 13.5e9
    assert (dflash.stock.drafter.value, dflash.stock.block_size, dflash.stock.tree_construction.value,
            dflash.stock.tree_budget) == ("dflash", 16, "chain", 15)
    assert (eagle.stock.drafter.value, eagle.stock.depth, eagle.stock.topk, eagle.stock.tree_budget) == ("eagle3", 5, 4, 7)


# ---- the shipped checkpoints --------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    target = load_model(fixture.resolve_checkpoint("fixture", "target"))
    drafter = load_model(fixture.resolve_checkpoint("fixture", "drafter"))
    tok = Tokenizer.from_dir(fixture.fixture_path("target"))
    return target, drafter, tok


@needs_fixture
def test_shipped_pair_loads_and_decodes_losslessly(pair):
    target, drafter, tok = pair
    check_same_vocabulary(tok, Tokenizer.from_dir(fixture.fixture_path("drafter")))
    assert target.config.family == "qwen3" and target.config.qk_norm
    assert tok.eos_ids and tok.decode(list(tok.eos_ids)) == "<|endoftext|>"
    prompts = [tok.encode(p) for p in PROMPTS]
    ar = Generator(target, eos_ids=tok.eos_ids, cuda_graphs=False).generate(prompts, 32)
    assert all(len(o) > 0 for o in ar.outputs)
    for depth, topk, budget in ((5, 1, 5), (5, 4, 7)):
        spec = Generator(target, {depth: DraftModelDrafter(drafter, depth, topk, budget)},
                         eos_ids=tok.eos_ids, cuda_graphs=False)
        result = spec.generate(prompts, 32)
        assert result.outputs == ar.outputs  # float32 CPU: exact
        assert result.mean_accepted_length > 1.5  # a trained, distilled drafter is accepted often


@needs_fixture
def test_transformers_loads_the_shipped_pair(tmp_path):
    """The shipped checkpoints are stored in W12 (`w12 convert --storage`); decoded, each is an HF
    directory transformers loads, with our logits."""
    import json

    from safetensors.torch import save_file

    from specpilot.models.loading import read_hf_tensors
    from specpilot.w12.checkpoint import is_storage_checkpoint

    transformers = pytest.importorskip("transformers")
    for role in fixture.ROLES:
        shipped = fixture.fixture_path(role)
        assert is_storage_checkpoint(shipped)
        path = tmp_path / role
        path.mkdir()
        save_file({k: v.contiguous() for k, v in read_hf_tensors(shipped).items()}, str(path / "model.safetensors"),
                  metadata={"format": "pt"})
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (path / f).write_bytes((shipped / f).read_bytes())
        json.loads((path / "config.json").read_text())
        ours = load_model(shipped)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        hf_tok = transformers.AutoTokenizer.from_pretrained(path)
        ids = Tokenizer.from_dir(path).encode(PROMPTS[2])
        assert hf_tok(PROMPTS[2], add_special_tokens=False)["input_ids"] == ids
        tokens = torch.tensor([ids])
        with torch.no_grad():
            a, b = ours.forward_causal(tokens), hf(tokens).logits
        assert (a - b).abs().max() <= LOGIT_BOUND * a.abs().max()


@needs_fixture
def test_sizes_and_budget():
    files = [p for p in fixture.fixture_root().rglob("*") if p.is_file()]
    assert sum(p.lstat().st_size for p in files) <= FIXTURE_BUDGET_BYTES  # shared tokenizer files are links
    root = Path(fixture.__file__).parents[1]
    package = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.lstat().st_size for p in package) <= PACKAGE_BUDGET_BYTES
    from specpilot.models.config import ModelConfig

    target = ModelConfig.from_dir(fixture.fixture_path("target"))
    drafter = ModelConfig.from_dir(fixture.fixture_path("drafter"))
    assert 10e6 <= target.num_params <= 20e6 and target.num_layers >= 12
    assert 1e6 <= drafter.num_params <= 8e6
    assert expanded_config(target, 16).num_params >= 3e9
    assert ModelSize.of(expanded_config(target, 16)).decode_bytes() >= 6e9  # memory bound on an H200


@needs_fixture
def test_training_log():
    log = fixture.training_log()
    assert log["status"] == "ok"
    assert log["decontamination"]["passed"]
    for stage in ("target", "drafter"):
        assert log["training"][stage]["steps"] > 0 and log["training"][stage]["train_curve"]
    held = fixture.heldout_tokens()
    assert set(held) == set(log["final_heldout"]["target"])
    assert all(int(t.max()) < log["tokenizer"]["vocab_size"] for t in held.values())


@needs_fixture
def test_expanded_fixture_keeps_logits_and_tokens(pair):
    target, _, tok = pair
    wide = load_expanded(fixture.fixture_path("target"), 2)
    tokens = torch.tensor([tok.encode(PROMPTS[0])])
    with torch.no_grad():
        a, b = target.forward_causal(tokens), wide.forward_causal(tokens)
    assert (a - b).abs().max() <= LOGIT_BOUND * a.abs().max()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    want = Generator(target, eos_ids=tok.eos_ids, cuda_graphs=False).generate(prompts, 24).outputs
    assert Generator(wide, eos_ids=tok.eos_ids, cuda_graphs=False).generate(prompts, 24).outputs == want


needs_hybrid = pytest.mark.skipif(
    not (fixture.fixture_root() / "hybrid" / "config.json").is_file(),
    reason="the hybrid fixture is not in specpilot/data/fixture (train it with tools/train_hybrid.py)")


@needs_hybrid
def test_hybrid_fixture_drafts_losslessly_with_the_shared_draft_model_and_its_head():
    """The shipped hybrid (W12-stored, loaded decoded) with the dense fixture's draft model and its
    own EAGLE-3 head: AR's tokens, several per round (float32 CPU: exact)."""
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter
    from specpilot.models.eagle3_checkpoint import load_eagle3
    from specpilot.models.hybrid import HybridTransformer
    from specpilot.w12.checkpoint import is_storage_checkpoint

    path = fixture.resolve_checkpoint("fixture-hybrid", "target")
    assert is_storage_checkpoint(path)
    target = load_model(path)
    assert isinstance(target, HybridTransformer) and target.config.linear_layers == (0, 1, 2, 4, 5, 6)
    draft = load_model(fixture.fixture_path("drafter"))
    head = load_eagle3(fixture.resolve_checkpoint("fixture-hybrid-eagle3", "eagle3"), target)
    tok = Tokenizer.from_dir(path)
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    ar = Generator(target, eos_ids=tok.eos_ids, cuda_graphs=False).generate(prompts, 32)
    for drafter in (DraftModelDrafter(draft, 3, 1, 3), Eagle3Drafter(head, target, 6, 1, 6)):
        result = Generator(target, {drafter.depth: drafter}, eos_ids=tok.eos_ids, cuda_graphs=False).generate(prompts, 32)
        assert result.outputs == ar.outputs
        assert result.mean_accepted_length > 1.8
    log = __import__("json").loads((path / "training_log.json").read_text())
    assert log["status"] == "ok" and log["heldout"]["gsm8k_train"]["drafter_top1_agreement_with_hybrid"] > 0.5
