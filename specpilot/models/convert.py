"""`convert_checkpoint` (HF BF16 directory -> W12 directory) and `verify_checkpoint` (bit-compare).

Owns: which tensors are converted (every 2-D projection of the decoder layers; the embeddings and
lm_head on request), streaming a single-file or sharded source through the encoder one tensor at
a time, writing the destination atomically (a temporary sibling renamed at the end; an existing
non-empty destination is refused unless forced), and the reports (bits per weight per tensor and
for the model). Does not own the file format (`specpilot.w12.checkpoint`) or the codec
(`specpilot.w12.codec`).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specpilot.errors import CheckpointError
from specpilot.models.loading import safetensors_files
from specpilot.w12.checkpoint import (
    DEFAULT_SHARD_BYTES,
    EMBEDDINGS,
    MANIFEST,
    SHARD_PREFIX,
    STORAGE_LOAD,
    ShardWriter,
    is_w12_checkpoint,
    iter_w12_tensors,
    save_tensors,
)
from specpilot.w12.codec import decode, encode

PROJECTION = re.compile(r"^model\.(language_model\.)?layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj"
                        r"|linear_attn\.(in_proj_\w+|out_proj))\.weight$")
LM_HEAD = "lm_head.weight"
INDEX = "model.safetensors.index.json"
KEPT_FILE = "model.safetensors"


def should_convert(name: str, include_embeddings: bool, include_lm_head: bool) -> bool:
    if PROJECTION.match(name):
        return True
    return (include_embeddings and name == EMBEDDINGS) or (include_lm_head and name == LM_HEAD)


@dataclass(frozen=True)
class TensorReport:
    name: str
    shape: tuple[int, int]  # (N, K)
    escapes: int
    nbytes: int  # W12 bytes: planes, bases, escape pointers and escapes
    mismatches: int = 0  # verify only: weights whose decoded bits differ from the source

    @property
    def weights(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.weights


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.3f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.3f} MB"


def _total_bits(tensors: tuple[TensorReport, ...]) -> float:
    weights = sum(t.weights for t in tensors)
    return 8.0 * sum(t.nbytes for t in tensors) / weights if weights else float("nan")


def _table(tensors: tuple[TensorReport, ...], with_mismatches: bool) -> list[str]:
    head = f"{'tensor':<52} {'shape':>13} {'escapes':>9} {'bits/w':>8}" + ("  mismatches" if with_mismatches else "")
    lines = [head]
    for t in tensors:
        line = f"{t.name:<52} {t.shape[0]:>6}x{t.shape[1]:<6} {t.escapes:>9} {t.bits_per_weight:>8.4f}"
        lines.append(line + (f"  {t.mismatches:>10}" if with_mismatches else ""))
    return lines


@dataclass(frozen=True)
class ConvertReport:
    src: str
    dst: str
    tensors: tuple[TensorReport, ...]  # converted
    kept: tuple[str, ...]  # left as they were
    seconds: float

    @property
    def bits_per_weight(self) -> float:
        """Over every converted weight: total W12 bytes * 8 / weights."""
        return _total_bits(self.tensors)

    def lines(self) -> list[str]:
        bf16, w12 = sum(t.weights for t in self.tensors) * 2, sum(t.nbytes for t in self.tensors)
        return _table(self.tensors, False) + [
            f"converted {len(self.tensors)} tensors ({_size(bf16)} as BF16 -> {_size(w12)} as W12), "
            f"{self.bits_per_weight:.4f} bits/weight; kept {len(self.kept)} tensors unchanged; {self.seconds:.1f} s",
        ]

    def to_dict(self) -> dict:
        return {**asdict(self), "bits_per_weight": self.bits_per_weight}


@dataclass(frozen=True)
class VerifyReport:
    tensors: tuple[TensorReport, ...]  # W12 tensors, with their mismatch counts
    kept_checked: int  # unconverted tensors compared bit for bit
    problems: tuple[str, ...]  # one line per mismatch, missing or extra tensor

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bits_per_weight(self) -> float:
        return _total_bits(self.tensors)

    def lines(self) -> list[str]:
        verdict = "OK: every tensor matches bit for bit" if self.ok else f"FAILED: {len(self.problems)} problem(s)"
        return _table(self.tensors, True) + list(self.problems) + [
            f"{len(self.tensors)} W12 tensors at {self.bits_per_weight:.4f} bits/weight, "
            f"{self.kept_checked} unconverted tensors compared; {verdict}",
        ]

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "bits_per_weight": self.bits_per_weight}


def _open(f: Path):
    try:
        return safe_open(str(f), framework="pt")
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{f}: unreadable safetensors file ({str(err).splitlines()[0]})") from None


def _get(handle, f: Path, name: str) -> torch.Tensor:
    try:
        return handle.get_tensor(name)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{f}: cannot read {name} ({str(err).splitlines()[0]})") from None


def _iter_source(path: Path, skip_w12: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) of every safetensors tensor of an HF directory, one at a time."""
    for f in safetensors_files(path):
        if skip_w12 and f.name.startswith(SHARD_PREFIX):
            continue
        handle = _open(f)
        for name in handle.keys():
            yield name, _get(handle, f, name)


class _Source:
    """Lazy name -> tensor access to an HF directory (single file or sharded)."""

    def __init__(self, path: Path):
        self.files = {}
        for f in safetensors_files(path):
            handle = _open(f)
            self.files.update({name: (f, handle) for name in handle.keys()})

    def names(self) -> set[str]:
        return set(self.files)

    def get(self, name: str) -> torch.Tensor | None:
        if name not in self.files:
            return None
        f, handle = self.files[name]
        return _get(handle, f, name)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of elements whose bit patterns differ (shapes and dtypes must already match)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.contiguous().view(as_int) != b.contiguous().view(as_int)).sum())


def _check_destination(src: Path, dst: Path, force: bool) -> None:
    s, d = src.resolve(), dst.resolve()
    if s == d or s.is_relative_to(d) or d.is_relative_to(s):
        raise CheckpointError(f"DST {dst} must be outside SRC {src} (and not contain it)")
    if dst.exists() and not force and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"DST {dst} exists and is not empty; pass --force to replace it")


def convert_checkpoint(src: str | Path, dst: str | Path, include_embeddings: bool = False,
                       include_lm_head: bool = False, force: bool = False, device: str | torch.device = "cpu",
                       shard_bytes: int = DEFAULT_SHARD_BYTES, storage: bool = False) -> ConvertReport:
    """Write a W12 copy of the HF BF16 model directory `src` to `dst` (a complete model directory).

    `storage`: every 2-D BF16 tensor is converted (any layout: a decoder, a drafter head) and the
    manifest says the directory loads decoded (`w12.checkpoint.is_storage_checkpoint`): W12 as a
    bit-exact, 25% smaller way to store BF16 weights, not as the runtime format."""
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise CheckpointError(f"SRC {src} is not a model directory (no config.json)")
    if is_w12_checkpoint(src):
        raise CheckpointError(f"SRC {src} is already a W12 checkpoint")
    _check_destination(src, dst, force)
    tmp = dst.parent / f".{dst.name}.w12-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for f in sorted(src.iterdir()):
            if f.is_file() and f.suffix != ".safetensors" and f.name not in (INDEX, MANIFEST):
                shutil.copy2(f, tmp / f.name)
        writer, kept, reports = ShardWriter(tmp, shard_bytes), {}, []
        for name, t in _iter_source(src):
            wanted = t.dim() == 2 and t.dtype == torch.bfloat16 if storage else \
                should_convert(name, include_embeddings, include_lm_head)
            if not wanted:
                kept[name] = t
                continue
            if t.dim() != 2 or t.dtype != torch.bfloat16:
                raise CheckpointError(
                    f"SRC tensor {name} is {t.dtype} {list(t.shape)}; W12 converts 2-D bfloat16 weights"
                )
            w = encode(t.to(device)).to("cpu")
            writer.add(name, w)
            reports.append(TensorReport(name, w.shape, w.num_escapes, w.nbytes_total))
        if kept:
            save_tensors(kept, tmp / KEPT_FILE, {"format": "pt"})
        writer.close({"source": str(src.resolve()), **({"load": STORAGE_LOAD} if storage else {})})
        if dst.exists():
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ConvertReport(str(src), str(dst), tuple(reports), tuple(sorted(kept)), time.perf_counter() - start)


def verify_checkpoint(src: str | Path, dst: str | Path) -> VerifyReport:
    """Decode every W12 tensor of `dst` and compare bit patterns with `src`; compare the rest too."""
    src, dst = Path(src), Path(dst)
    for p, role in ((src, "SRC"), (dst, "DST")):
        if not p.is_dir():
            raise CheckpointError(f"{role} {p} is not a directory")
    if not is_w12_checkpoint(dst):
        raise CheckpointError(f"DST {dst} is not a W12 checkpoint (no {MANIFEST})")
    source = _Source(src)
    problems, reports, seen = [], [], set()
    for name, w in iter_w12_tensors(dst):
        seen.add(name)
        ref = source.get(name)
        if ref is None:
            problems.append(f"{name}: in DST but not in SRC")
            continue
        if tuple(ref.shape) != w.shape or ref.dtype != torch.bfloat16:
            problems.append(f"{name}: SRC is {ref.dtype} {list(ref.shape)}, DST holds W12 {list(w.shape)}")
            continue
        bad = _same_bits(decode(w), ref)
        if bad:
            problems.append(f"{name}: {bad} weights decode to different bits than SRC")
        reports.append(TensorReport(name, w.shape, w.num_escapes, w.nbytes_total, bad))
    kept = 0
    for name, t in _iter_source(dst, skip_w12=True):
        seen.add(name)
        ref = source.get(name)
        if ref is None:
            problems.append(f"{name}: in DST but not in SRC")
        elif ref.shape != t.shape or ref.dtype != t.dtype or _same_bits(ref, t):
            problems.append(f"{name}: unconverted tensor differs from SRC")
        kept += 1
    problems += [f"{name}: in SRC but missing from DST" for name in sorted(source.names() - seen)]
    return VerifyReport(tuple(reports), kept, tuple(problems))
