"""`specpilot generate` names the system it actually runs: `ar`, `ngram`, `stock+fault:...`."""

from __future__ import annotations

import argparse
import json

import pytest

from specpilot.cli import generate as cli
from specpilot.cli import main


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["generate", "--prompt", "x", *argv])


def name_of(*argv: str) -> str:
    args = parse(*argv)
    return cli.system_from_args(args, cli.deployment_from_args(args)).name


@pytest.mark.parametrize("argv, name", [
    ((), "stock"),
    (("--drafter", "none"), "ar"),
    (("--drafter", "ngram"), "ngram"),
    (("--target", "fixture"), "ngram"),  # an ad-hoc deployment drafts by prompt lookup
    (("--system", "ar"), "ar"),
    (("--system", "ar", "--target", "fixture"), "ar"),  # AR stays AR: nothing to look up
    (("--fault", "accept-unverified"), "stock+fault:accept-unverified"),
    (("--drafter", "none", "--fault", "logit-bias:2:every=3:after=1"), "ar+fault:logit-bias:2:every=3:after=1"),
    (("--drafter", "none", "--depth", "3"), "ar"),  # AR has no tree: its shape is not part of the name
    (("--depth", "3", "--topk", "1"), "stock+depth=3+topk=1+tree_budget=3"),
    (("--drafter", "ngram", "--no-cuda-graphs"), "ngram+cuda_graphs=false"),
    (("--attention", "split_kv"), "stock+attention=split_kv"),
    (("--compile",), "stock+draft_compile=true+verify_compile=true"),
    (("--drafter", "none", "--compile"), "ar+verify_compile=true"),  # AR compiles its step; it drafts nothing
    (("--drafter", "ngram", "--compile"), "ngram+verify_compile=true"),  # prompt lookup runs on the host
    (("--pdl",), "stock+pdl=true"),
    (("--draft-kernel", "triton"), "stock+draft_kernel=triton"),
])
def test_the_name_says_what_runs(argv, name):
    assert name_of(*argv) == name


def test_ar_run_is_labelled_ar(capsys, target_dir):
    code = main(["generate", "--target", str(target_dir), "--drafter", "none", "--prompt", "a b", "--max-new-tokens",
                 "4", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0 and err.startswith("system ar on cpu:"), err


def test_ngram_with_a_fault_in_json(capsys, target_dir):
    code = main(["generate", "--target", str(target_dir), "--prompt", "a b a b", "--max-new-tokens", "4",
                 "--device", "cpu", "--fault", "accept-unverified", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["system"] == "ngram+fault:accept-unverified"
    assert report["knobs"]["drafter"] == "ngram" and report["knobs"]["fault"] == "accept-unverified"
