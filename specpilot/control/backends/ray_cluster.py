"""`RayBackend`: worker pairs as GPU-pinned Ray actors, so many candidates are timed at once.

Each session is one actor holding one GPU (arms alternate) or two (side by side); Ray sets the
actor's `CUDA_VISIBLE_DEVICES`, and inside the actor an ordinary `WorkerPair` starts the
two arms' worker processes and times whole paired blocks — the actor is the timer, so the
candidate's code still never shares a process with it, and timing never crosses the network.
The controller only sends plans and receives `BlockResult`s. Placement `auto` means alternate
here (one GPU per candidate: more candidates at once); ask for side-by-side explicitly.

`address` is passed to `ray.init` ("auto", "ray://host:10001", or None for a local instance); an
already initialized Ray is used as it is. Without GPUs in the cluster the arms run on CPU (tests).
Every node needs this package installed (or a `runtime_env` that ships it).

Ray is an optional extra (`pip install 'specpilot[ray]'`, i.e. `ray[default]>=2.9`).

Owns: the actor and the proxy that turns its tagged failures back into `ArmFailure`. Does not
own sessions or scheduling beyond "one actor per session".
"""

from __future__ import annotations

from typing import Sequence

from specpilot.control.backends.base import devices_per_session, resolve_placement
from specpilot.control.blocks import Arm
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.pair import ArmFailure, WorkerPair
from specpilot.control.arm import ArmSpec
from specpilot.control.worker import FailureKind, WorkerError
from specpilot.errors import ConfigError


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("the Ray backend needs Ray: pip install 'ray[default]>=2.9'") from None
    return ray


class PairActor:
    """Runs inside a Ray actor; failures come back as ("failure", arm, kind, message) tuples."""

    def __init__(self, devices: list[str]):
        self.devices = devices
        self.session = None

    def start(self, incumbent, candidate, config, placement, warmup):
        return self._call(lambda: setattr(self, "session", WorkerPair(
            incumbent, candidate, self.devices, config, placement, warmup)))

    def generate(self, arm, prompts, max_new_tokens, seeds=None):
        return self._call(lambda: self.session.generate(arm, prompts, max_new_tokens, seeds))

    def run_block(self, plan):
        return self._call(lambda: self.session.run_block(plan))

    def close(self):
        if self.session is not None:
            self.session.close()
            self.session = None

    def device_name(self) -> str:
        from specpilot.control.backends.local import device_name

        return device_name(self.devices[0])

    @staticmethod
    def _call(fn):
        try:
            return ("ok", fn())
        except ArmFailure as f:
            return ("failure", f.arm.value, f.kind.value, str(f))


def _unwrap(reply):
    tag, *rest = reply
    if tag == "ok":
        return rest[0]
    arm, kind, message = rest
    raise ArmFailure(Arm(arm), WorkerError(message, FailureKind(kind)))


class RaySession:
    def __init__(self, actor, ray):
        self._actor = actor
        self._ray = ray

    def generate(self, arm, prompts, max_new_tokens, seeds=None):
        return _unwrap(self._ray.get(self._actor.generate.remote(arm, [list(p) for p in prompts], max_new_tokens,
                                                                 seeds)))

    def run_block(self, plan):
        return _unwrap(self._ray.get(self._actor.run_block.remote(plan)))

    def close(self) -> None:
        try:
            self._ray.get(self._actor.close.remote())
        finally:
            self._ray.kill(self._actor)


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None = None, placement: Placement = Placement.AUTO, max_parallel: int = 8,
                 use_gpus: bool | None = None, runtime_env: dict | None = None):
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        self._ray = ray
        gpus = int(ray.cluster_resources().get("GPU", 0))
        self.use_gpus = gpus > 0 if use_gpus is None else use_gpus
        self.placement = Placement.ALTERNATE if placement is Placement.AUTO else resolve_placement(placement, 2)
        self.per_session = devices_per_session(self.placement)
        self.parallelism = max(1, max_parallel)

    def _actor(self):
        n = self.per_session
        devices = [f"cuda:{i}" for i in range(n)] if self.use_gpus else ["cpu"] * n
        cls = self._ray.remote(PairActor).options(num_gpus=n if self.use_gpus else 0, num_cpus=1)
        return cls.remote(devices)

    def open(self, incumbent: ArmSpec, candidate: ArmSpec, config: ControllerConfig,
             warmup: Sequence = ()) -> RaySession:
        actor = self._actor()
        try:
            _unwrap(self._ray.get(actor.start.remote(incumbent, candidate, config, self.placement,
                                                     [[list(p) for p in r] for r in warmup])))
        except BaseException:
            self._ray.kill(actor)
            raise
        return RaySession(actor, self._ray)

    def device_name(self) -> str:
        actor = self._actor()
        try:
            return self._ray.get(actor.device_name.remote())
        finally:
            self._ray.kill(actor)

    def close(self) -> None:
        pass
