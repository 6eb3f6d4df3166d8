"""The JSONL file of a system's outputs, consumed by the guard.

One JSON object per line: {"prompt_ids": [int, ...], "output_ids": [int, ...]} — the prompt's token
ids and the generated token ids (EOS included if one was emitted). Extra keys are allowed and
ignored. Files are written atomically (temp file + rename) and never overwrite an existing file
unless asked. Lines that are blank are skipped; line order is not significant to the guard, which
pairs candidate and stock records by prompt (`match_prompts`).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specpilot import env
from specpilot.errors import SpecPilotError


@dataclass(frozen=True)
class OutputRecord:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


def refuse_existing(path: str | Path, overwrite: bool = False) -> Path:
    """`path`, unless a file is there and `overwrite` is off: then one `SpecPilotError` line.
    `write_records`' rule, for a command to check before it does the work whose output it saves."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise SpecPilotError(f"{path}: already exists (pass --overwrite to replace it)")
    return path


def write_records(path: str | Path, records: list[OutputRecord], overwrite: bool = False) -> None:
    path = refuse_existing(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        for r in records:
            f.write(json.dumps({"prompt_ids": list(r.prompt_ids), "output_ids": list(r.output_ids)}) + "\n")
    os.chmod(tmp, env.umask_mode())  # mkstemp makes it 0600
    os.replace(tmp, path)


def read_records(path: str | Path, vocab_size: int | None = None) -> list[OutputRecord]:
    """Parse a JSONL outputs file; one clear error line for the first bad record."""
    path = Path(path)
    if not path.is_file():
        raise SpecPilotError(f"{path}: outputs file does not exist")
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompt, output = obj["prompt_ids"], obj["output_ids"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SpecPilotError(f"{path}:{n}: expected {{\"prompt_ids\": [...], \"output_ids\": [...]}}") from None
            for name, ids in (("prompt_ids", prompt), ("output_ids", output)):
                if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise SpecPilotError(f"{path}:{n}: {name} must be a list of integers")
                if vocab_size is not None and any(t < 0 or t >= vocab_size for t in ids):
                    raise SpecPilotError(f"{path}:{n}: {name} has ids outside the vocabulary (size {vocab_size})")
            if not prompt:
                raise SpecPilotError(f"{path}:{n}: prompt_ids is empty")
            records.append(OutputRecord(tuple(prompt), tuple(output)))
    if not records:
        raise SpecPilotError(f"{path}: no records")
    return records


def records_from_outputs(prompts: list[list[int]], outputs: list[list[int]]) -> list[OutputRecord]:
    """Records of one generation run (`GenerationResult.outputs` and the prompts that made them)."""
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} outputs")
    return [OutputRecord(tuple(p), tuple(o)) for p, o in zip(prompts, outputs)]


def match_prompts(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> tuple[list[int], list[int]] | None:
    """Indices (ia, ib) pairing a[ia[k]] with b[ib[k]] on equal prompts, or None when the two lists
    are not the same multiset of prompts. Pairs come in sorted-prompt order, so what is built on them
    (the bootstrap) does not depend on line order; repeated prompts pair in order of occurrence."""
    if len(a) != len(b):
        return None
    order_a = sorted(range(len(a)), key=lambda i: (a[i], i))
    order_b = sorted(range(len(b)), key=lambda i: (b[i], i))
    if any(a[i] != b[j] for i, j in zip(order_a, order_b)):
        return None
    return order_a, order_b
