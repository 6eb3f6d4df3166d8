"""Find benchmark texts inside training documents (verbatim, up to whitespace).

A benchmark text *occurs* in a document when its whitespace-normalised form (runs of whitespace
collapsed to one space) is a substring of the document's normalised form, so re-indented or
re-wrapped copies are caught too. The search is exact: a 64-bit hash of one 32-byte window of
each text (from its middle) is looked up among the hashes of every 32-byte window of the corpus,
computed with tensor ops (on the GPU when there is one: ~100 MB takes well under a second), and
every hash hit is confirmed by comparing bytes. The hash is a dot product of the window's bytes
with random multipliers below 2^31, so it never overflows int64 and is the same on every device. Texts shorter than the window are searched with
`bytes.find`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

WINDOW = 32  # bytes hashed per window
SEPARATOR = b"\x00"  # between documents; never inside a normalised text


def normalize(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Leak:
    document: int  # index into the documents searched
    benchmark: str  # set name
    text: int  # index of the text within its set


def window_hashes(data: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """h[i] = sum_k m[k] * data[i + k] for every full window (< 2^44: no overflow). data [N] int64."""
    K = multipliers.numel()
    M = data.numel() - K + 1
    h = torch.zeros(max(M, 0), dtype=torch.int64, device=data.device)
    for k in range(K):
        h += multipliers[k] * data[k : k + M]
    return h


def find_leaks(documents: list[str], texts: dict[str, list[str]], device: str | torch.device = "cpu") -> list[Leak]:
    """Every (document, benchmark text) pair where the text occurs in the document."""
    docs = [normalize(d).encode("utf-8") for d in documents]
    blob = SEPARATOR.join(docs)
    starts, pos = [], 0
    for d in docs:
        starts.append(pos)
        pos += len(d) + len(SEPARATOR)

    def doc_of(offset: int) -> int:
        return bisect.bisect_right(starts, offset) - 1

    flat = [(name, i, normalize(t).encode("utf-8")) for name, ts in texts.items() for i, t in enumerate(ts)]
    flat = [x for x in flat if x[2]]
    found: set[Leak] = set()

    for name, i, t in flat:  # short texts: plain search
        if len(t) >= WINDOW:
            continue
        at = blob.find(t)
        while at != -1:
            found.add(Leak(doc_of(at), name, i))
            at = blob.find(t, at + 1)

    long = [(name, i, t, (len(t) - WINDOW) // 2) for name, i, t in flat if len(t) >= WINDOW]
    if long and len(blob) >= WINDOW:
        gen = torch.Generator().manual_seed(0x5EED)
        mult = torch.randint(1, 2**31, (WINDOW,), generator=gen, dtype=torch.int64)
        keys = torch.stack([
            window_hashes(torch.tensor(list(t[o : o + WINDOW]), dtype=torch.int64), mult)[0] for _, _, t, o in long
        ])
        by_key: dict[int, list[int]] = {}
        for j, k in enumerate(keys.tolist()):
            by_key.setdefault(k, []).append(j)
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device).long()  # widen on the device
        h = window_hashes(data, mult.to(device))
        del data
        hits = torch.isin(h, keys.to(device)).nonzero().flatten()
        for p, k in zip(hits.tolist(), h[hits].tolist()):
            for j in by_key.get(k, ()):
                name, i, t, o = long[j]
                start = p - o
                if start >= 0 and blob[start : start + len(t)] == t:
                    found.add(Leak(doc_of(start), name, i))
    return sorted(found, key=lambda x: (x.document, x.benchmark, x.text))


def summarize(leaks: list[Leak], texts: dict[str, list[str]]) -> dict:
    """Per set: texts checked, texts found, documents containing them."""
    out = {}
    for name, ts in texts.items():
        mine = [x for x in leaks if x.benchmark == name]
        out[name] = {
            "texts_checked": len(ts),
            "texts_found": len({x.text for x in mine}),
            "documents_containing": len({x.document for x in mine}),
        }
    return out
