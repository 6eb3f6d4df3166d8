"""An EAGLE-3 head directory behind `--drafter DIR`, a deployment's `drafter = "path"` (widened with
the target too), and `drafter = "eagle3"` systems."""

import json

import pytest
import torch

from specpilot.cli import main
from specpilot.config import Deployment, DrafterKind, System
from specpilot.engine.session import Session
from specpilot.errors import CheckpointError, ConfigError
from specpilot.models.eagle3 import random_eagle3
from specpilot.models.eagle3_checkpoint import write_eagle3
from specpilot.models.loading import load_model


@pytest.fixture(scope="module")
def eagle3_dir(target_dir, tmp_path_factory):
    target = load_model(target_dir)
    vocab = torch.randperm(4096, generator=torch.Generator().manual_seed(2))[:2000].sort().values
    out = tmp_path_factory.mktemp("eagle3") / "e"
    return write_eagle3(random_eagle3(target.config, draft_vocab=vocab, seed=5), out, dtype=torch.float32)


def test_cli_drafter_dir_drafts_with_eagle3(capsys, target_dir, eagle3_dir):
    code = main(["generate", "--target", str(target_dir), "--drafter", str(eagle3_dir), "--prompt", "def f(x):",
                 "--prompt", "Q: 1+1", "--max-new-tokens", "20", "--tree-budget", "12", "--json", "--compare-ar"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["system"] == "eagle3+tree_budget=12" and report["knobs"]["drafter"] == "eagle3"
    assert report["identical_to_ar"]


def test_deployment_with_eagle3_path_and_depth_tiers(target_dir, eagle3_dir):
    stock = System(drafter=DrafterKind.EAGLE3, depth=4, topk=3, tree_budget=10, adaptive_depth=(2, 6))
    dep = Deployment(name="e", target=str(target_dir), drafter=str(eagle3_dir), stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    assert session.eagle3_model is not None and session.drafter_model is None and session.dflash_model is None
    gen = session.generator(stock)
    assert sorted(gen.drafters) == [2, 4, 6] and gen.feature_layers == (1, 0, -1)
    prompts = [[5, 6, 7], [9] * 12, [4]]
    spec = gen.generate(prompts, 40).outputs
    ar = session.generator(stock.with_changes(name="ar", drafter=DrafterKind.NONE)).generate(prompts, 40).outputs
    assert spec == ar
    with pytest.raises(ConfigError, match="drafts with a model"):
        session.generator(System())


def test_eagle3_system_without_an_eagle3_head_is_one_error(target_dir, drafter_dir):
    dep = Deployment(name="m", target=str(target_dir), drafter=str(drafter_dir))
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    with pytest.raises(ConfigError, match="drafts with EAGLE-3 but deployment 'm' has drafter") as err:
        session.generator(System.from_dict({"drafter": "eagle3"}))
    assert "\n" not in str(err.value)


def test_widened_deployment(target_dir, eagle3_dir):
    """drafter_expand widens the head with the target; a width mismatch is one line."""
    stock = System(drafter=DrafterKind.EAGLE3, depth=3, topk=2, tree_budget=6)
    dep = Deployment(name="w", target=str(target_dir), drafter=str(eagle3_dir), target_expand=2, drafter_expand=2,
                     stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    assert session.eagle3_model.config.hidden_size == 128
    prompts = [[5, 6, 7, 8], [11] * 9]
    ar = session.generator(stock.with_changes(name="ar", drafter=DrafterKind.NONE)).generate(prompts, 16).outputs
    assert session.generator(stock).generate(prompts, 16).outputs == ar
    with pytest.raises(CheckpointError, match="target_hidden_size 64 != target hidden_size 128"):
        Session.load(Deployment(name="m", target=str(target_dir), drafter=str(eagle3_dir), target_expand=2,
                                stock=stock), device="cpu", dtype=torch.float32)
