import importlib
import sys
from pathlib import Path

import pytest

from specpilot.bench.datasets import Example, load_set, subset
from specpilot.bench.prompts import PLAIN_FORMATS, encode_example, format_example, prompt_ids
from specpilot.config import BENCHMARK_SETS, Deployment
from specpilot.errors import ConfigError
from specpilot.models.random_checkpoint import tokenizer_dir
from specpilot.models.tokenizer import Tokenizer

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_dir(tokenizer_dir())


class ChatTokenizer:
    """A tokenizer whose checkpoint has a chat template."""

    def __init__(self, inner):
        self.inner = inner

    def render_chat(self, text):
        return f"<|user|>{text}<|assistant|>"

    def encode(self, text):
        return self.inner.encode(text)


def test_plain_formats_are_exact():
    def fmt(name, text):
        return PLAIN_FORMATS[name](text)

    assert fmt("gsm8k", " How many?\n") == "Question: How many?\nAnswer:"
    assert fmt("math500", "Find $x$.") == "Problem: Find $x$.\nSolution:"
    assert fmt("humaneval", "def f(x):\n    \"\"\"doc\"\"\"\n") == "def f(x):\n    \"\"\"doc\"\"\"\n"
    assert fmt("mbpp", "Write a function. ") == '"""Write a function."""\n'
    assert fmt("mt_bench", "Hi there") == "User: Hi there\nAssistant:"


def test_chat_template_is_used_when_the_tokenizer_has_one(tokenizer):
    example = load_set("gsm8k")[0]
    text, chat = format_example(example, ChatTokenizer(tokenizer))
    assert chat and text == f"<|user|>{example.text}<|assistant|>"
    text, chat = format_example(example, tokenizer)  # bpe4k has no chat template
    assert not chat and text.startswith("Question: Janet")


def test_prompt_ids_defaults_to_the_deployment(tokenizer):
    dep = Deployment(name="d", target="t", sets=("mbpp", "mt_bench"), n_prompts=3)
    prompts = prompt_ids(dep, tokenizer)
    assert [p.set_name for p in prompts] == ["mbpp"] * 3 + ["mt_bench"] * 3
    for p in prompts:
        assert list(p.ids) == tokenizer.encode(p.text) and p.as_list() == list(p.ids)
    assert prompt_ids(dep, tokenizer) == prompts  # same arguments, same prompts
    assert len(prompt_ids(dep, tokenizer, sets=["humaneval"], n_prompts=0)) == 164
    with pytest.raises(ConfigError, match="n_prompts"):
        prompt_ids(dep, tokenizer, n_prompts=-1)


def test_empty_prompt_is_refused(tokenizer):
    with pytest.raises(ConfigError, match="zero tokens"):
        encode_example(Example("humaneval", 0, "x/0", ""), tokenizer)


@pytest.mark.skipif(not (TOOLS / "benchmark_prompts.py").is_file(), reason="no tools/ in this checkout")
@pytest.mark.parametrize("name", BENCHMARK_SETS)
def test_formats_match_the_fixture_training_tools(name):
    """tools/ renders the fixture's training data and reports in these formats: they must agree."""
    sys.path.insert(0, str(TOOLS))
    try:
        tools_prompts = importlib.import_module("benchmark_prompts").prompts(name)
    finally:
        sys.path.remove(str(TOOLS))
    ours = [format_example(e, None)[0] for e in load_set(name)]
    assert ours == tools_prompts


def test_controller_prompt_source_is_balanced_and_deterministic(target_dir):
    from specpilot.bench.prompts import controller_prompt_source

    dep = Deployment(name="d", target=str(target_dir), sets=("gsm8k", "mt_bench"))
    source = controller_prompt_source(dep)
    tokenizer = Tokenizer.from_dir(target_dir)
    drawn = source(4, 123)
    assert drawn == source(4, 123) and drawn != source(4, 124)
    gsm8k = [encode_example(e, tokenizer).as_list() for e in subset(load_set("gsm8k"), 2, 123)]
    mt_bench = [encode_example(e, tokenizer).as_list() for e in subset(load_set("mt_bench"), 2, 123)]
    assert drawn == [gsm8k[0], mt_bench[0], gsm8k[1], mt_bench[1]]
    assert len(source(1319 + 80, 0)) == 1399  # mt_bench runs out first; gsm8k fills the rest
    with pytest.raises(ConfigError, match="cannot draw"):
        source(1400, 0)
