"""tools/question_prompts.py: training prompts are train-split texts formatted by the benchmark's
own `encode_example`, every benchmark format is drawn, and none is a benchmark prompt."""

from __future__ import annotations

import question_prompts

from specpilot.bench.datasets import select
from specpilot.bench.prompts import encode_example
from specpilot.config import BENCHMARK_SETS
from specpilot.models.fixture import resolve_checkpoint
from specpilot.models.tokenizer import Tokenizer

PYTHON_DOCS = [f'import math\n\n\ndef area_{i}(r):\n    """Return the area of circle {i} of radius r, in square units."""\n'
               '    return math.pi * r * r\n' for i in range(3)]
# how the fixture's plain formats end a prompt (specpilot/bench/prompts.py)
ENDINGS = {"gsm8k": "\nAnswer:", "math500": "\nSolution:", "mt_bench": "\nAssistant:", "mbpp": '"""\n',
           "humaneval": '"""\n'}


def test_prompts_are_formatted_as_the_benchmark_formats_them_and_none_is_a_benchmark_prompt():
    tok = Tokenizer.from_dir(resolve_checkpoint("fixture", "target"))
    train, held = question_prompts.question_prompts(tok, PYTHON_DOCS, 200, 20, 160, seed=0)
    assert len(train) == 200 and len(held) == 20
    assert all(len(p) <= 160 for p in train + held)
    assert not {tuple(p) for p in train} & {tuple(p) for p in held}
    texts = [tok.decode(p) for p in train]
    starts = {"gsm8k": "Question: ", "math500": "Problem: ", "mt_bench": "User: ", "mbpp": '"""',
              "humaneval": "import math"}
    for fmt, ending in ENDINGS.items():  # the five formats in turn: every one is drawn
        assert any(t.startswith(starts[fmt]) and t.endswith(ending) for t in texts), fmt
    bench = {e.ids for e in (encode_example(x, tok) for x in select(BENCHMARK_SETS, 0, 0))}
    assert len(bench) > 1000 and not bench & {tuple(p) for p in train + held}


def test_a_prompt_is_what_encode_example_makes_of_its_text():
    from specpilot.bench.datasets import Example

    tok = Tokenizer.from_dir(resolve_checkpoint("fixture", "target"))
    by_format = question_prompts.texts_by_format(PYTHON_DOCS, seed=0)
    train, _ = question_prompts.question_prompts(tok, PYTHON_DOCS, 5, 0, 10_000, seed=0)
    first = {fmt: texts[1] for fmt, texts in by_format.items()}  # texts[0] is held out (every 20th)
    for p, fmt in zip(train, by_format):
        want = encode_example(Example(question_prompts.SOURCE_SET, 1, "x", first[fmt], plain_format=fmt), tok).ids
        assert tuple(p) == want
