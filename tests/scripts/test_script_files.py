"""The system and deployment files the GPU scripts pass to `specpilot` still load: a knob renamed or
a rule added must not break a committed script's command line."""

from pathlib import Path

import pytest

from specpilot.config import load_deployment, load_system

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("path", sorted((SCRIPTS / "systems").glob("*.toml")), ids=lambda p: p.stem)
def test_each_system_file_loads_over_the_batch_deployments_stock(path):
    system = load_system(str(path), load_deployment("fixture-x16-batch"))
    assert system.name and system.plain_ar().speculative is False


@pytest.mark.parametrize("path", sorted((SCRIPTS / "deployments").glob("*.toml")), ids=lambda p: p.stem)
def test_each_deployment_file_loads(path):
    deployment = load_deployment(str(path))
    assert deployment.name == path.stem and deployment.regime.continuous
