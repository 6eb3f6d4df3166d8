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

A candidate's table travels with a memory export (`bundle`, `unbundle`): imported on another
machine it lands at the same place under that machine's home, where `resolve` finds it for the
knob that names it, by id or by the other home's path.

Owns: the versions and their key, the paths, reading and atomically writing the JSON documents,
merging entries by key, and carrying candidate tables between homes. Does not own what an entry
means or which one wins at dispatch (`configs.py`), or the search that produces them
(`search.py`). Pure Python: no Triton, no torch import (versions come from the installed
distributions' metadata).
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
    of `candidate_path`. A path to a candidate table in another home (another machine's, a
    `memory import`) that is absent here names the same file under this home, where there is one."""
    if "/" in table or table.endswith(".json"):
        path = Path(table).expanduser()
        where = None if path.exists() else candidate_parts(path)
        here = env.home() / "kernels" / Path(*where) if where else None
        return here if here is not None and here.exists() else path
    return candidate_path(slug, table)


def candidate_parts(path: Path) -> tuple[str, str, str, str] | None:
    """(gpu slug, "candidates", versions key, file name) of a candidate table's path under any
    home (`.../kernels/<slug>/candidates/<key>/<id>.json`), else None."""
    parts = Path(path).parts
    if len(parts) >= 5 and parts[-5] == "kernels" and parts[-3] == "candidates" and parts[-1].endswith(".json"):
        return parts[-4], "candidates", parts[-2], parts[-1]
    return None


_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def bundle(tables) -> list[dict]:
    """The candidate tables that `kernel_table` knobs name, as data to carry to another machine (a
    memory export): {"table": the knob, "path": slug/candidates/key/name, "document": the file's
    JSON}. An id names its file on every GPU and under every versions key found in this home; a
    path names its own file when that is a candidate table (under a home's kernels folder). Knobs
    naming nothing here, or a file elsewhere, are left out."""
    out, seen = [], set()
    for table in sorted(set(tables)):
        if not table:
            continue
        if "/" in table or table.endswith(".json"):
            path = resolve(table, "")
            found = [path] if path.is_file() and candidate_parts(path) else []
        else:
            found = sorted((env.home() / "kernels").glob(f"*/candidates/*/{table}.json"))
        for path in found:
            rel = "/".join(candidate_parts(path))
            try:
                document = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if (table, rel) not in seen:
                seen.add((table, rel))
                out.append({"table": table, "path": rel, "document": document})
    return out


def checked_bundle(items) -> list[tuple[Path, dict]]:
    """(where in this home, document) of each of `bundle`'s tables; ValueError for an item that is
    not a bundled table."""
    if not isinstance(items, list):
        raise ValueError("kernel_tables is not a list")
    checked = []
    for n, item in enumerate(items):
        rel = item.get("path") if isinstance(item, dict) else None
        parts = rel.split("/") if isinstance(rel, str) else []
        document = item.get("document") if isinstance(item, dict) else None
        if (len(parts) != 4 or parts[1] != "candidates" or not parts[3].endswith(".json")
                or not all(_SAFE.fullmatch(p) and p not in (".", "..") for p in parts)
                or not isinstance(document, dict) or not isinstance(document.get("entries"), list)):
            raise ValueError(f"kernel_tables[{n}] is not a bundled kernel table (a path slug/candidates/key/id.json "
                             "and a document with entries)")
        checked.append((env.home() / "kernels" / Path(*parts), document))
    return checked


def unbundle(checked: list[tuple[Path, dict]]) -> int:
    """Write `checked_bundle`'s tables into this home, each where it lay at its home (its versions
    record unchanged, so only a process of those versions reads it); a file already there is kept.
    Returns how many were written."""
    written = 0
    for path, document in checked:
        if not path.exists():
            _write_atomically(path, document)
            written += 1
    return written


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
    return _write_atomically(path, {**document, "versions": versions()})


def _write_atomically(path: Path, document: dict) -> Path:
    """`document` as JSON at `path` by a rename: readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
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
