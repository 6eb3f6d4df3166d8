"""Pack a trained fixture into a few transferable files, and unpack them into the package.

The GPU run can return at most 8 files of at most 16 MiB each, so `pack` writes the fixture
directory as one uncompressed, deterministic tar (sorted names, zero mtimes and owners) split
into 15 MiB parts, plus `fixture_manifest.json` with the SHA-256 of every part, of the whole tar
and of every file inside it. `unpack` checks all of them before and after extracting, refuses
paths that leave the destination, and prints what it installed.

    python tools/fixture_pack.py unpack DIR_WITH_PARTS            # -> specpilot/data/fixture
    python tools/fixture_pack.py unpack DIR --dest /some/where
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEST = ROOT / "specpilot" / "data" / "fixture"
PART_BYTES = 15 * 2**20
MANIFEST = "fixture_manifest.json"
PART_PREFIX = "fixture.tar.part"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_bytes(src: Path) -> tuple[bytes, dict[str, str]]:
    """A deterministic tar of `src`'s files (paths relative to it) and {path: sha256}."""
    buf = io.BytesIO()
    hashes = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(q for q in src.rglob("*") if q.is_file()):
            rel = p.relative_to(src).as_posix()
            data = p.read_bytes()
            hashes[rel] = sha256(data)
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), hashes


def pack(src: Path, out: Path, extra: dict | None = None) -> list[Path]:
    """Write the parts and the manifest of `src` into `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    data, hashes = tar_bytes(src)
    parts = []
    for i in range(0, max(len(data), 1), PART_BYTES):
        part = out / f"{PART_PREFIX}{i // PART_BYTES:03d}"
        part.write_bytes(data[i : i + PART_BYTES])
        parts.append(part)
    manifest = {
        "tar_sha256": sha256(data),
        "tar_bytes": len(data),
        "parts": {p.name: sha256(p.read_bytes()) for p in parts},
        "files": hashes,
        "file_bytes": {rel: (src / rel).stat().st_size for rel in hashes},
        **(extra or {}),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return parts + [out / MANIFEST]


def unpack(src: Path, dest: Path = DEFAULT_DEST) -> dict[str, int]:
    """Verify the parts in `src` and extract the fixture into `dest` (replacing its files)."""
    manifest = json.loads((src / MANIFEST).read_text())
    chunks = []
    for name, digest in sorted(manifest["parts"].items()):
        data = (src / name).read_bytes()
        if sha256(data) != digest:
            raise SystemExit(f"error: {src / name} is corrupt (sha256 mismatch)")
        chunks.append(data)
    data = b"".join(chunks)
    if sha256(data) != manifest["tar_sha256"]:
        raise SystemExit("error: the reassembled tar does not match the manifest")
    dest = dest.resolve()
    staging = dest.with_name(dest.name + ".unpacking").resolve()
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            target = (staging / member.name).resolve()
            if not member.isfile() or staging not in target.parents:
                raise SystemExit(f"error: refusing tar entry {member.name!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
    for rel, digest in manifest["files"].items():
        if sha256((staging / rel).read_bytes()) != digest:
            raise SystemExit(f"error: extracted {rel} does not match the manifest")
    for rel in manifest["files"]:  # replace only the fixture's own files
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging / rel), target)
    shutil.rmtree(staging)
    return {rel: (dest / rel).stat().st_size for rel in manifest["files"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    u = sub.add_parser("unpack", help="verify and extract packed parts into the package")
    u.add_argument("src", type=Path, help="directory holding fixture.tar.part* and fixture_manifest.json")
    u.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="fixture directory to write (default: the package's)")
    p = sub.add_parser("pack", help="pack a fixture directory into parts + manifest")
    p.add_argument("src", type=Path, help="fixture directory (target/, drafter/, training_log.json, ...)")
    p.add_argument("out", type=Path, help="directory to write the parts into")
    a = ap.parse_args(argv)
    if a.command == "unpack":
        status = json.loads((a.src / MANIFEST).read_text()).get("status", "ok")
        if status != "ok":
            print(f"WARNING: the training run ended with status {status!r}; see training_log.json", file=sys.stderr)
        sizes = unpack(a.src, a.dest)
        for rel, n in sorted(sizes.items()):
            print(f"{n / 1e6:9.3f} MB  {a.dest / rel}")
        total = sum(sizes.values())
        print(f"{total / 1e6:9.3f} MB  total ({'within' if total <= 40e6 else 'OVER'} the 40 MB fixture budget)")
    else:
        for f in pack(a.src, a.out):
            print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
