"""`specpilot w12 convert|verify`: exit codes and one-line errors through the real CLI entry point, the
summary convert prints (the table with -v), and the one-line note when W12 decodes on a CPU."""

import argparse
import json
import warnings

import pytest
import torch

from specpilot.cli import main
from specpilot.errors import Notice
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint
from specpilot.cli import w12 as w12_cli
from specpilot.w12.checkpoint import MANIFEST


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "src"
    return write_random_checkpoint(out, tiny_config(num_layers=1), dtype=torch.bfloat16)


def test_register_adds_convert_and_verify():
    parser = argparse.ArgumentParser()
    w12_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["w12", "convert", "a", "b", "--lm-head", "--force"])
    assert args.func is w12_cli.run_convert and args.lm_head and args.force and not args.embeddings
    args = parser.parse_args(["w12", "verify", "a", "b"])
    assert args.func is w12_cli.run_verify


def test_convert_then_verify_exit_codes(src, tmp_path, capsys):
    dst = tmp_path / "w12"
    assert main(["w12", "convert", str(src), str(dst), "--device", "cpu"]) == 0
    assert "bits/weight" in capsys.readouterr().out
    assert main(["w12", "verify", str(src), str(dst)]) == 0
    assert "OK" in capsys.readouterr().out
    other = write_random_checkpoint(tmp_path / "other", tiny_config(num_layers=1), seed=7, dtype=torch.bfloat16)
    assert main(["w12", "verify", str(other), str(dst)]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(src, tmp_path, capsys):
    dst = tmp_path / "w12"
    dst.mkdir()
    (dst / "x").write_text("x")
    assert main(["w12", "convert", str(src), str(dst), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--force" in err
    assert main(["w12", "verify", str(src), str(tmp_path / "missing")]) == 2


def test_a_version_1_checkpoint_is_one_line_and_exit_2(src, tmp_path, capsys):
    dst = tmp_path / "w12"
    assert main(["w12", "convert", str(src), str(dst), "--device", "cpu"]) == 0
    manifest = dst / MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": 1}))
    capsys.readouterr()
    assert main(["w12", "verify", str(src), str(dst)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "W12 format version 1" in err and "reads version 2" in err and "`specpilot w12 convert`" in err


# ---- what convert prints, and the note when W12 decodes on CPU --------------------------------

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
def test_loading_w12_on_cpu_warns_once(converted, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the interpreter runs the kernels: no notice then
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
