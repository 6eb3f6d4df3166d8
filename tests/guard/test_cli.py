"""`specpilot guard`: exit 0 on pass, 1 on reject, 2 on bad input; text or JSON output."""

from __future__ import annotations

import json

import pytest

from specpilot.cli import main
from specpilot.guard.records import OutputRecord, write_records


@pytest.fixture(scope="module")
def files(tmp_path_factory, records):
    root = tmp_path_factory.mktemp("guard_cli")
    paths = {}
    for name in ("ar", "tree", "tree-bias"):
        paths[name] = root / f"{name}.jsonl"
        write_records(paths[name], records(name))
    paths["fewer"] = root / "fewer.jsonl"
    write_records(paths["fewer"], records("tree")[:-1])
    paths["oov"] = root / "oov.jsonl"
    bad = records("tree")[0]
    write_records(paths["oov"], [OutputRecord(bad.prompt_ids, bad.output_ids + (4096,))] + records("tree")[1:])
    paths["malformed"] = root / "malformed.jsonl"
    paths["malformed"].write_text('{"prompt_ids": [1, 2]}\n')
    return paths


def guard(checkpoints, candidate, stock, *extra):
    return main(["guard", "--target", str(checkpoints["target"]), "--candidate", str(candidate),
                 "--stock", str(stock), "--device", "cpu", "--resamples", "1000", *extra])


def test_lossless_passes_with_exit_0(checkpoints, files, capsys):
    assert guard(checkpoints, files["tree"], files["ar"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("token forcing (float32 scorer): PASS")


def test_fault_is_rejected_with_exit_1_and_json(checkpoints, files, capsys):
    assert guard(checkpoints, files["tree-bias"], files["ar"], "--json") == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["passed"] is False and verdict["violated"] == ["rate", "large-margin"]
    assert verdict["candidate"]["large_margin"] > 0 and verdict["stock"]["mismatches"] == 0


def test_flags_reach_the_config(checkpoints, files, capsys):
    # a margin of 100 pp and an allowance covering every mismatch let even the fault pass
    assert guard(checkpoints, files["tree-bias"], files["ar"], "--rate-margin-pp", "99", "--large-margin-allowance",
                 "100000", "--json", "--near-tie-nats", "0.25", "--chunk", "16") == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["near_tie_nats"] == 0.25 and verdict["rate_margin"] == 0.99


@pytest.mark.parametrize("candidate, stock, message", [
    ("missing", "ar", "does not exist"),
    ("malformed", "ar", "expected"),
    ("oov", "ar", "outside the vocabulary"),
    ("fewer", "ar", "not for the same prompts"),
])
def test_bad_input_exits_2(checkpoints, files, capsys, tmp_path, candidate, stock, message):
    cand = files.get(candidate, tmp_path / "missing.jsonl")
    assert guard(checkpoints, cand, files[stock]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_unpaired_prompts_are_allowed_on_request(checkpoints, files, capsys):
    assert guard(checkpoints, files["fewer"], files["ar"], "--pairing", "auto") == 0
    assert "caution: candidate and stock prompts differ" in capsys.readouterr().out


def test_bad_target_and_flags_exit_2(checkpoints, files, tmp_path, capsys):
    assert main(["guard", "--target", str(tmp_path / "nope"), "--candidate", str(files["tree"]),
                 "--stock", str(files["ar"])]) == 2
    assert guard(checkpoints, files["tree"], files["ar"], "--confidence", "1.5") == 2
    with pytest.raises(SystemExit) as exc:
        guard(checkpoints, files["tree"], files["ar"], "--dtype", "int8")
    assert exc.value.code == 2


def test_generate_save_jsonl_feeds_guard(checkpoints, tmp_path, capsys):
    paths = {}
    systems = (("ar", ["--drafter", "none"]), ("tree", []), ("bias", ["--fault", "logit-bias:2:every=7:after=3"]))
    for name, extra in systems:
        paths[name] = tmp_path / f"{name}.jsonl"
        assert main(["generate", "--target", str(checkpoints["target"]), "--drafter", str(checkpoints["drafter"]),
                     "--device", "cpu", "--prompt", "Question: 2+2?", "--prompt", "def f(x):", "--max-new-tokens", "16",
                     "--save-jsonl", str(paths[name]), *extra]) == 0
    capsys.readouterr()
    assert guard(checkpoints, paths["tree"], paths["ar"]) == 0
    assert guard(checkpoints, paths["bias"], paths["ar"]) == 1
