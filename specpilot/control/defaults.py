"""Defaults that wire a deployment's systems to the controller.

    runner_spec(deployment, system) -> ArmSpec      a system as the spec an isolated worker loads
    default_config(deployment, **changes) -> ControllerConfig
    source_commit() -> str                               the running code's commit, for the record

Evaluating a candidate and recording it in the memory is `specpilot.memory.evaluate`.
"""

from __future__ import annotations

from specpilot.config import Deployment, System
from specpilot.control.config import ControllerConfig
from specpilot.control.arm import DEFAULT_RUNNER, ArmSpec


def source_commit() -> str:
    """git commit of the running code ('+dirty' when tracked files differ from it), or ''."""
    from specpilot.bench.provenance import git_state  # the project's one reader of git state

    state = git_state()
    return (state["git_commit"] or "") + ("+dirty" if state["git_dirty"] else "")


def runner_spec(deployment: str, system: System, runner: str = DEFAULT_RUNNER,
                workdir: str | None = None) -> ArmSpec:
    return ArmSpec(deployment, {"name": system.name, **system.knobs()}, workdir=workdir, factory=runner)


SERVING_REQUESTS_PER_SLOT = 2  # a continuous regime's timed request: this many prompts per slot


def request_size(deployment: Deployment) -> int:
    """Prompts per timed request: one batch of a static regime; under continuous batching
    `SERVING_REQUESTS_PER_SLOT` per slot, served closed-loop, so every timed request admits prompts
    while other rows decode (what segment admission and the shared budget act on), as the serving
    benchmark's units do."""
    batch = deployment.regime.batch
    return batch * SERVING_REQUESTS_PER_SLOT if deployment.regime.continuous else batch


def default_config(deployment: Deployment, **changes) -> ControllerConfig:
    """The defaults with the deployment's request size (`request_size`), token budget and whether its
    regime samples, then `changes` (field -> value)."""
    base = {"request_size": request_size(deployment), "max_new_tokens": deployment.max_new_tokens,
            "sampled": deployment.regime.sampled}
    base.update(changes)
    return ControllerConfig.from_dict(base)
