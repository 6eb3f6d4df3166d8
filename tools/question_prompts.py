"""Training prompts shaped like what users send: train-split questions in the benchmark's formats.

Owns: drawing `Example`s from text that exists offline and is not a benchmark prompt, one per
benchmark format in turn, and encoding them with `specpilot.bench.prompts.encode_example` — the
function `specpilot bench` formats its prompts with (the plain formats, or the target's chat
template when it has one), so a training prompt ends exactly as a benchmark prompt does:

    gsm8k, math500, mt_bench   GSM8K *train* questions (tools/data/gsm8k_train.jsonl.gz)
    mbpp, mt_bench             MBPP task texts outside the 11-510 test range
    humaneval                  a top-level function's signature and docstring from the corpus's
                               Python files (what a HumanEval prompt is), cut after the docstring

Texts that contain a benchmark text (`leakcheck.py`) are dropped; every 20th text of each format
is held out. Does not own the corpus (`corpus.py`) or the formats themselves (`prompts.py`).
"""

from __future__ import annotations

import gzip
import json
import random
import re

import benchmark_prompts
import leakcheck
from corpus import MBPP_TEST_RANGE, ROOT

from specpilot.bench.datasets import Example
from specpilot.bench.prompts import encode_example

SOURCE_SET = "train_split"  # Example.set_name of every training prompt (never a benchmark set)
# a top-level function whose body starts with a docstring: the HumanEval prompt shape
FUNCTION = re.compile(r'^def [A-Za-z_]\w*\([^\n]*\)[^\n]*:\n    (?:"""|\'\'\')[\s\S]{20,1200}?(?:"""|\'\'\')\n', re.MULTILINE)


def gsm8k_questions() -> list[str]:
    with gzip.open(ROOT / "tools/data/gsm8k_train.jsonl.gz", "rt") as f:
        return [json.loads(line)["question"] for line in f]


def mbpp_train_texts() -> list[str]:
    with gzip.open(ROOT / "specpilot/data/datasets/mbpp/mbpp.jsonl.gz", "rt") as f:
        return [r["text"] for r in map(json.loads, f) if r["task_id"] not in MBPP_TEST_RANGE]


def code_prompts(python_docs: list[str]) -> list[str]:
    """Every top-level function of the documents cut after its docstring, with the document's
    leading lines (imports) when they are short, as a HumanEval prompt has them."""
    out = []
    for doc in python_docs:
        for m in FUNCTION.finditer(doc):
            head = doc[: m.start()]
            out.append((head if len(head) < 400 else "") + m.group(0))
    return out


def texts_by_format(python_docs: list[str], seed: int) -> dict[str, list[str]]:
    """{benchmark format: leak-checked source texts}, each list shuffled by the seed; a GSM8K
    question takes one of its three formats and an MBPP text one of its two, drawn by the seed."""
    rng = random.Random(f"questions-{seed}")
    out: dict[str, list[str]] = {"gsm8k": [], "math500": [], "humaneval": [], "mbpp": [], "mt_bench": []}
    for q in gsm8k_questions():
        out[rng.choice(("gsm8k", "math500", "mt_bench"))].append(q)
    for t in mbpp_train_texts():
        out[rng.choice(("mbpp", "mbpp", "mt_bench"))].append(t)
    out["humaneval"] = code_prompts(python_docs)
    protected = benchmark_prompts.protected_texts()
    for texts in out.values():
        bad = {leak.document for leak in leakcheck.find_leaks(texts, protected)}
        texts[:] = [t for i, t in enumerate(texts) if i not in bad]
        rng.shuffle(texts)
    return out


def question_prompts(tokenizer, python_docs: list[str], n: int, n_held: int, max_tokens: int,
                     seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) token-id prompts of at most `max_tokens`, the five formats in turn
    (a format whose texts run out drops out), encoded as `specpilot bench` encodes its prompts."""
    by_format = texts_by_format(python_docs, seed)
    pools = {"train": [], "held": []}
    for fmt, texts in by_format.items():
        for i, text in enumerate(texts):
            pools["held" if i % 20 == 0 else "train"].append((fmt, i, text))
    out = {}
    for split, want in (("train", n), ("held", n_held)):
        queues = {fmt: [x for x in pools[split] if x[0] == fmt] for fmt in by_format}
        got: list[list[int]] = []
        while len(got) < want and any(queues.values()):
            for fmt in by_format:
                if queues[fmt] and len(got) < want:
                    _, i, text = queues[fmt].pop(0)
                    e = Example(SOURCE_SET, i, f"{SOURCE_SET}/{fmt}/{i}", text, plain_format=fmt)
                    ids = list(encode_example(e, tokenizer).ids)
                    if len(ids) <= max_tokens:
                        got.append(ids)
        out[split] = got
    return out["train"], out["held"]
