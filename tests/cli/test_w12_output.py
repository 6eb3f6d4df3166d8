"""`specpilot w12 convert` prints a short summary (the table with -v), and a W12 checkpoint loaded
where no Triton kernel runs says once, on one line, why it is slow."""

from __future__ import annotations

import warnings

import pytest
import torch

from specpilot.cli import main
from specpilot.errors import Notice
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("w12out")
    src = write_random_checkpoint(root / "src", tiny_config(num_layers=2), dtype=torch.bfloat16)
    dst = root / "w12"
    assert main(["w12", "convert", str(src), str(dst), "--device", "cpu"]) == 0
    return src, dst


def test_convert_prints_a_summary_and_the_table_only_when_verbose(converted, tmp_path, capsys):
    src, dst = converted
    assert main(["w12", "convert", str(src), str(tmp_path / "a"), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("converted 14 tensors") and "bits/weight" in lines[0]
    assert "whole model" in lines[1] and "bits/weight" in lines[1] and str(tmp_path / "a") in lines[1]
    assert main(["w12", "convert", str(src), str(tmp_path / "b"), "--device", "cpu", "-v"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].split()[:2] == ["tensor", "shape"] and len(table) == 1 + 14 + 1  # header, tensors, totals
    assert table[-1].startswith("converted 14 tensors")


def whole_model_bits(line: str) -> float:
    return float(line.split("whole model ")[1].split()[0])


def test_whole_model_bits_count_the_kept_tensors(converted, tmp_path, capsys):
    """The kept tensors (embeddings, head, norms) stay BF16: the whole model's bits/weight is the
    weighted mean of 16 and the converted weights' (above 16 here: tiny rows carry a large overhead)."""
    src, _ = converted
    main(["w12", "convert", str(src), str(tmp_path / "a"), "--device", "cpu"])
    totals, whole = capsys.readouterr().out.strip().splitlines()
    converted_bits = float(totals.split(" bits/weight")[0].rsplit(" ", 1)[1])
    assert min(16.0, converted_bits) < whole_model_bits(whole) < max(16.0, converted_bits)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_loading_w12_on_cpu_warns_once(converted):
    _, dst = converted
    with pytest.warns(Notice, match="reference codec"):
        load_model(dst, device="cpu")
    src, _ = converted
    with warnings.catch_warnings():
        warnings.simplefilter("error", Notice)
        load_model(src, device="cpu")  # a BF16 checkpoint: nothing to say


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_the_cli_shows_the_notice_as_one_line(converted, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, dst = converted
    code = main(["generate", "--target", str(dst), "--drafter", "none", "--prompt", "a b", "--max-new-tokens", "2",
                 "--device", "cpu"])
    err = capsys.readouterr().err.splitlines()
    notes = [x for x in err if x.startswith("note: ")]
    assert code == 0 and len(notes) == 1 and "W12 checkpoint" in notes[0] and "GPU" in notes[0]
    assert not any("Warning" in x or "warnings.warn" in x for x in err)  # no Python warning format
