"""The shipped fixture: a small trained target + drafter pair inside the package.

Owns: where the fixture lives (`specpilot/data/fixture/{target,drafter}`, its training log and
held-out tokens), whether it is present, and resolving the checkpoint name `"fixture"` used by
deployment files and `--target` / `--drafter` to a model directory.

Does not own: training it (`tools/train_fixture.py`), loading or expanding models
(`loading.py`, `expand.py`), or what a deployment serves (`specpilot.config`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from specpilot.errors import CheckpointError

FIXTURE = "fixture"  # the checkpoint name that means "the shipped fixture"
ROLES = ("target", "drafter")
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
TRAINING_LOG = "training_log.json"
HELDOUT_TOKENS = "heldout.safetensors"  # held-out token windows per corpus source (int16)
# Feature-conditioned drafters trained for a fixture target, by name -> (directory, training tool).
SHIPPED_DRAFTERS = {
    "fixture-dflash": ("dflash", "tools/train_dflash.py"),
    "fixture-eagle3": ("eagle3", "tools/train_eagle3.py"),
    "fixture-hybrid-eagle3": ("hybrid_eagle3", "tools/train_hybrid.py"),
}
# Other shipped targets, by name -> (directory, training tool): the hybrid Gated DeltaNet fixture
# (Qwen3.5 layout, distilled from the fixture target, so the fixture's draft model drafts for it).
SHIPPED_TARGETS = {"fixture-hybrid": ("hybrid", "tools/train_hybrid.py")}


def fixture_root() -> Path:
    return Path(str(resources.files("specpilot") / "data" / "fixture"))


def fixture_path(role: str) -> Path:
    """The shipped checkpoint directory of `role` ("target" or "drafter")."""
    if role not in ROLES:
        raise ValueError(f"fixture role must be one of {ROLES}, got {role!r}")
    return fixture_root() / role


def missing_files(role: str) -> list[str]:
    d = fixture_path(role)
    return [f for f in CHECKPOINT_FILES if not (d / f).is_file()]


def fixture_available(role: str | None = None) -> bool:
    """True when the shipped checkpoint(s) are present (both roles when `role` is None)."""
    return all(not missing_files(r) for r in ((role,) if role else ROLES))


def resolve_checkpoint(spec: str, role: str) -> Path:
    """A model directory for a checkpoint spec: `"fixture"` is the shipped `role`, a name of
    `SHIPPED_DRAFTERS` / `SHIPPED_TARGETS` a shipped drafter / target, anything else a path.
    Raises a one-line `CheckpointError` when the directory is not there."""
    if spec in SHIPPED_DRAFTERS or spec in SHIPPED_TARGETS:
        sub, tool = {**SHIPPED_DRAFTERS, **SHIPPED_TARGETS}[spec]
        path = fixture_root() / sub
        missing = [f for f in ("config.json", "model.safetensors") if not (path / f).is_file()]
        if missing:
            raise CheckpointError(f"the shipped {spec} checkpoint is incomplete at {path} (missing "
                                  f"{', '.join(missing)}); train it with {tool} --out DIR and copy DIR/{sub} there")
        return path
    if spec == FIXTURE:
        missing = missing_files(role)
        if missing:
            raise CheckpointError(
                f"the shipped fixture {role} is incomplete at {fixture_path(role)} (missing "
                f"{', '.join(missing)}); train it with tools/train_fixture.py and unpack it with "
                "tools/fixture_pack.py, or name a model directory"
            )
        return fixture_path(role)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{role} checkpoint {spec!r} is not a directory (nor 'fixture')")
    return path


def training_log(root: Path | None = None) -> dict:
    """The JSON log the training run wrote next to the checkpoints (under `root` if given)."""
    file = (root or fixture_root()) / TRAINING_LOG
    if not file.is_file():
        raise CheckpointError(f"{file}: the fixture's training log is missing")
    return json.loads(file.read_text())


def heldout_tokens(root: Path | None = None) -> dict:
    """Held-out token streams per corpus source, {source: int64 tensor [T]}."""
    from safetensors.torch import load_file

    file = (root or fixture_root()) / HELDOUT_TOKENS
    if not file.is_file():
        raise CheckpointError(f"{file}: the fixture's held-out tokens are missing")
    return {name: t.long() for name, t in load_file(str(file)).items()}
