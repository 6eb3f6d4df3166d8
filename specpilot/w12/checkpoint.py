"""W12 tensors on disk: shard files, the manifest with format version and checksums, and reading
them back with every corruption reported as one clear `CheckpointError`.

A converted model directory holds, next to the copied config and tokenizer files (a manifest with
"load": "bf16" marks a directory stored in W12 for its size, whose tensors load decoded):

    model.safetensors        every tensor left unconverted (norms, and by default embeddings and
                             lm_head), readable by any safetensors loader
    w12-00001.safetensors    W12 planes, one safetensors entry per plane, named `<hf name>.<plane>`
    ...                      (planes: lo, hi, base, esc_ptr, esc_col, esc_val; see layout.py)
    w12_index.json           the manifest: {"format": "specpilot-w12", "version": 2, "tensors":
                             {hf name: {"file", "shape", "escapes", "crc32": {plane: crc}}},
                             "files": {file: {"bytes": size}}}

Reading checks, in order: manifest format and version; each shard's size (truncation); the
safetensors header and its format metadata; each plane's dtype and shape; each plane's CRC-32
(altered bytes); the W12 invariants the kernels rely on (`W12Weight.validate`). Only the current
format version is read: an older manifest or shard (version 1 had other planes) is refused with
a hint to convert the BF16 checkpoint again, since its bytes would decode to wrong weights.

Owns `is_w12_checkpoint` and `read_w12_tensors` (what `specpilot.models.loading` calls), the
streaming shard writer and reader. Does not own which tensors get converted or verification
against a source (`specpilot.models.convert`).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specpilot import env
from specpilot.errors import CheckpointError
from specpilot.w12.layout import FORMAT_VERSION
from specpilot.w12.weight import PLANES, W12Weight

MANIFEST = "w12_index.json"
FORMAT_NAME = "specpilot-w12"
SHARD_PREFIX = "w12-"
DEFAULT_SHARD_BYTES = 2 << 30
EMBEDDINGS = "model.embed_tokens.weight"
STORAGE_LOAD = "bf16"  # manifest "load": the directory stores BF16 weights in W12 and loads them decoded


def is_storage_checkpoint(path: str | Path) -> bool:
    """True for a W12 directory written for storage (`convert --storage`): its W12 tensors load
    decoded, as the BF16 tensors they encode, so it loads like the BF16 original."""
    return is_w12_checkpoint(path) and read_manifest(path).get("load") == STORAGE_LOAD


def is_w12_checkpoint(path: str | Path) -> bool:
    """True when `path` is a model directory holding W12 tensors (it has a W12 manifest)."""
    return (Path(path) / MANIFEST).is_file()


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """safetensors' `save_file`, the file then given the mode any new file of the user's gets
    (`umask_mode`): safetensors writes through a private temporary file (mode 0600)."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, env.umask_mode())


def crc32(t: torch.Tensor) -> int:
    """CRC-32 of a CPU tensor's bytes."""
    return zlib.crc32(memoryview(t.contiguous().numpy()).cast("B"))


class ShardWriter:
    """Writes W12 tensors into numbered shards of about `shard_bytes`, then the manifest; every
    file with the mode the user's umask gives a new file (`save_tensors`)."""

    def __init__(self, directory: Path, shard_bytes: int = DEFAULT_SHARD_BYTES):
        self.directory = directory
        self.shard_bytes = shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.tensors: dict[str, dict] = {}
        self.files: dict[str, dict] = {}

    def add(self, name: str, weight: W12Weight) -> None:
        weight = weight.to("cpu")
        file = f"{SHARD_PREFIX}{len(self.files) + 1:05d}.safetensors"
        planes = weight.planes()
        self.tensors[name] = {
            "file": file,
            "shape": list(weight.shape),
            "escapes": weight.num_escapes,
            "crc32": {plane: crc32(t) for plane, t in planes.items()},
        }
        self.pending.update({f"{name}.{plane}": t for plane, t in planes.items()})
        self.pending_bytes += weight.nbytes_total
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        file = f"{SHARD_PREFIX}{len(self.files) + 1:05d}.safetensors"
        path = self.directory / file
        save_tensors(self.pending, path, {"format": FORMAT_NAME, "version": str(FORMAT_VERSION)})
        self.files[file] = {"bytes": path.stat().st_size}
        self.pending, self.pending_bytes = {}, 0

    def close(self, extra: dict | None = None) -> dict:
        """Flush the last shard and write the manifest (last, so a partial write has none)."""
        self.flush()
        manifest = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **(extra or {}),
                    "tensors": self.tensors, "files": self.files}
        (self.directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest


def _version_error(file: Path, version) -> CheckpointError:
    """The error for a manifest or shard of another format version (`version` as stored)."""
    older = str(version).isdecimal() and 1 <= int(version) < FORMAT_VERSION
    if older:
        return CheckpointError(
            f"{file}: W12 format version {int(version)}, but this SpecPilot reads version {FORMAT_VERSION}; "
            f"convert the BF16 checkpoint again with `specpilot w12 convert`"
        )
    return CheckpointError(
        f"{file}: W12 format version {version!r} is not supported (this SpecPilot reads {FORMAT_VERSION})"
    )


def read_manifest(path: str | Path) -> dict:
    """The validated manifest of a W12 checkpoint directory."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not a W12 checkpoint (no {MANIFEST})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{file}: not valid JSON (altered or truncated)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{file}: not a {FORMAT_NAME} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise _version_error(file, manifest.get("version"))
    tensors, files = manifest.get("tensors"), manifest.get("files")
    if not isinstance(tensors, dict) or not isinstance(files, dict):
        raise CheckpointError(f"{file}: manifest lacks its 'tensors' or 'files' table")
    for name, entry in tensors.items():
        ok = (
            isinstance(entry, dict) and entry.get("file") in files
            and isinstance(entry.get("shape"), list) and len(entry["shape"]) == 2
            and isinstance(entry.get("crc32"), dict) and set(entry["crc32"]) == set(PLANES)
        )
        if not ok:
            raise CheckpointError(f"{file}: manifest entry of {name} is malformed")
    return manifest


def _open_shard(path: Path, expected_bytes: int):
    if not path.is_file():
        raise CheckpointError(f"{path}: W12 shard named in {MANIFEST} is missing")
    size = path.stat().st_size
    if size != expected_bytes:
        raise CheckpointError(
            f"{path}: W12 shard is {size} bytes, the manifest says {expected_bytes} (truncated or altered)"
        )
    try:
        handle = safe_open(str(path), framework="pt")
        metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: unreadable W12 shard ({str(err).splitlines()[0]})") from None
    if metadata.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path}: not a W12 shard (header metadata {metadata})")
    if metadata.get("version") != str(FORMAT_VERSION):
        raise _version_error(path, metadata.get("version"))
    return handle


def iter_w12_tensors(path: str | Path) -> Iterator[tuple[str, W12Weight]]:
    """(HF name, W12Weight) of every W12 tensor in the directory, one shard in memory at a time."""
    path = Path(path)
    manifest = read_manifest(path)
    by_file: dict[str, list[str]] = {}
    for name, entry in manifest["tensors"].items():
        by_file.setdefault(entry["file"], []).append(name)
    for file, names in by_file.items():
        handle = _open_shard(path / file, manifest["files"][file].get("bytes"))
        stored = set(handle.keys())
        for name in names:
            entry = manifest["tensors"][name]
            planes = {}
            for plane in PLANES:
                key = f"{name}.{plane}"
                if key not in stored:
                    raise CheckpointError(f"{path / file}: W12 plane {key} is missing")
                try:
                    planes[plane] = handle.get_tensor(key)
                except (SafetensorError, OSError, ValueError, RuntimeError) as err:
                    raise CheckpointError(f"{path / file}: cannot read {key} ({str(err).splitlines()[0]})") from None
                if crc32(planes[plane]) != entry["crc32"][plane]:
                    raise CheckpointError(f"{path / file}: {key} fails its CRC-32 check (file altered or corrupted)")
            where = f"{path / file}: {name}"
            try:
                weight = W12Weight.from_planes(tuple(entry["shape"]), planes)
            except ValueError as err:
                raise CheckpointError(f"{where}: {err}") from None
            weight.validate(where)
            yield name, weight


def read_w12_tensors(path: str | Path) -> dict[str, W12Weight | torch.Tensor]:
    """{HF name: W12Weight} of a W12 checkpoint, checksums verified.

    The token embedding, if it was converted, comes back decoded (a BF16 tensor): a lookup reads a
    few rows per step, so there is nothing to stream and W12 only saves disk space there.
    """
    from specpilot.w12.codec import decode

    out: dict[str, W12Weight | torch.Tensor] = {}
    for name, weight in iter_w12_tensors(path):
        out[name] = decode(weight) if name == EMBEDDINGS else weight
    return out
