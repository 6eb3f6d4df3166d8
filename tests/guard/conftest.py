"""Shared CPU fixtures for the guard tests: random float32 checkpoints, one session, fixed prompts.

Generations are cached per system for the whole session, so each system decodes once.
"""

from __future__ import annotations

import pytest
import torch

from specpilot.config import Deployment, DrafterKind, System
from specpilot.guard.records import records_from_outputs
from specpilot.models.random_checkpoint import tiny_config, write_noisy_drafter, write_random_checkpoint

MAX_NEW = 40
AFTER = 8  # logit-bias fault starts at this generated index

SYSTEMS = {
    "ar": System(name="ar", drafter=DrafterKind.NONE),
    "tree": System(name="tree"),  # depth 5, topk 4, 7 draft nodes
    "chain": System(name="chain", depth=4, topk=1, tree_budget=4),
    "ar-bias": System(name="ar-bias", drafter=DrafterKind.NONE, fault=f"logit-bias:2:every=7:after={AFTER}"),
    "tree-bias": System(name="tree-bias", fault=f"logit-bias:2:every=7:after={AFTER}"),
    "tree-unverified": System(name="tree-unverified", fault="accept-unverified"),
    "ar-unverified": System(name="ar-unverified", drafter=DrafterKind.NONE, fault="accept-unverified"),
}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard_ckpt")
    target = write_random_checkpoint(root / "target", tiny_config(), seed=0)
    drafter = write_noisy_drafter(target, root / "noisy", noise=0.2, seed=1)
    return {"target": target, "drafter": drafter}


@pytest.fixture(scope="session")
def session(checkpoints):
    from specpilot.engine.session import Session

    dep = Deployment(name="guard-test", target=str(checkpoints["target"]), drafter=str(checkpoints["drafter"]))
    return Session.load(dep, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(3, 17, (24,), generator=g).tolist()
    return [torch.randint(1, 4096, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def records(session, prompts):
    """records(name) -> the system's OutputRecords on the shared prompts (decoded once)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            torch.set_num_threads(1)
            out = session.generator(SYSTEMS[name]).generate(prompts, MAX_NEW).outputs
            cache[name] = records_from_outputs(prompts, out)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def forced(session, records):
    """forced(name) -> the system's ForcingResult (chunk 512), computed once."""
    from specpilot.guard.forcing import force

    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = force(session.target, records(name))
        return cache[name]

    return get
