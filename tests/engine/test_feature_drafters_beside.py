"""Deployments that load the DFlash drafter and the EAGLE-3 head beside the draft model
(`Deployment.dflash` / `.eagle3`), the shipped fixture drafters they name, and their dtypes."""

from pathlib import Path

import pytest
import torch

from specpilot.config import Deployment, DrafterKind, System, load_deployment, load_system
from specpilot.engine.session import Session
from specpilot.errors import CheckpointError, ConfigError
from specpilot.models import fixture
from specpilot.models.dflash_checkpoint import load_dflash
from specpilot.models.eagle3_checkpoint import load_eagle3
from specpilot.models.loading import load_model

REPO = Path(__file__).resolve().parents[2]


def test_shipped_drafter_names_resolve_and_carry_training_logs():
    for name, (sub, _) in fixture.SHIPPED_DRAFTERS.items():
        path = fixture.resolve_checkpoint(name, "drafter")
        assert path == fixture.fixture_root() / sub
        assert (path / "config.json").is_file() and (path / "training_log.json").is_file()


def test_missing_shipped_drafter_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(fixture, "fixture_root", lambda: tmp_path)
    with pytest.raises(CheckpointError, match="train it with tools/train_dflash.py"):
        fixture.resolve_checkpoint("fixture-dflash", "drafter")


def test_deployment_fields_resolve_paths_but_not_shipped_names(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text('name = "d"\ntarget = "fixture"\ndflash = "fixture-dflash"\neagle3 = "heads/e3"\n')
    dep = Deployment.from_toml(f)
    assert dep.dflash == "fixture-dflash"
    assert dep.eagle3 == str((tmp_path / "heads" / "e3").resolve())


def test_unset_fields_leave_fingerprints_alone():
    dep = load_deployment("fixture")
    assert "dflash" not in dep.fingerprint_fields() and "eagle3" not in dep.fingerprint_fields()
    assert load_deployment("fixture-x16-dflash").fingerprint_fields()["dflash"] == "fixture-dflash"


def test_drafters_load_in_the_targets_dtype():
    target = load_model(fixture.fixture_path("target"), dtype=torch.bfloat16)
    for load, name in ((load_dflash, "fixture-dflash"), (load_eagle3, "fixture-eagle3")):
        model = load(fixture.resolve_checkpoint(name, "drafter"), target, dtype=torch.bfloat16)
        assert model.fc.weight.dtype == torch.bfloat16, name
        assert model.rope_cos.dtype == torch.float32, name  # rotary tables stay float32, as the target's


def test_every_drafter_of_the_deployment_is_lossless():
    dep = load_deployment("fixture-dflash")
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = [session.encode_prompt(t) for t in ("def add(a, b):", "Question: what is 12 times 7?")]
    ar = session.generator(load_system("ar", dep)).generate(prompts, 40).outputs
    for spec in ("stock", *(str(REPO / "scripts/systems" / f) for f in ("ddtree-b32.toml", "model-d5k4n7.toml",
                                                                     "eagle3-d6k4n16.toml"))):
        system = load_system(spec, dep)
        result = session.generator(system).generate(prompts, 40)
        assert result.outputs == ar, spec
    kinds = {load_system(s, dep).drafter for s in ("stock", str(REPO / "scripts/systems/eagle3-d6k4n16.toml"))}
    assert kinds == {DrafterKind.DFLASH, DrafterKind.EAGLE3}


def test_a_drafter_kind_the_deployment_lacks_is_one_error():
    dep = Deployment(name="plain", target="fixture", drafter="fixture")
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    for kind in (DrafterKind.DFLASH, DrafterKind.EAGLE3):
        with pytest.raises(ConfigError, match=kind.value.replace("dflash", "DFlash").replace("eagle3", "EAGLE-3")):
            session.generator(System(drafter=kind))


def test_generate_takes_the_shipped_drafter_names(capsys):
    import json

    from specpilot.cli import main

    for name, kind in (("fixture-eagle3", "eagle3"), ("fixture-dflash", "dflash")):
        code = main(["generate", "--drafter", name, "--prompt", "def add(a, b):", "--max-new-tokens", "12",
                     "--device", "cpu", "--json", "--compare-ar"])
        out, err = capsys.readouterr()
        assert code == 0, err
        report = json.loads(out)
        assert report["knobs"]["drafter"] == kind and report["identical_to_ar"]
