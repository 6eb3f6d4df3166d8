"""Docstrings and comments state the rule and name the script that measures it; figures live in results/.

A docstring that quotes a GPU's timing ("13.3 µs on the H200", "1.13x faster") or points at a run
under `results/` is a lab note: it is wrong after the next kernel change or the next pruning of
`results/`. So no docstring or comment under `specpilot/` may name a GPU model, quote a timing
figure (a number with µs, us, ns or ms), a speedup figure ("1.02x over ...", "0.93x -> 1.02x") or a
`results/` path. Units alone are fine (`# µs of cuBLAS`, "TPOT p50 ms", `ms/token`), and so is code:
only docstrings and comments are read, not strings the code prints.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specpilot"

LAB_NOTES = re.compile(
    r"\b(?:[AHB]100|H20|H200|GH200|GB200|B200|A10G?|A6000|L4|L40S?|V100|T4|RTX ?\d{4}|MI\d{3}X?)s?\b"  # GPU models
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:µs|us|ns|ms)\b"  # a timing figure (not `p50 ms`)
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:micro|milli|nano)seconds?\b"
    r"|(?<![\w.])\d+(?:\.\d+)?x\s?(?:over|faster|slower|less time|cuBLAS|AR\b|->)"  # a speedup figure
    r"|\bresults/"  # a run's files
)


def notes(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring line and comment of a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                found += [(doc.lineno + i, line) for i, line in enumerate(doc.value.value.splitlines())]
    found += [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type == tokenize.COMMENT]
    return found


def lab_notes(package: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted(package.rglob("*.py")):
        for line, text in notes(path.read_text()):
            if match := LAB_NOTES.search(text):
                bad.append(f"{path.relative_to(package.parent)}:{line}: {match.group(0)!r} in {text.strip()!r}")
    return bad


def test_no_docstring_or_comment_quotes_a_gpu_figure():
    assert lab_notes() == [], "state the rule and name the script in scripts/ that measures it"


def test_the_check_reads_docstrings_and_comments_only(tmp_path):
    pkg = tmp_path / "specpilot"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        '"""Module: on the H200 this costs ~10 ms."""\n'
        "def f():\n"
        '    """Pays on the lm_heads (0.93x -> 1.02x cuBLAS)."""\n'
        "    x = 1  # see results/w12/x.md\n"
        '    print(f"{x:.1f} us today on the H100")  # µs of cuBLAS, the TPOT p50 ms column\n'
        "class C:\n"
        '    """Measured 1.13x faster."""\n')
    assert [f.split(": ", 1)[0] for f in lab_notes(pkg)] == [
        "specpilot/x.py:1", "specpilot/x.py:3", "specpilot/x.py:7", "specpilot/x.py:4"]  # not the print on 5


@pytest.mark.parametrize("note", ["on the H200", "an H100 80GB", "A100s", "13.32 µs against 14.24", "~2.5 us",
                                  "~10 ms of host time", "0.3 ms", "20 microseconds", "1.02x cuBLAS",
                                  "1.13x faster", "5-8x slower", "0.93x -> 1.02x", "(`results/serving/`)"])
def test_figures_are_found(note):
    assert LAB_NOTES.search(note)


@pytest.mark.parametrize("note", ["# µs of cuBLAS, decoded", "TPOT p50 ms", "ms/token", "(acceptance <gap> ms/tok)",
                                  ">= 3x a 50-60 MB L2", "1% + 2 x noise", "Hopper and later", "on sm_90",
                                  "timespec in microseconds", "the H-dimension", "fixture-x16", "a line at 1x = AR"])
def test_units_and_rules_are_not_figures(note):
    assert not LAB_NOTES.search(note)
