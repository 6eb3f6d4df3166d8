"""The held-out set: the project's own 40 prompts, none from the five public sets, benchmarked only
by the final measurement (a deployment never lists it)."""

import json
from collections import Counter

import pytest

from specpilot.bench.datasets import (
    HELDOUT_FORMATS,
    SETS,
    datasets_dir,
    load_set,
    select,
)
from specpilot.bench.prompts import format_example, prompt_ids
from specpilot.config import BENCHMARK_SETS, HELDOUT_SET, Deployment
from specpilot.errors import ConfigError
from specpilot.models.random_checkpoint import tokenizer_dir
from specpilot.models.tokenizer import Tokenizer


def rows() -> list[dict]:
    path = datasets_dir() / SETS[HELDOUT_SET].file
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def normalize(text: str) -> str:
    return " ".join(text.split()).lower()


def test_the_set_has_40_prompts_of_known_kinds_and_unique_ids():
    examples = load_set(HELDOUT_SET)
    assert len(examples) == 40 and len({e.source_id for e in examples}) == 40
    assert all(e.text.strip() and e.source_id.startswith("heldout/") for e in examples)
    kinds = Counter(r["kind"] for r in rows())
    assert set(kinds) == set(HELDOUT_FORMATS) and kinds["math"] == 16 and kinds["chat"] == 8
    assert all(set(r) == {"id", "kind", "prompt"} for r in rows())
    assert HELDOUT_SET not in BENCHMARK_SETS  # the deployment default, what the loop draws from


def test_no_prompt_comes_from_the_five_sets():
    public = [normalize(e.text) for name in BENCHMARK_SETS for e in load_set(name)]
    for e in load_set(HELDOUT_SET):
        ours = normalize(e.text)
        assert not any(ours in text or text in ours for text in public), e.source_id


def test_each_kind_takes_its_public_sets_format():
    by_kind = {r["id"]: r["kind"] for r in rows()}
    for e in load_set(HELDOUT_SET):
        text, chat = format_example(e, None)
        assert not chat and e.plain_format == HELDOUT_FORMATS[by_kind[e.source_id]]
        if e.plain_format == "humaneval":
            assert text == e.text and text.startswith("def ") and text.endswith('    """\n')
        elif e.plain_format == "gsm8k":
            assert text == f"Question: {e.text.strip()}\nAnswer:"
        elif e.plain_format == "mbpp":
            assert text == f'"""{e.text.strip()}"""\n'
        else:
            assert text == f"User: {e.text.strip()}\nAssistant:"


def test_the_benchmark_selects_it():
    tokenizer = Tokenizer.from_dir(tokenizer_dir())
    dep = Deployment(name="d", target="t")
    prompts = prompt_ids(dep, tokenizer, sets=[HELDOUT_SET], n_prompts=8)
    assert len(prompts) == 8 and {p.set_name for p in prompts} == {HELDOUT_SET}
    assert [p.source_id for p in prompts] == [e.source_id for e in select([HELDOUT_SET], 8)]
    assert len(prompt_ids(dep, tokenizer, sets=[HELDOUT_SET], n_prompts=0)) == 40


def test_a_deployment_listing_it_is_refused():
    with pytest.raises(ConfigError, match="held-out set 'heldout'.*never shown to the loop.*final measurement"):
        Deployment(name="d", target="t", sets=("gsm8k", HELDOUT_SET))
    with pytest.raises(ConfigError, match="never shown to the loop"):
        Deployment.from_dict({"name": "d", "target": "t", "sets": [HELDOUT_SET]})
