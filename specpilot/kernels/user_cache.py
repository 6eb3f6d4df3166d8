"""The user's cache of tuned tables: where tables tuned on this machine live, and for which versions.

A tuned table (`configs.tuned_table`) is the shipped one of the GPU (`kernels/tuned/<slug>.json`,
read-only inside an installed package) with the user cache over it:

    $SPECPILOT_HOME/kernels/<gpu slug>/<versions key>.json

The versions key names the software a timing holds for (torch, triton, specpilot, and a hash of
the kernels' sources), so a table tuned under other versions is never read: after an upgrade the
cache starts empty again and the shipped table applies. Every cache file also records its
versions, and one whose record differs from this process's is ignored wherever it lies. The loop's
kernel agent writes each candidate's table to `candidates/<id>.json` in the same folder (the
`kernel_table` knob names it); promoting the candidate merges it into the cache file. Beside them,
`searched/<versions key>.json` records the shapes the agent searched without a gain.

Owns: the versions and their key, the paths, reading and atomically writing the JSON documents,
and merging entries by key. Does not own what an entry means or which one wins at dispatch
(`configs.py`), or the search that produces them (`search.py`). Pure Python: no Triton, no torch
import (versions come from the installed distributions' metadata).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
from pathlib import Path

from specpilot import env

KERNELS_DIR = Path(__file__).resolve().parent
# The modules whose code the launched kernels run, or that decide how they launch: an edit to any
# of them can change a config's speed or its legality, so it starts a new cache.
KERNEL_SOURCES = ("configs.py", "dispatch.py", "escape_blocks.py", "gemm.py", "gemv.py", "launch.py", "tiles.py",
                  "tma.py", "w12_unpack.py", "workspace.py")
EntryKey = tuple[str, int, int, int]  # (format, M bucket, N, K)


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@functools.cache
def kernels_source_hash() -> str:
    """sha256 (12 hex digits) of KERNEL_SOURCES, in that order."""
    h = hashlib.sha256()
    for name in KERNEL_SOURCES:
        path = KERNELS_DIR / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return h.hexdigest()[:12]


@functools.cache
def versions() -> dict[str, str]:
    """The software a tuned timing holds for: {"torch", "triton", "specpilot", "kernels"}."""
    from specpilot import __version__

    return {"torch": _distribution_version("torch"), "triton": _distribution_version("triton"),
            "specpilot": __version__, "kernels": kernels_source_hash()}


def versions_key(v: dict[str, str] | None = None) -> str:
    """'torch2.5.1-triton3.1.0-specpilot0.1.0-<hash>': the cache file's name (without .json)."""
    v = v or versions()
    text = f"torch{v['torch']}-triton{v['triton']}-specpilot{v['specpilot']}-{v['kernels']}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def device_dir(slug: str) -> Path:
    return env.home() / "kernels" / slug


def cache_path(slug: str) -> Path:
    """The user cache of GPU `slug` for this process's versions."""
    return device_dir(slug) / f"{versions_key()}.json"


def candidate_path(slug: str, table_id: str) -> Path:
    """Where a candidate's table of id `table_id` lives (the kernel agent writes it)."""
    return device_dir(slug) / "candidates" / f"{versions_key()}" / f"{table_id}.json"


def searched_path(slug: str) -> Path:
    """The kernel agent's record, for this process's versions, of the shapes it searched in full
    without beating the choice they ran (`loop.agents.kernel`): not searched again with that choice."""
    return device_dir(slug) / "searched" / f"{versions_key()}.json"


def resolve(table: str, slug: str) -> Path:
    """The file a `kernel_table` knob names: a path (it has a '/' or ends in .json), else an id
    of `candidate_path`."""
    if "/" in table or table.endswith(".json"):
        return Path(table).expanduser()
    return candidate_path(slug, table)


def stamp(path: Path) -> tuple[int, int] | None:
    """(mtime ns, size) of `path`, None when absent: what memoised reads are keyed by, so that a
    rewritten file is read again."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def read_document(path: Path) -> dict | None:
    """The table document at `path` if it was written for this process's versions, else None
    (absent, or tuned under other software: ignored, not an error)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("versions") != versions():
        return None
    return doc


def write_document(path: Path, document: dict) -> Path:
    """Write `document` (with this process's versions) atomically: readers see the old file or
    the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**document, "versions": versions()}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def entry_key(entry: dict) -> EntryKey:
    return (entry["format"], entry["m"], entry["n"], entry["k"])


def merged_entries(base: list[dict], over: list[dict]) -> list[dict]:
    """The entries of `base` with those of `over` replacing any of the same key, sorted by key."""
    out = {entry_key(e): e for e in base}
    out.update({entry_key(e): e for e in over})
    return [out[k] for k in sorted(out)]


def promote(table: Path, slug: str) -> Path:
    """Merge the candidate table at `table` into the user cache of `slug` (its entries win);
    returns the cache file. A table of other versions merges nothing."""
    doc = read_document(table)
    path = cache_path(slug)
    cache = read_document(path) or {"device": doc.get("device") if doc else None, "entries": []}
    entries = merged_entries(cache["entries"], doc["entries"] if doc else [])
    return write_document(path, {**cache, "entries": entries, "written_by": "specpilot.kernels.user_cache.promote"})
