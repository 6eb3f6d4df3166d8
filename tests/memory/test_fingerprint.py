"""The memory's deployment fingerprint tells an FP8 target from the same checkpoint as stored, and
keeps the digests of deployments without a target format as they were."""

from dataclasses import replace

from specpilot.config import TargetFormat, load_deployment
from specpilot.memory.fingerprint import DeploymentFingerprint, fingerprint_deployment


def test_an_fp8_target_is_another_target_in_the_memory():
    fp8 = load_deployment("fixture-fp8")
    stored = fingerprint_deployment(replace(fp8, target_format=TargetFormat.STORED), "cpu", versions={"torch": "x"})
    quantized = fingerprint_deployment(fp8, "cpu", versions={"torch": "x"})
    assert "target_format" not in stored.to_dict()  # the digest a deployment had before formats existed
    assert quantized.to_dict()["target_format"] == "fp8-block" and quantized.digest != stored.digest
    assert DeploymentFingerprint.from_dict(quantized.to_dict()) == quantized
    assert quantized.similarity(stored) < stored.similarity(stored)  # same weights, another target
    assert "target_format fp8-block vs -" in quantized.differences(stored)
    assert stored.differences(stored).startswith("same target and drafter")
