"""Training text that exists offline, never the benchmark prompts, and the prompt formats.

Sources (each recorded with its document count, characters, files and a fingerprint):
- `gsm8k_train`: the GSM8K *train* split (shipped in tools/data);
- `mbpp_train`: MBPP tasks outside the 11-510 test range (from the package's full MBPP file);
- `python_source`: Python files on the machine (the interpreter's stdlib and site-packages, test
  directories excluded), i.e. code and its docstrings;
- `english_text`: plain English files: /usr/share/doc (plain and gzipped READMEs, NEWS,
  copyright notices; Debian changelogs skipped) and the package descriptions and Markdown/reST
  docs under site-packages, with repeated paragraphs (license bodies) kept once.
Files whose path names a benchmark are skipped; `tools/leakcheck.py` then drops any document
that still contains a benchmark prompt verbatim.

Prompt formats at benchmark time (the benchmark must use exactly these strings; the train splits
are rendered with the same templates so the fixture has seen each format):
| set       | prompt                                   | trained on                        |
|-----------|------------------------------------------|-----------------------------------|
| gsm8k     | "Question: {question}\\nAnswer:"          | GSM8K train, 60% of examples      |
| math500   | "Problem: {problem}\\nSolution:"          | GSM8K train, 25% of examples      |
| mt_bench  | "User: {first turn}\\nAssistant:"         | GSM8K train 15%, MBPP train 20%   |
| mbpp      | '\"\"\"{text}\"\"\"\\n'                  | MBPP train, 80% of tasks          |
| humaneval | the raw code prompt                      | Python sources                    |
Which template an example gets is drawn from a generator seeded by the run's seed.
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

# Template shares for the train splits (see the table above).
GSM8K_TEMPLATES = (("question", 0.60), ("problem", 0.25), ("chat", 0.15))
MBPP_TEMPLATES = (("docstring", 0.80), ("chat", 0.20))


# ---- prompt formats -----------------------------------------------------------------------
def format_gsm8k(question: str, answer: str | None = None) -> str:
    text = f"Question: {question.strip()}\nAnswer:"
    return text if answer is None else text + " " + answer.strip()


def format_math(problem: str, solution: str | None = None) -> str:
    text = f"Problem: {problem.strip()}\nSolution:"
    return text if solution is None else text + " " + solution.strip()


def format_chat(user: str, assistant: str | None = None) -> str:
    text = f"User: {user.strip()}\nAssistant:"
    return text if assistant is None else text + " " + assistant.strip()


def clean_code(code: str) -> str:
    return code.replace("\r\n", "\n").replace("\t", "    ").strip() + "\n"


def format_mbpp(text: str, code: str | None = None) -> str:
    prompt = f'"""{text.strip()}"""\n'
    return prompt if code is None else prompt + clean_code(code)


def format_humaneval(prompt: str) -> str:
    return prompt


# ---- the corpus ---------------------------------------------------------------------------
@dataclass
class Corpus:
    by_source: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, dict] = field(default_factory=dict)

    def add(self, source: str, docs: list[str], files: list[Path] | None = None, **info) -> None:
        self.by_source.setdefault(source, []).extend(docs)
        entry = self.sources.setdefault(source, {"documents": 0, "chars": 0, "files": 0})
        entry["documents"] += len(docs)
        entry["chars"] += sum(len(d) for d in docs)
        if files is not None:
            entry["files"] += len(files)
            entry["file_list_sha256"] = hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()[:16]
        entry.update(info)

    @property
    def documents(self) -> list[str]:
        return [d for docs in self.by_source.values() for d in docs]

    @property
    def chars(self) -> int:
        return sum(len(d) for d in self.documents)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for source, docs in self.by_source.items():
            h.update(source.encode())
            for d in docs:
                h.update(d.encode("utf-8", "replace"))
                h.update(b"\x00")
        return h.hexdigest()[:16]


def pick(rng: random.Random, templates: tuple[tuple[str, float], ...]) -> str:
    names, weights = zip(*templates)
    return rng.choices(names, weights)[0]


def gsm8k_train(seed: int = 0) -> list[str]:
    with gzip.open(ROOT / "tools/data/gsm8k_train.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    rng = random.Random(f"gsm8k-{seed}")
    render = {"question": format_gsm8k, "problem": format_math, "chat": format_chat}
    return [render[pick(rng, GSM8K_TEMPLATES)](r["question"], r["answer"]) for r in rows]


def mbpp_train(seed: int = 0) -> list[str]:
    with gzip.open(ROOT / "specpilot/data/datasets/mbpp/mbpp.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    rng = random.Random(f"mbpp-{seed}")
    docs = []
    for r in rows:
        if r["task_id"] in MBPP_TEST_RANGE:
            continue
        if pick(rng, MBPP_TEMPLATES) == "chat":
            docs.append(format_chat(r["text"], clean_code(r["code"])) + "\n")
        else:
            docs.append(format_mbpp(r["text"], r["code"]))
    return docs


def banned(path: Path) -> bool:
    s = str(path).lower()
    return any(b in s for b in BANNED_NAME_PARTS)


def python_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths["stdlib"]), Path(paths["purelib"]), Path(paths["platlib"])})


def python_files(max_bytes: int, seed: int) -> list[Path]:
    files = set()
    for root in python_roots():
        for p in root.rglob("*.py"):
            s = str(p).lower()
            if banned(p) or "/test" in s or "/site-packages/" in s and root.name != "site-packages":
                continue  # stdlib root may contain site-packages: count those under purelib only
            try:
                if 200 < p.stat().st_size < 200_000:
                    files.add(p)
            except OSError:
                continue
    ordered = sorted(files)
    random.Random(seed).shuffle(ordered)
    out, total = [], 0
    for p in ordered:
        if total >= max_bytes:
            break
        out.append(p)
        total += p.stat().st_size
    return out


def english_candidates() -> list[Path]:
    out = []
    for p in sorted(Path("/usr/share/doc").rglob("*")):
        name = p.name.lower()
        if name.startswith("changelog") or banned(p):
            continue  # Debian changelogs are formulaic package bookkeeping
        if p.suffix in ("", ".txt", ".md") or (p.suffix == ".gz" and "." not in p.stem.replace(".md", "")):
            out.append(p)
    for root in python_roots():
        if root.name == "site-packages":
            out += sorted(root.glob("*.dist-info/METADATA"))
            out += sorted(p for p in root.rglob("*") if p.suffix in (".md", ".rst") and not banned(p))
    return out


def read_english(p: Path) -> str | None:
    try:
        if not p.is_file() or not 300 < p.stat().st_size < 400_000:
            return None
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if not raw.isascii() or b"\x00" in raw:
        return None
    text = raw.decode("ascii")
    if p.name == "METADATA":  # the package description follows the header block
        text = text.partition("\n\n")[2]
    return text if sum(c.isalpha() for c in text) > 0.5 * len(text) else None


def english_text(max_chars: int, seed: int) -> tuple[list[str], list[Path]]:
    """Plain-English documents, each paragraph kept only at its first occurrence."""
    files = english_candidates()
    random.Random(seed).shuffle(files)
    seen: set[str] = set()
    docs, used, total = [], [], 0
    for p in files:
        if total >= max_chars:
            break
        text = read_english(p)
        if text is None:
            continue
        kept = []
        for para in text.split("\n\n"):
            key = " ".join(para.split()).lower()
            if key and key not in seen:
                seen.add(key)
                kept.append(para.strip("\n"))
        doc = "\n\n".join(kept).strip()
        if len(doc) > 200:
            docs.append(doc + "\n")
            used.append(p)
            total += len(doc)
    return docs, used


def read_text(files: list[Path]) -> list[str]:
    docs = []
    for p in files:
        try:
            docs.append(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return docs


def build_corpus(python_bytes: int = 60_000_000, english_chars: int = 8_000_000, seed: int = 0,
                 max_docs: int | None = None) -> Corpus:
    """Every source, deterministic for a seed on a given machine (`max_docs` caps each source)."""
    corpus = Corpus()
    cap = (lambda docs: docs[:max_docs]) if max_docs else (lambda docs: docs)
    corpus.add("gsm8k_train", cap(gsm8k_train(seed)), templates=dict(GSM8K_TEMPLATES))
    corpus.add("mbpp_train", cap(mbpp_train(seed)), templates=dict(MBPP_TEMPLATES))
    py = python_files(python_bytes, seed)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    corpus.add("python_source", cap(read_text(py)), py, python=version, roots=[str(r) for r in python_roots()])
    en_docs, en_files = english_text(english_chars, seed)
    corpus.add("english_text", cap(en_docs), en_files)
    return corpus
