"""The five benchmark prompt sets as the fixture tooling sees them.

`prompts(set)` renders each item with the format documented in `corpus.py` (what generation and
the fixture report feed the model); `protected_texts()` lists every benchmark text that must never
appear in training data: GSM8K test questions, MATH500 problems, HumanEval prompts, MBPP test
task texts (11-510) and both MT-Bench turns. The sets ship in specpilot/data/datasets.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from corpus import MBPP_TEST_RANGE, ROOT, format_chat, format_gsm8k, format_humaneval, format_math, format_mbpp

DATASETS = ROOT / "specpilot" / "data" / "datasets"
SETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench")


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def rows(name: str) -> list[dict]:
    if name == "gsm8k":
        return read_jsonl(DATASETS / "gsm8k" / "test.jsonl.gz")
    if name == "math500":
        return read_jsonl(DATASETS / "math500" / "test.jsonl.gz")
    if name == "humaneval":
        return read_jsonl(DATASETS / "humaneval" / "HumanEval.jsonl.gz")
    if name == "mbpp":
        return [r for r in read_jsonl(DATASETS / "mbpp" / "mbpp.jsonl.gz") if r["task_id"] in MBPP_TEST_RANGE]
    if name == "mt_bench":
        return read_jsonl(DATASETS / "mt_bench" / "question.jsonl")
    raise ValueError(f"unknown benchmark set {name!r} (known: {SETS})")


def prompts(name: str) -> list[str]:
    """Every prompt of a set, in file order, formatted as at benchmark time."""
    render = {
        "gsm8k": lambda r: format_gsm8k(r["question"]),
        "math500": lambda r: format_math(r["problem"]),
        "humaneval": lambda r: format_humaneval(r["prompt"]),
        "mbpp": lambda r: format_mbpp(r["text"]),
        "mt_bench": lambda r: format_chat(r["turns"][0]),
    }[name]
    return [render(r) for r in rows(name)]


def protected_texts() -> dict[str, list[str]]:
    """{set: texts} that training data must not contain (the prompts' content, unformatted)."""
    return {
        "gsm8k": [r["question"] for r in rows("gsm8k")],
        "math500": [r["problem"] for r in rows("math500")],
        "humaneval": [r["prompt"] for r in rows("humaneval")],
        "mbpp": [r["text"] for r in rows("mbpp")],
        "mt_bench": [t for r in rows("mt_bench") for t in r["turns"]],
    }
