"""A training run's resumable state in its output directory: written atomically, in parts small
enough to come back from a device call.

    save(state, OUT / "checkpoint.pt")    # state: any torch-saveable dict (weights, optimizer, RNG ...)
    state = load(OUT / "checkpoint.pt")   # None when there is none

`checkpoint.pt` is a small manifest naming its parts (`checkpoint.pt.<stamp>.<i>`, each at most
PART_BYTES: the device tool returns files of at most 16 MiB) with their sizes and SHA-256. A save
writes new parts under a fresh stamp, then replaces the manifest by a rename, then deletes the parts
no manifest names: a call killed at any moment leaves the previous checkpoint whole (at worst beside
orphan parts, removed by the next save). What goes into the state, and when a run may continue
from it, is the training tool's business (`train_dflash.py --resume`).
"""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path

import torch

PART_BYTES = 15 * 2**20  # under the device tool's 16 MiB per returned file


def save(state: dict, path: Path) -> None:
    """Write `state` as the manifest `path` and its parts beside it, atomically (module docstring)."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(state, buf)
    blob = buf.getvalue()
    stamp = f"{time.time_ns():x}"
    parts = []
    for i, lo in enumerate(range(0, max(len(blob), 1), PART_BYTES)):
        chunk = blob[lo : lo + PART_BYTES]
        name = f"{path.name}.{stamp}.{i}"
        tmp = path.parent / f"{name}.tmp"
        tmp.write_bytes(chunk)
        tmp.replace(path.parent / name)
        parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    tmp = path.parent / f"{path.name}.tmp"
    torch.save({"format": "specpilot-checkpoint-1", "parts": parts}, tmp)
    tmp.replace(path)  # the commit point
    keep = {q["name"] for q in parts}
    for old in path.parent.glob(f"{path.name}.*"):
        if old.name not in keep:
            old.unlink(missing_ok=True)


def load(path: Path) -> dict | None:
    """The state `save` wrote to `path`, on the CPU; None when `path` does not exist. A part that is
    missing or not what the manifest says raises ValueError."""
    path = Path(path)
    if not path.is_file():
        return None
    manifest = torch.load(path, map_location="cpu", weights_only=True)
    chunks = []
    for q in manifest["parts"]:
        part = path.parent / q["name"]
        chunk = part.read_bytes() if part.is_file() else b""
        if len(chunk) != q["bytes"] or hashlib.sha256(chunk).hexdigest() != q["sha256"]:
            raise ValueError(f"{path}: part {q['name']} is missing or damaged (carry every {path.name}.* file)")
        chunks.append(chunk)
    return torch.load(io.BytesIO(b"".join(chunks)), map_location="cpu", weights_only=True)
