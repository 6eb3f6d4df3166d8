"""The benchmark prompt sets shipped in the package, and deterministic subsets of them.

Owns: reading the copies under `specpilot/data/datasets/` (sources and licenses are listed in the
README.md there), reducing each record to the one text a prompt is built from, and choosing a
seeded subset of `n` prompts. Each set is registered by name (`SETS`): the five public sets in the
order of `specpilot.config.BENCHMARK_SETS`, then the held-out set (`HELDOUT_SET`).

The held-out set is the project's own 40 prompts, written for it, in the mix the five cover (math
word problems and harder math, code-completion prompts, programming tasks in words, open
questions). A deployment never lists it, so the loop never draws from it; the final measurement
benchmarks it to show whether the final system's gain holds outside the sets it was tuned on.
Each of its examples says which public set's plain format it takes (`Example.plain_format`, by
its kind: `HELDOUT_FORMATS`).

Does not own how a text becomes a prompt (`prompts.py`) or any model or tokenizer.

Subsets are chosen by hashing, not by a random-number stream: the examples of a set are ordered by
sha256("{seed}:{set}:{source_id}") and the first `n` are taken. That order is the same on every
machine and every numpy/Python version, and it is nested: the 10-prompt subset of a seed is the
first 10 of its 20-prompt subset, so a longer run extends a shorter one instead of replacing it.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from specpilot.config import BENCHMARK_SETS, HELDOUT_SET
from specpilot.errors import ConfigError

MBPP_TEST_TASK_IDS = range(11, 511)  # task_id 11..510 is MBPP's test split (Austin et al., 2021)


@dataclass(frozen=True)
class Example:
    """One benchmark item reduced to what a prompt needs."""

    set_name: str
    index: int  # position among the set's examples (file order, after the split filter)
    source_id: str  # the dataset's own id, e.g. "HumanEval/0", "mbpp/11", "gsm8k/0"
    text: str  # the question / problem / code prompt / task / first user turn, verbatim
    plain_format: str = ""  # the set whose plain format it takes (`prompts.PLAIN_FORMATS`); "" = its own

    @property
    def format_name(self) -> str:
        return self.plain_format or self.set_name


@dataclass(frozen=True)
class SetSpec:
    """Where a set lives in the package and how its records become `Example`s."""

    name: str
    file: str  # relative to specpilot/data/datasets
    field: str  # the record field that becomes `Example.text`
    source: str  # where the copy came from
    license: str
    parse: Callable[[list[dict]], list[tuple]]  # records -> [(source_id, text)] or [(source_id, text, plain_format)]


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _gsm8k(rows: list[dict]) -> list[tuple[str, str]]:
    return [(f"gsm8k/{i}", r["question"]) for i, r in enumerate(rows)]


def _math500(rows: list[dict]) -> list[tuple[str, str]]:
    return [(r["unique_id"], r["problem"]) for r in rows]


def _humaneval(rows: list[dict]) -> list[tuple[str, str]]:
    return [(r["task_id"], r["prompt"]) for r in rows]


def _mbpp(rows: list[dict]) -> list[tuple[str, str]]:
    return [(f"mbpp/{r['task_id']}", r["text"]) for r in rows if int(r["task_id"]) in MBPP_TEST_TASK_IDS]


def _mt_bench(rows: list[dict]) -> list[tuple[str, str]]:
    return [(f"mt_bench/{r['question_id']}", r["turns"][0]) for r in rows]


# a held-out prompt's kind -> the public set whose plain format it takes
HELDOUT_FORMATS = {"math": "gsm8k", "code_completion": "humaneval", "code_task": "mbpp", "chat": "mt_bench"}


def _heldout(rows: list[dict]) -> list[tuple[str, str, str]]:
    bad = sorted({r["kind"] for r in rows} - set(HELDOUT_FORMATS))
    if bad:
        raise ConfigError(f"held-out set: unknown kind(s) {', '.join(bad)} (known: {', '.join(HELDOUT_FORMATS)})")
    return [(r["id"], r["prompt"], HELDOUT_FORMATS[r["kind"]]) for r in rows]


SETS: dict[str, SetSpec] = {
    s.name: s
    for s in (
        SetSpec("gsm8k", "gsm8k/test.jsonl.gz", "question", "github.com/openai/grade-school-math (test split)",
                "MIT", _gsm8k),
        SetSpec("math500", "math500/test.jsonl.gz", "problem", "github.com/openai/prm800k (MATH-500 test subset)",
                "MIT", _math500),
        SetSpec("humaneval", "humaneval/HumanEval.jsonl.gz", "prompt", "github.com/openai/human-eval",
                "MIT", _humaneval),
        SetSpec("mbpp", "mbpp/mbpp.jsonl.gz", "text", "github.com/google-research/google-research/tree/master/mbpp "
                "(full file; test split = task_id 11..510)", "CC-BY-4.0", _mbpp),
        SetSpec("mt_bench", "mt_bench/question.jsonl", "turns[0]",
                "github.com/lm-sys/FastChat (llm_judge/data/mt_bench; first turn)", "Apache-2.0", _mt_bench),
        SetSpec(HELDOUT_SET, "heldout/prompts.jsonl", "prompt", "this project (written for it; see README.md)",
                "Apache-2.0", _heldout),
    )
}
assert tuple(SETS) == (*BENCHMARK_SETS, HELDOUT_SET)


def datasets_dir() -> Path:
    return Path(str(resources.files("specpilot") / "data" / "datasets"))


def check_set_names(names) -> tuple[str, ...]:
    """The names as a tuple, or a ConfigError naming the unknown ones."""
    names = tuple(names)
    bad = [n for n in names if n not in SETS]
    if bad:
        raise ConfigError(f"unknown benchmark set(s) {', '.join(bad)} (known: {', '.join(SETS)})")
    if not names:
        raise ConfigError("no benchmark sets selected")
    if len(set(names)) != len(names):
        raise ConfigError(f"benchmark sets listed twice: {', '.join(names)}")
    return names


@functools.lru_cache(maxsize=None)
def load_set(name: str) -> tuple[Example, ...]:
    """Every example of a set, in file order (MBPP: the test split only)."""
    (name,) = check_set_names([name])
    spec = SETS[name]
    path = datasets_dir() / spec.file
    if not path.is_file():
        raise ConfigError(f"benchmark set {name!r}: {path} is missing from the package")
    rows = spec.parse(_read_jsonl(path))
    return tuple(Example(name, i, *row) for i, row in enumerate(rows))


def draw_key(seed: int, example: Example) -> str:
    return hashlib.sha256(f"{seed}:{example.set_name}:{example.source_id}".encode()).hexdigest()


def subset(examples: tuple[Example, ...], n: int, seed: int = 0) -> tuple[Example, ...]:
    """The first `n` examples in the seed's hash order (n <= 0: all of them, in that order)."""
    ordered = sorted(examples, key=lambda e: draw_key(seed, e))
    if n <= 0:
        return tuple(ordered)
    if n > len(ordered):
        name = examples[0].set_name if examples else "?"
        raise ConfigError(f"benchmark set {name!r} has {len(ordered)} prompts; cannot draw {n}")
    return tuple(ordered[:n])


def select(sets, n_prompts: int, seed: int = 0) -> tuple[Example, ...]:
    """`n_prompts` examples of each set (0 = all), set by set in the given order."""
    out: list[Example] = []
    for name in check_set_names(sets):
        out.extend(subset(load_set(name), n_prompts, seed))
    return tuple(out)
