"""The benchmark leak check finds every verbatim (whitespace-insensitive) occurrence, and only those."""

from leakcheck import WINDOW, Leak, find_leaks, normalize, summarize

TEXTS = {
    "gsm8k": ["Natalia sold clips to 48 of her friends in April, and then she sold half as many in May."],
    "mt_bench": ["Short turn.", "Rewrite your previous response in a more formal tone, please."],
    "humaneval": ["def add(a, b):\n    \"\"\"Add two numbers.\n    >>> add(1, 2)\n    3\n    \"\"\"\n"],
}


def test_finds_rewrapped_and_exact_copies():
    docs = [
        "nothing to see here " * 20,
        "prefix " + TEXTS["gsm8k"][0].replace(" ", "\n   ") + " suffix",  # re-wrapped copy
        "x" * 100 + TEXTS["humaneval"][0].replace("    ", "\t"),  # re-indented copy
        "A Short turn. appears here",  # shorter than the hash window: plain search
        TEXTS["mt_bench"][1][:-3],  # a truncated copy is not an occurrence
    ]
    leaks = find_leaks(docs, TEXTS)
    assert leaks == [Leak(1, "gsm8k", 0), Leak(2, "humaneval", 0), Leak(3, "mt_bench", 0)]
    assert len(normalize(TEXTS["mt_bench"][0])) < WINDOW <= len(normalize(TEXTS["gsm8k"][0]))
    summary = summarize(leaks, TEXTS)
    assert summary["mt_bench"] == {"texts_checked": 2, "texts_found": 1, "documents_containing": 1}


def test_no_match_across_documents():
    text = TEXTS["gsm8k"][0]
    half = len(text) // 2
    assert find_leaks([text[:half], text[half:]], TEXTS) == []


def test_every_occurrence_in_a_large_document():
    filler = "lorem ipsum dolor sit amet " * 2000
    docs = [filler + TEXTS["mt_bench"][1] + filler + TEXTS["mt_bench"][1], filler]
    assert find_leaks(docs, TEXTS) == [Leak(0, "mt_bench", 1)]
