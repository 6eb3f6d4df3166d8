r'''Benchmark prompts: the formats, and token-id prompts for a deployment.

Owns: turning an `Example` into prompt text and token ids; `prompt_ids`, the one function the
benchmark, the guard report and the loop call to get a deployment's benchmark prompts; and
`controller_prompt_source`, the same prompts behind the controller's `PromptSource` interface.

Does not own reading the data files or choosing subsets (`datasets.py`), or the tokenizer itself
(`specpilot.models.tokenizer`).

Formats. When the target's tokenizer has a chat template, the prompt is that template rendered
for one user message (with the generation prompt appended) and the user message is the example's
text verbatim: the GSM8K question, the MATH500 problem, the HumanEval code prompt, the MBPP task
description, the MT-Bench first turn. Otherwise a plain format: the templates tools/corpus.py
renders the fixture's training data in (GSM8K and MBPP train splits; code for HumanEval), so the
fixture has seen each one. tests/bench/test_prompts.py checks both stay identical:

    gsm8k      "Question: {question}\nAnswer:"
    math500    "Problem: {problem}\nSolution:"
    humaneval  "{prompt}"                       (the raw code prompt, not stripped)
    mbpp       '"""{text}"""\n'
    mt_bench   "User: {turns[0]}\nAssistant:"

The held-out set's prompts take the format of the public set of their kind (`datasets.HELDOUT_FORMATS`:
math as gsm8k, code completion as humaneval, programming tasks as mbpp, open questions as
mt_bench). Natural-language fields are `.strip()`ped; HumanEval's prompt is kept byte for byte because its
trailing newline and indentation are part of the code. Token ids are `tokenizer.encode(text)`
without added special tokens (a chat template writes its own).
'''

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specpilot.bench.datasets import Example, check_set_names, load_set, select, subset
from specpilot.config import Deployment
from specpilot.errors import ConfigError


def format_gsm8k(question: str, answer: str | None = None) -> str:
    """GSM8K prompt; with `answer`, the training text the fixture saw (tools/corpus.py)."""
    text = f"Question: {question.strip()}\nAnswer:"
    return text if answer is None else text + " " + answer.strip()


def format_math500(problem: str) -> str:
    return f"Problem: {problem.strip()}\nSolution:"


def format_humaneval(prompt: str) -> str:
    return prompt


def format_mbpp(text: str, code: str | None = None) -> str:
    """MBPP prompt; with `code`, the training text the fixture saw (tools/corpus.py)."""
    prompt = f'"""{text.strip()}"""\n'
    return prompt if code is None else prompt + code.replace("\r\n", "\n").replace("\t", "    ").strip() + "\n"


def format_mt_bench(turn: str) -> str:
    return f"User: {turn.strip()}\nAssistant:"


PLAIN_FORMATS: dict[str, Callable[[str], str]] = {
    "gsm8k": format_gsm8k,
    "math500": format_math500,
    "humaneval": format_humaneval,
    "mbpp": format_mbpp,
    "mt_bench": format_mt_bench,
}


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt, ready for `Generator.generate([list(prompt.ids)], ...)`."""

    set_name: str
    index: int  # the example's position in its set (see datasets.Example)
    source_id: str
    text: str  # the formatted prompt text that was encoded
    ids: tuple[int, ...]
    chat: bool  # True when the tokenizer's chat template produced `text`

    def as_list(self) -> list[int]:
        return list(self.ids)


def format_example(example: Example, tokenizer) -> tuple[str, bool]:
    """(prompt text, used the chat template)."""
    rendered = tokenizer.render_chat(example.text) if tokenizer is not None else None
    if rendered is not None:
        return rendered, True
    return PLAIN_FORMATS[example.format_name](example.text), False


def encode_example(example: Example, tokenizer) -> BenchPrompt:
    text, chat = format_example(example, tokenizer)
    ids = tuple(tokenizer.encode(text))
    if not ids:
        raise ConfigError(f"benchmark prompt {example.source_id} encodes to zero tokens")
    return BenchPrompt(example.set_name, example.index, example.source_id, text, ids, chat)


def prompt_ids(deployment: Deployment, tokenizer, sets=None, n_prompts: int | None = None,
               seed: int = 0) -> list[BenchPrompt]:
    """The deployment's benchmark prompts as token ids, set by set.

    `sets` defaults to `deployment.sets`, `n_prompts` (per set; 0 = every prompt) to
    `deployment.n_prompts`. Same arguments, same prompts, on every machine (see datasets.subset).
    `tokenizer` is the target's (`session.tokenizer`): `.encode(text)` and `.render_chat(text)`.
    """
    sets = deployment.sets if sets is None else sets
    n = deployment.n_prompts if n_prompts is None else n_prompts
    if n < 0:
        raise ConfigError(f"n_prompts must be >= 0 (0 = every prompt), got {n}")
    return [encode_example(e, tokenizer) for e in select(sets, n, seed)]


def controller_prompt_source(deployment: Deployment) -> Callable[[int, int], list[list[int]]]:
    """The controller's `PromptSource` for a deployment: (count, seed) -> token-id prompts.

    Draws from every prompt of the deployment's sets: prompt k comes from the sets in turn
    (round-robin, so any count is balanced across sets), and within a set in the seed's hash order
    (`datasets.subset`), so the same (count, seed) gives the same prompts and different seeds give
    independent draws. Loads only the target's tokenizer, never a model.
    """
    from specpilot.engine.session import resolve_model_dir
    from specpilot.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(resolve_model_dir(deployment.target, "target"))
    sets = check_set_names(deployment.sets)
    total = sum(len(load_set(s)) for s in sets)
    encoded: dict[tuple[str, int], tuple[int, ...]] = {}

    def source(count: int, seed: int) -> list[list[int]]:
        if not 0 <= count <= total:
            raise ConfigError(f"cannot draw {count} prompts from the {total} of sets {', '.join(sets)}")
        orders = [list(subset(load_set(s), 0, seed)) for s in sets]
        out: list[list[int]] = []
        depth = 0
        while len(out) < count:
            for order in orders:
                if depth < len(order) and len(out) < count:
                    e = order[depth]
                    key = (e.set_name, e.index)
                    if key not in encoded:
                        encoded[key] = encode_example(e, tokenizer).ids
                    out.append(list(encoded[key]))
            depth += 1
        return out

    return source
