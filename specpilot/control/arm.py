"""`ArmSpec`: what a worker process needs to build the runner of one arm, and import paths.

The runner contract, one for isolated and shared workers (the engine's `SessionRunner`
implements it; tests use fakes). `system` is a knob dict such as `ArmSpec.system`; an isolated
worker is only ever asked for its own spec's:

    runner = factory(spec)                      # factory named by spec.factory, "module:callable"
    runner.warm(system, prompts, max_new_tokens) -> None                   # untimed
    runner.run(system, prompts, max_new_tokens, stop_at_eos) -> {"outputs": [[..]], "timing": {..}}
    runner.run(system, prompts, max_new_tokens, stop_at_eos, seeds=[..])  # a sampled regime: a seed per prompt

"outputs" holds the ids generated per prompt; "timing" (as `engine.runner.run_regime` gives it)
is read from shared workers only.

A spec crosses the process boundary as JSON, so every field is plain data. This module is
imported inside worker processes (after a patch candidate's worktree is put first on sys.path),
so it imports nothing heavy.

Owns: `ArmSpec`, `load_object` ("module:attr" -> object, one clear error line). Does not own
starting processes (`worker.py`) or what a runner does.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import asdict, dataclass, field, replace

from specpilot.config import stable_knobs
from specpilot.errors import ConfigError

DEFAULT_RUNNER = "specpilot.engine.runner:SystemRunner"  # `SessionRunner` by its first name, kept: fingerprints hold it


@dataclass(frozen=True)
class ArmSpec:
    deployment: str  # deployment file path or shipped name
    system: dict = field(default_factory=dict)  # System knobs incl. "name"; missing knobs = the stock's
    device: str | None = None  # "cuda:0", "cpu"; set by the worker pair that places it
    workdir: str | None = None  # a git worktree to import code from (patch candidates), first on sys.path
    factory: str = DEFAULT_RUNNER  # "module:callable" building the runner from this spec

    def __post_init__(self):
        if not isinstance(self.system, dict):
            raise ConfigError("runner spec: system must be a dict of knobs")
        if ":" not in self.factory:
            raise ConfigError(f"runner factory {self.factory!r} must look like 'module:callable'")

    @property
    def name(self) -> str:
        return str(self.system.get("name", "unnamed"))

    def placed(self, device: str | None) -> "ArmSpec":
        return replace(self, device=device)

    def fingerprint(self) -> str:
        """Identity of what runs (deployment, knobs, code location, factory), device excluded; knobs
        added later at their defaults are left out (`config.stable_knobs`), so an arm keeps its
        identity, and the prompts and seeds the controller draws for it, when a knob is added."""
        d = asdict(self)
        d.pop("device")
        d["system"] = stable_knobs(d["system"])
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ArmSpec":
        return cls(**d)


def load_object(path: str, what: str = "object"):
    """Import "package.module:attr" and return the attribute; ConfigError with one line if missing."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{what} {path!r} must look like 'module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"{what} {path!r} cannot be imported: {err}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj
