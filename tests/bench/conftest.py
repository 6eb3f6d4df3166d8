"""Fixtures for the benchmark tests: a tiny deployment on the session's random checkpoints."""

from __future__ import annotations

import pytest

from specpilot.config import Deployment, System


@pytest.fixture(scope="module")
def tiny_deployment_toml(target_dir, drafter_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("deployment") / "tiny.toml"
    path.write_text(
        f'name = "tiny"\ntarget = "{target_dir}"\ndrafter = "{drafter_dir}"\n'
        "max_new_tokens = 6\nn_prompts = 2\n"
        "[stock]\ndepth = 3\ntopk = 2\ntree_budget = 4\n"
    )
    return path


@pytest.fixture(scope="module")
def tiny_deployment(tiny_deployment_toml) -> Deployment:
    return Deployment.from_toml(tiny_deployment_toml)


@pytest.fixture(scope="module")
def tiny_session(tiny_deployment):
    from specpilot.engine.session import Session

    return Session.load(tiny_deployment, device="cpu")


@pytest.fixture
def chain_system_toml(tmp_path):
    path = tmp_path / "chain.toml"
    path.write_text(System(name="chain", depth=3, topk=1, tree_budget=3).to_toml())
    return path
