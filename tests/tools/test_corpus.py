"""Prompt formats, train-split templates and the MBPP test range."""

import benchmark_prompts
import corpus


def test_prompt_formats():
    assert corpus.format_gsm8k(" How many? ") == "Question: How many?\nAnswer:"
    assert corpus.format_math("Compute $1+1$.") == "Problem: Compute $1+1$.\nSolution:"
    assert corpus.format_chat("Write a poem.") == "User: Write a poem.\nAssistant:"
    assert corpus.format_mbpp("Write a function.") == '"""Write a function."""\n'
    assert corpus.format_humaneval("def f():\n") == "def f():\n"
    # a training example is its prompt followed by a space (or the code) and the answer
    assert corpus.format_gsm8k("Q?", "A.") == corpus.format_gsm8k("Q?") + " A."
    assert corpus.format_mbpp("T.", "x = 1\r\n").startswith(corpus.format_mbpp("T."))


def test_benchmark_prompts_use_the_formats():
    first = {s: benchmark_prompts.prompts(s)[0] for s in benchmark_prompts.SETS}
    assert first["gsm8k"].startswith("Question: Janet") and first["gsm8k"].endswith("\nAnswer:")
    assert first["math500"].startswith("Problem: ") and first["math500"].endswith("\nSolution:")
    assert first["mt_bench"].startswith("User: ") and first["mt_bench"].endswith("\nAssistant:")
    assert first["mbpp"].startswith('"""') and first["mbpp"].endswith('"""\n')
    assert first["humaneval"].startswith("from typing import List")
    assert len(benchmark_prompts.prompts("mbpp")) == 500


def test_train_splits_are_deterministic_and_exclude_mbpp_test():
    assert corpus.gsm8k_train(0) == corpus.gsm8k_train(0)
    assert corpus.gsm8k_train(0) != corpus.gsm8k_train(1)  # template draws follow the seed
    docs = corpus.gsm8k_train(0)
    starts = {d.split(":", 1)[0] for d in docs}
    assert starts == {"Question", "Problem", "User"}
    test_texts = {r["text"].strip() for r in benchmark_prompts.rows("mbpp")}
    train = corpus.mbpp_train(0)
    assert len(train) == 974 - 500
    assert sum(any(t in d for t in test_texts) for d in train) < 10  # MBPP repeats a few task texts
