"""What identifies a deployment in the memory, and how alike two deployments are.

A fingerprint is content, not names: the sha256 of every file of the target and draft models
(so a renamed or moved model is the same deployment and a re-trained one is not), the width
expansion, the target's format at load where set (an FP8 target is another target; unset, a
deployment keeps the digest it had before formats existed), the GPU's name, the serving regime
(its batch, and its sampling knobs where set: a greedy deployment keeps the digest it had before
sampling existed), the benchmark sets and token budget, and the software versions that change
kernels (specpilot, torch, CUDA, Python). Its `digest` hashes all of that except the deployment's
name; the git commit is deliberately not part of it (each commit would otherwise be a new
deployment) — it is stored with every evaluation instead.

Model files can be tens of GB; their hashes are cached (in the memory's `file_hashes` table)
under (absolute path, size, mtime_ns), so a file is read once until it changes.

`similarity` scores how much validated knowledge should transfer between deployments, in [0, 1]:
same target weights in the same format 4 (same architecture only, i.e. config.json, 1.5), same
drafter 2, same GPU 2, same regime 0.5, same token budget (`max_new_tokens`) 0.25, same benchmark
sets 0.25, same torch and specpilot versions 1 (one of them 0.5) — out of 10. A version
difference lowers the score and never blocks a transfer: the memory's consumers time whatever they
transfer. `differences` says in words what the score saw ("same target and drafter,
max_new_tokens 512 vs 256, specpilot 0.1.0 vs 0.1.1").

Owns: `DeploymentFingerprint`, `fingerprint_deployment`, `hash_model_dir`. Does not own storage.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from specpilot.errors import ConfigError

Files = tuple[tuple[str, str], ...]  # (path relative to the model directory, sha256)


class HashCache(Protocol):
    def cached_hash(self, path: str, size: int, mtime_ns: int) -> str | None: ...

    def store_hash(self, path: str, size: int, mtime_ns: int, sha256: str) -> None: ...


def file_sha256(path: Path, chunk: int = 1 << 23) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_model_dir(directory: str | Path, cache: HashCache | None = None) -> Files:
    """sha256 of every regular file under `directory` (hidden files skipped), sorted by path."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"model directory {str(root)!r} does not exist")
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        digest = cache.cached_hash(*key) if cache else None
        if digest is None:
            digest = file_sha256(path)
            if cache:
                cache.store_hash(*key, digest)
        out.append((rel, digest))
    return tuple(out)


@dataclass(frozen=True)
class DeploymentFingerprint:
    name: str
    target: Files
    drafter: Files  # () for prompt lookup or no drafter
    drafter_kind: str  # "model", "ngram" or "none"
    expand: tuple[int, int]  # (target, drafter) width expansion
    gpu: str
    regime: dict = field(default_factory=dict)
    max_new_tokens: int = 0
    sets: tuple[str, ...] = ()
    versions: dict = field(default_factory=dict)
    target_format: str = ""  # `config.TargetFormat` value; "" as stored
    target_experts: str = ""  # `Deployment.target_experts` ("ExK": upcycled at load); "" as stored

    @property
    def digest(self) -> str:
        d = self.to_dict()
        d.pop("name")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def similarity(self, other: "DeploymentFingerprint") -> float:
        score = 0.0
        if self._same_target(other):
            score += 4
        elif (config := _file(self.target, "config.json")) and config == _file(other.target, "config.json"):
            score += 1.5
        if (self.drafter_kind, self.drafter, self.expand[1]) == (other.drafter_kind, other.drafter, other.expand[1]):
            score += 2
        score += 2 * (self.gpu == other.gpu)
        score += 0.5 * (self.regime == other.regime)
        score += 0.25 * (self.max_new_tokens == other.max_new_tokens)
        score += 0.25 * (tuple(self.sets) == tuple(other.sets))
        score += 0.5 * (self.versions.get("torch") == other.versions.get("torch"))
        score += 0.5 * (self.versions.get("specpilot") == other.versions.get("specpilot"))
        return score / 10

    def differences(self, other: "DeploymentFingerprint") -> str:
        """What is alike and what differs, in words: `self`'s value first ('a vs b')."""
        same_target = self._same_target(other)
        same_drafter = (self.drafter_kind, self.drafter, self.expand[1]) == \
            (other.drafter_kind, other.drafter, other.expand[1])
        config = _file(self.target, "config.json")
        target = ("same target" if same_target else "same target architecture"
                  if config and config == _file(other.target, "config.json") else "another target")
        if same_target and same_drafter:
            parts = ["same target and drafter"]
        else:
            parts = [target, "same drafter" if same_drafter else "another drafter"]
        if self.target_format != other.target_format:
            parts.append(f"target_format {self.target_format or '-'} vs {other.target_format or '-'}")
        if self.target_experts != other.target_experts:
            parts.append(f"target_experts {self.target_experts or '-'} vs {other.target_experts or '-'}")
        if self.gpu != other.gpu:
            parts.append(f"{self.gpu} vs {other.gpu}")
        for key in sorted(set(self.regime) | set(other.regime)):
            if self.regime.get(key) != other.regime.get(key):
                parts.append(f"{key} {self.regime.get(key)} vs {other.regime.get(key)}")
        if self.max_new_tokens != other.max_new_tokens:
            parts.append(f"max_new_tokens {self.max_new_tokens} vs {other.max_new_tokens}")
        if tuple(self.sets) != tuple(other.sets):
            parts.append(f"sets {','.join(self.sets) or '-'} vs {','.join(other.sets) or '-'}")
        for key in ("specpilot", "torch", "cuda", "python"):
            if self.versions.get(key) != other.versions.get(key):
                parts.append(f"{key} {self.versions.get(key) or '-'} vs {other.versions.get(key) or '-'}")
        return ", ".join(parts)

    def _same_target(self, other: DeploymentFingerprint) -> bool:
        return (self.target, self.expand[0], self.target_format, self.target_experts) == \
            (other.target, other.expand[0], other.target_format, other.target_experts)

    def to_dict(self) -> dict:
        d = asdict(self)
        for later in ("target_format", "target_experts"):  # unset: the digest of a deployment from before them
            if not d[later]:
                del d[later]
        d["target"] = [list(x) for x in self.target]
        d["drafter"] = [list(x) for x in self.drafter]
        d["expand"] = list(self.expand)
        d["sets"] = list(self.sets)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DeploymentFingerprint":
        return cls(d["name"], tuple(tuple(x) for x in d["target"]), tuple(tuple(x) for x in d["drafter"]),
                   d["drafter_kind"], tuple(d["expand"]), d["gpu"], dict(d.get("regime", {})),
                   d.get("max_new_tokens", 0), tuple(d.get("sets", ())), dict(d.get("versions", {})),
                   d.get("target_format", ""), d.get("target_experts", ""))


def _file(files: Files, name: str) -> str | None:
    return next((h for rel, h in files if rel == name), None)


def software_versions() -> dict:
    import torch

    import specpilot

    return {"specpilot": specpilot.__version__, "torch": torch.__version__, "cuda": torch.version.cuda or "",
            "python": platform.python_version()}


def model_dir(name: str, role: str) -> Path:
    """A deployment's model name ("fixture" or a directory) as a directory."""
    if name == "fixture" or name.startswith("fixture-"):
        from specpilot.engine.session import resolve_model_dir  # the engine owns where fixtures live

        return Path(resolve_model_dir(name, role))
    path = Path(os.path.expanduser(name))
    if not path.is_dir():
        raise ConfigError(f"{role} model directory {name!r} does not exist")
    return path


def fingerprint_deployment(deployment, gpu: str, cache: HashCache | None = None,
                           versions: dict | None = None) -> DeploymentFingerprint:
    """Fingerprint a `config.Deployment` on the device named `gpu`."""
    target = hash_model_dir(model_dir(deployment.target, "target"), cache)
    kind = deployment.drafter if deployment.drafter in ("ngram", "none") else "model"
    drafter = hash_model_dir(model_dir(deployment.drafter, "drafter"), cache) if kind == "model" else ()
    for kind in ("dflash", "eagle3"):  # further drafters the systems may pick
        if getattr(deployment, kind):
            files = hash_model_dir(model_dir(getattr(deployment, kind), f"{kind} drafter"), cache)
            drafter = (*drafter, *((f"{kind}/{rel}", h) for rel, h in files))
    return DeploymentFingerprint(
        name=deployment.name, target=target, drafter=drafter, drafter_kind=kind,
        expand=(deployment.target_expand, deployment.drafter_expand), gpu=gpu,
        regime={"batch": deployment.regime.batch, **deployment.regime.sampling.set_knobs()},  # greedy: as before
        max_new_tokens=deployment.max_new_tokens,
        sets=tuple(deployment.sets), versions=versions if versions is not None else software_versions(),
        target_format=deployment.target_format.value, target_experts=deployment.target_experts,
    )
