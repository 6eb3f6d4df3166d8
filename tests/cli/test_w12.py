"""`specpilot w12 convert|verify`: exit codes and one-line errors through the real CLI entry point."""

import argparse
import json

import pytest
import torch

from specpilot.cli import main
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
