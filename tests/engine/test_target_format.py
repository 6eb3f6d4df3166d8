"""A deployment's `target_format` (`engine.session.load_target`): the target widened, then made FP8
by `specpilot fp8 convert`'s quantizer, is the session's only target. fixture-fp8's target is the
converted fixture tensor for tensor; AR, every drafter's speculative decoding and the profile's
byte count all run on it (float32 CPU: speculative tokens equal the FP8 target's greedy AR exactly);
the drafters keep their precision; the x16 FP8 deployments mirror their BF16 twins; a bad format,
or one asked of a target stored quantized, is one `error:` line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specpilot.cli import main
from specpilot.config import (
    Deployment,
    DrafterKind,
    TargetFormat,
    load_deployment,
    load_system,
)
from specpilot.engine.profile import streamed_bytes
from specpilot.engine.session import Session, load_target
from specpilot.models import fixture
from specpilot.models.expand import load_expanded
from specpilot.models.fp8_linear import FP8Linear
from specpilot.models.loading import load_model, save_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint
from tests.models.test_fp8_checkpoint import assert_same_model
from tests.models.test_fp8_linear import DIMS

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ("def add(a, b):", "Question: what is 12 times 7?")


def fp8_modules(model) -> list[FP8Linear]:
    return [m for m in model.modules() if isinstance(m, FP8Linear)]


def convert(src: Path, dst: Path, capsys) -> torch.nn.Module:
    assert main(["fp8", "convert", str(src), str(dst)]) == 0
    capsys.readouterr()
    return load_model(dst)


@pytest.fixture(scope="module")
def session():
    return Session.load(load_deployment("fixture-fp8"), device="cpu", dtype=torch.float32)


def test_the_fixture_fp8_target_is_the_converted_fixture(session, tmp_path, capsys):
    target = session.target
    assert len(fp8_modules(target)) == 4 * target.config.num_layers  # qkv, o, gate_up, down
    assert type(target.lm_head) is torch.nn.Linear  # kept, as convert keeps it
    assert_same_model(target, convert(fixture.fixture_path("target"), tmp_path / "fp8", capsys))
    for drafter in (session.drafter_model, session.eagle3_model, session.dflash_model):
        assert drafter is not None and not fp8_modules(drafter)


def test_width_expansion_comes_before_quantization(tmp_path, capsys):
    src = write_random_checkpoint(tmp_path / "src", tiny_config(**DIMS), dtype=torch.bfloat16)
    dep = Deployment(name="wide-fp8", target=str(src), drafter="none", target_expand=2, target_format="fp8-block")
    save_model(load_expanded(src, 2), tmp_path / "wide")  # exact in BF16: copies of w / 2
    assert_same_model(load_target(dep, "cpu", torch.float32), convert(tmp_path / "wide", tmp_path / "fp8", capsys))


def test_speculative_decoding_is_the_fp8_targets_greedy_ar(session):
    dep = session.deployment
    prompts = [session.encode_prompt(t) for t in PROMPTS]
    ar_gen = session.generator(load_system("ar", dep))
    assert fp8_modules(ar_gen.target)  # AR decodes with the FP8 target, not a BF16 copy
    ar = ar_gen.generate(prompts, 40).outputs
    chain = dep.stock.with_changes(name="chain", topk=1, tree_budget=5)
    systems = [dep.stock, chain] + [load_system(str(REPO / "scripts/systems" / f), dep)
                                    for f in ("eagle3-d6k4n16.toml", "ddtree-b32.toml")]
    assert {s.drafter for s in systems} == {DrafterKind.MODEL, DrafterKind.EAGLE3, DrafterKind.DFLASH}
    for system in systems:
        assert session.generator(system).generate(prompts, 40).outputs == ar, system.name
    stored = Session.load(replace(dep, target_format=TargetFormat.STORED), device="cpu", dtype=torch.float32)
    tokens = torch.tensor([prompts[0]])
    with torch.no_grad():  # the reference really is the FP8 model: its logits are not the BF16 fixture's
        assert not torch.equal(session.target.forward_causal(tokens), stored.target.forward_causal(tokens))


def test_the_profile_counts_the_fp8_bytes(session):
    stored = load_model(fixture.fixture_path("target"))
    gen = session.generator(session.deployment.stock)
    fp8 = fp8_modules(gen.target)
    codes = sum(m.weight_e4m3.numel() for m in fp8)
    scales = sum(m.weight_scale.numel() for m in fp8)
    assert streamed_bytes(gen.target) == streamed_bytes(stored) - 4 * codes + codes + 4 * scales


def test_generate_runs_the_fp8_deployment_and_target_loads_as_stored(capsys):
    code = main(["generate", "--deployment", "fixture-fp8", "--prompt", PROMPTS[0], "--max-new-tokens", "16",
                 "--device", "cpu", "--json", "--compare-ar"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["identical_to_ar"]
    import argparse

    from specpilot.cli.generate import deployment_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["generate", "--deployment", "fixture-x16-fp8", "--target", "fixture", "--prompt", "x"])
    dep = deployment_from_args(args)
    assert (dep.target_expand, dep.target_format) == (1, TargetFormat.STORED)  # --target: the directory as stored


@pytest.mark.parametrize("name,twin", [("fixture-x16-fp8", "fixture-x16-batch"), ("fixture-x16-fp8-b1", "fixture-x16"),
                                       ("fixture-fp8", "fixture")])
def test_the_fp8_deployments_are_their_bf16_twins_with_an_fp8_target(name, twin):
    dep, bf16 = load_deployment(name), load_deployment(twin)
    assert dep.target_format is TargetFormat.FP8_BLOCK and bf16.target_format is TargetFormat.STORED
    drafters = {"dflash": dep.dflash, "eagle3": dep.eagle3} if twin == "fixture" else {}  # fixture has none
    assert replace(dep, name=twin, target_format=TargetFormat.STORED, source="", **{k: "" for k in drafters}) == \
        replace(bf16, source="")
    assert dep.fingerprint_fields()["target_format"] == "fp8-block"


@pytest.mark.parametrize("case", ["unknown format", "stored quantized"])
def test_a_bad_target_format_is_one_error_line(tmp_path, capsys, case):
    if case == "unknown format":
        target, fmt, says = "fixture", "fp8-tensor", "target_format 'fp8-tensor' is not one of"
    else:
        src = write_random_checkpoint(tmp_path / "src", tiny_config(**DIMS))
        convert(src, tmp_path / "fp8", capsys)
        target, fmt, says = str(tmp_path / "fp8"), "fp8-channel", "stored quantized already"
    dep = tmp_path / "dep.toml"
    dep.write_text(f'name = "bad"\ntarget = "{target}"\ndrafter = "none"\ntarget_format = "{fmt}"\n')
    code = main(["generate", "--deployment", str(dep), "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


@pytest.mark.parametrize("case", ["stock", "system file", "flag on a stored FP8 checkpoint"])
def test_w12_on_an_fp8_target_is_one_error_line(tmp_path, capsys, case):
    """W12 encodes BF16 weights: on an FP8 target it would leave the FP8 projections as they were
    (the swap only takes `nn.Linear`s) and run something other than the system says."""
    target, fmt, extra, stock = "fixture", 'target_format = "fp8-block"\n', [], ""
    if case == "stock":
        stock = '[stock]\nkernel = "triton"\nw12 = true\n'
    elif case == "system file":
        (tmp_path / "w12.toml").write_text('kernel = "triton"\nw12 = true\n')
        extra = ["--system", str(tmp_path / "w12.toml")]
    else:
        src = write_random_checkpoint(tmp_path / "src", tiny_config(**DIMS))
        convert(src, tmp_path / "fp8", capsys)
        target, fmt, extra = str(tmp_path / "fp8"), "", ["--w12"]
    dep = tmp_path / "dep.toml"
    dep.write_text(f'name = "bad"\ntarget = "{target}"\ndrafter = "none"\n{fmt}{stock}')
    code = main(["generate", "--deployment", str(dep), "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu",
                 *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "w12 = true" in err[0], err
    assert "lossless format of BF16 weights" in err[0]
