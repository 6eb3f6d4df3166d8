"""Training text that exists offline, never the benchmark prompts.

Sources: GSM8K *train* split (shipped in tools/data), MBPP tasks outside the 11-510 test range
(from the package's copy of the full MBPP file), Python source files and their docstrings found
on the machine (the interpreter's stdlib and site-packages), and plain English text files under
/usr/share/doc. Every source file is recorded with its size so a run documents its corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MBPP_TEST_RANGE = range(11, 511)  # task_id 11..510 is the MBPP test split

# Files whose text would leak benchmark prompts into training.
BANNED_NAME_PARTS = ("human_eval", "humaneval", "mbpp", "gsm8k", "math500", "mt_bench", "specpilot")


def format_gsm8k(question: str, answer: str | None = None) -> str:
    text = f"Question: {question.strip()}\nAnswer:"
    return text if answer is None else text + " " + answer.strip()


def format_mbpp(text: str, code: str | None = None) -> str:
    prompt = f'"""{text.strip()}"""\n'
    return prompt if code is None else prompt + code.replace("\r\n", "\n").replace("\t", "    ").strip() + "\n"


@dataclass
class Corpus:
    documents: list[str] = field(default_factory=list)
    sources: dict[str, dict] = field(default_factory=dict)

    def add(self, source: str, docs: list[str], files: int = 0) -> None:
        chars = sum(len(d) for d in docs)
        self.documents.extend(docs)
        entry = self.sources.setdefault(source, {"documents": 0, "chars": 0, "files": 0})
        entry["documents"] += len(docs)
        entry["chars"] += chars
        entry["files"] += files

    @property
    def chars(self) -> int:
        return sum(len(d) for d in self.documents)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for d in self.documents:
            h.update(d.encode("utf-8", "replace"))
        return h.hexdigest()[:16]


def gsm8k_train() -> list[str]:
    with gzip.open(ROOT / "tools/data/gsm8k_train.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    return [format_gsm8k(r["question"], r["answer"]) for r in rows]


def mbpp_train() -> list[str]:
    with gzip.open(ROOT / "specpilot/data/datasets/mbpp/mbpp.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    return [format_mbpp(r["text"], r["code"]) for r in rows if r["task_id"] not in MBPP_TEST_RANGE]


def python_files(max_bytes: int, seed: int) -> list[Path]:
    roots = {Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])}
    files = []
    for root in sorted(roots):
        for p in root.rglob("*.py"):
            s = str(p).lower()
            if any(b in s for b in BANNED_NAME_PARTS) or "/test" in s:
                continue
            try:
                if 200 < p.stat().st_size < 200_000:
                    files.append(p)
            except OSError:
                continue
    files.sort()
    random.Random(seed).shuffle(files)
    out, total = [], 0
    for p in files:
        if total >= max_bytes:
            break
        out.append(p)
        total += p.stat().st_size
    return out


def english_files(max_bytes: int) -> list[Path]:
    out, total = [], 0
    for p in sorted(Path("/usr/share/doc").rglob("*")):
        if total >= max_bytes:
            break
        try:
            if p.is_file() and p.suffix in ("", ".txt", ".md") and 500 < p.stat().st_size < 100_000:
                text = p.read_bytes()
                if text.isascii() and b"\x00" not in text:
                    out.append(p)
                    total += len(text)
        except OSError:
            continue
    return out


def read_text(files: list[Path]) -> list[str]:
    docs = []
    for p in files:
        try:
            docs.append(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return docs


def build_corpus(python_bytes: int = 60_000_000, english_bytes: int = 5_000_000, seed: int = 0) -> Corpus:
    corpus = Corpus()
    corpus.add("gsm8k_train", gsm8k_train())
    corpus.add("mbpp_train", mbpp_train())
    py = python_files(python_bytes, seed)
    corpus.add(f"python_source (python {sys.version_info.major}.{sys.version_info.minor})", read_text(py), len(py))
    en = english_files(english_bytes)
    corpus.add("usr_share_doc", read_text(en), len(en))
    return corpus
