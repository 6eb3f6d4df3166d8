"""A deployment's `target_experts` (`engine.session.load_target`, `models.upcycle`): fixture-moe's
target is the fixture upcycled into 8 identical experts, 2 routed per token; AR and every drafter's
speculative decoding run on it (float32 CPU: speculative tokens equal its greedy AR exactly); the
field is validated, reads back, enters the fingerprints only when set and counts in the CPU memory
check; `generate` runs the deployment; a bad value is one `error:` line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specpilot.cli import main
from specpilot.config import ConfigError, Deployment, DrafterKind, load_deployment, load_system
from specpilot.engine.memory_check import weight_bytes
from specpilot.engine.session import Session
from specpilot.models.moe import MoETransformer

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ("def add(a, b):", "Question: what is 12 times 7?")


@pytest.fixture(scope="module")
def session():
    return Session.load(load_deployment("fixture-moe"), device="cpu", dtype=torch.float32)


def test_speculative_decoding_is_the_upcycled_targets_greedy_ar(session):
    dep = session.deployment
    assert isinstance(session.target, MoETransformer) and session.target.config.num_experts == 8
    prompts = [session.encode_prompt(t) for t in PROMPTS]
    ar = session.generator(load_system("ar", dep)).generate(prompts, 40).outputs
    chain = dep.stock.with_changes(name="chain", topk=1, tree_budget=5)
    systems = [dep.stock, chain, load_system(str(REPO / "scripts/systems/eagle3-d6k4n16.toml"), dep)]
    assert {s.drafter for s in systems} == {DrafterKind.MODEL, DrafterKind.EAGLE3}
    for system in systems:
        assert session.generator(system).generate(prompts, 40).outputs == ar, system.name


@pytest.mark.parametrize("value,says", [("16", "must be 'ExK'"), ("1x1", "2 <= E"), ("4x5", "1 <= k <= E"),
                                        ("axb", "must be 'ExK'")])
def test_target_experts_is_validated(value, says):
    with pytest.raises(ConfigError, match=says):
        Deployment(name="d", target="fixture", target_experts=value)


def test_target_experts_reads_back_and_enters_the_fingerprints_only_when_set(tmp_path):
    from specpilot.memory.fingerprint import DeploymentFingerprint

    dense = load_deployment("fixture")
    moe = replace(dense, target_experts="8x2")
    assert "target_experts" not in dense.fingerprint_fields() and moe.fingerprint_fields()["target_experts"] == "8x2"
    f = tmp_path / "moe.toml"
    f.write_text(moe.to_toml())
    assert replace(Deployment.from_toml(f), source="") == replace(moe, source="")
    fp = DeploymentFingerprint("d", (("config.json", "h"),), (), "none", (1, 1), "cpu")
    assert "target_experts" not in fp.to_dict()
    upcycled = replace(fp, target_experts="8x2")
    assert upcycled.digest != fp.digest and "target_experts 8x2 vs -" in upcycled.differences(fp)
    with pytest.raises(ConfigError, match="target_format together"):
        replace(moe, target_format="fp8-block")


def test_the_memory_check_counts_the_experts():
    dense, moe = load_deployment("fixture"), load_deployment("fixture-moe")
    # the dense target, then 8 copies of its MLPs beside it (the fixture's MLPs are most of its bytes)
    assert weight_bytes(moe, torch.float32) > weight_bytes(replace(dense, eagle3=moe.eagle3), torch.float32) * 3


def test_generate_runs_the_moe_deployment(capsys):
    code = main(["generate", "--deployment", "fixture-moe", "--prompt", PROMPTS[0], "--max-new-tokens", "16",
                 "--device", "cpu", "--json", "--compare-ar"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["identical_to_ar"]


def test_a_bad_target_experts_is_one_error_line(tmp_path, capsys):
    dep = tmp_path / "dep.toml"
    dep.write_text('name = "bad"\ntarget = "fixture"\ndrafter = "none"\ntarget_experts = "8"\n')
    code = main(["generate", "--deployment", str(dep), "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "target_experts '8'" in err[0], err
