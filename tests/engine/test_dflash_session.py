"""A DFlash drafter directory behind `--drafter DIR`, a deployment's `drafter = "path"`, and the
DFlash knobs of `System`."""

import json

import pytest
import torch

from specpilot.cli import main
from specpilot.config import Deployment, DrafterKind, System, TreeConstruction
from specpilot.engine.session import Session
from specpilot.errors import ConfigError
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import write_dflash
from specpilot.models.loading import load_model


@pytest.fixture(scope="module")
def dflash_dir(target_dir, tmp_path_factory):
    target = load_model(target_dir)
    out = tmp_path_factory.mktemp("dflash") / "d"
    return write_dflash(random_dflash(target.config, num_layers=1, block_size=6, mask_token_id=3), out,
                        dtype=torch.float32)


def test_cli_drafter_dir_drafts_with_dflash(capsys, target_dir, dflash_dir):
    code = main(["generate", "--target", str(target_dir), "--drafter", str(dflash_dir), "--prompt", "def f(x):",
                 "--prompt", "Q: 1+1", "--max-new-tokens", "20", "--tree-budget", "8", "--tree-construction",
                 "spine_first", "--json", "--compare-ar"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["knobs"]["drafter"] == "dflash" and report["knobs"]["block_size"] == 6
    assert report["knobs"]["tree_construction"] == "spine_first" and report["identical_to_ar"]


def test_deployment_with_dflash_path(target_dir, dflash_dir):
    dep = Deployment(name="d", target=str(target_dir), drafter=str(dflash_dir),
                     stock=System(drafter=DrafterKind.DFLASH, block_size=6, tree_budget=16))
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    assert session.dflash_model is not None and session.drafter_model is None
    prompts = [[5, 6, 7], [9] * 12]
    spec = session.generator(dep.stock).generate(prompts, 24).outputs
    ar = session.generator(dep.stock.with_changes(name="ar", drafter=DrafterKind.NONE)).generate(prompts, 24).outputs
    assert spec == ar
    with pytest.raises(ConfigError, match="drafts with a model"):
        session.generator(System())


def test_dflash_knobs():
    s = System.from_dict({"drafter": "dflash", "block_size": 8, "tree_construction": "chain"})
    assert s.tree_construction is TreeConstruction.CHAIN and s.knobs()["tree_construction"] == "chain"
    with pytest.raises(ConfigError, match="tree_construction"):
        System.from_dict({"tree_construction": "widest"})
    with pytest.raises(ConfigError, match="block_size"):
        System(block_size=1)
    # systems that leave the new knobs at their defaults keep the fingerprints they had before
    assert System().fingerprint() != System(block_size=8).fingerprint()
    assert System(name="x").fingerprint() == System().fingerprint()


def test_widened_deployment(target_dir, dflash_dir):
    """drafter_expand widens the DFlash drafter with the target; a width mismatch is one line."""
    from specpilot.errors import CheckpointError

    stock = System(drafter=DrafterKind.DFLASH, block_size=6, tree_budget=8)
    dep = Deployment(name="w", target=str(target_dir), drafter=str(dflash_dir), target_expand=2, drafter_expand=2,
                     stock=stock)
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    assert session.dflash_model.config.hidden_size == 128
    prompts = [[5, 6, 7, 8]]
    ar = session.generator(stock.with_changes(name="ar", drafter=DrafterKind.NONE)).generate(prompts, 16).outputs
    assert session.generator(stock).generate(prompts, 16).outputs == ar
    with pytest.raises(CheckpointError, match="hidden_size 64 != target hidden_size 128"):
        Session.load(Deployment(name="m", target=str(target_dir), drafter=str(dflash_dir), target_expand=2,
                                stock=stock), device="cpu", dtype=torch.float32)
