"""The evaluation-backend interface and its registry by name.

A *backend* opens *worker pairs*: both arms of one comparison, started, built and warmed,
somewhere with the devices they need. The controller only ever talks to these two small
interfaces, so the same rule and statistics run on this machine or across a Ray cluster.

    Backend:      open(incumbent, candidate, config, warmup) -> PairSession;  device_name();  close()
                  plus `placement` (resolved: alternate / side-by-side) and `parallelism`
                  (how many sessions may run at once).
    PairSession:  generate(arm, prompts, max_new_tokens[, seeds]) -> outputs   (untimed, for the gate)
                  run_block(plan) -> BlockResult                      (timed by the session)
                  close()

Registered: "local" (`local.py`, default) and "ray" (`ray_cluster.py`, optional extra `ray`).

Owns: the interfaces, the registry and placement resolution. Does not own any implementation.
"""

from __future__ import annotations

import importlib
from typing import Protocol, Sequence

from specpilot.control.blocks import Arm, BlockPlan, BlockResult, Outputs
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.arm import ArmSpec
from specpilot.errors import ConfigError


class PairSession(Protocol):
    # `seeds` (one per prompt) is passed only under a sampled regime (`ControllerConfig.sampled`)
    def generate(self, arm: Arm, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 seeds: Sequence[int] | None = None) -> Outputs: ...

    def run_block(self, plan: BlockPlan) -> BlockResult: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    placement: Placement  # resolved: never AUTO
    parallelism: int  # sessions that may be open at once

    def open(self, incumbent: ArmSpec, candidate: ArmSpec, config: ControllerConfig,
             warmup: Sequence[Sequence[Sequence[int]]]) -> PairSession: ...

    def device_name(self) -> str: ...

    def close(self) -> None: ...


# name -> "module:class"; imported on demand so an optional backend costs nothing until used
BACKENDS = {
    "local": "specpilot.control.backends.local:LocalBackend",
    "ray": "specpilot.control.backends.ray_cluster:RayBackend",
}


def make_backend(name: str, **options) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"unknown evaluation backend {name!r} (known: {', '.join(BACKENDS)})")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**options)


def resolve_placement(placement: Placement, devices: int) -> Placement:
    """AUTO -> side by side with two or more devices, else alternate; check the count."""
    if placement is Placement.AUTO:
        return Placement.SIDE_BY_SIDE if devices >= 2 else Placement.ALTERNATE
    if placement is Placement.SIDE_BY_SIDE and devices < 2:
        raise ConfigError("side-by-side placement needs two devices")
    return placement


def devices_per_session(placement: Placement) -> int:
    return 2 if placement is Placement.SIDE_BY_SIDE else 1
