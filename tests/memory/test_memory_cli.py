"""`specpilot memory list|show|export` on a database written through the API."""

import json

import pytest

from memory_fixtures import CONFIG, evaluation, fingerprint, spec
from specpilot.control.rule import Outcome
from specpilot.cli import main as specpilot_main
from specpilot.memory.store import Memory


def run_cli(argv) -> int:
    """The real `specpilot` entry point (parsing, dispatch, errors as one line on stderr)."""
    return specpilot_main(argv)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "m.sqlite"
    with Memory(path) as m:
        m.record_evaluation(fingerprint("alpha"), evaluation(spec("deep", depth=8), gain=0.12), CONFIG, round="r1")
        m.record_evaluation(fingerprint("alpha"), evaluation(spec("slow", depth=2), gain=-0.03,
                                                             verdict=Outcome.REJECT), CONFIG, round="r1")
        m.record_evaluation(fingerprint("beta", gpu="NVIDIA H100"), evaluation(spec("lossy", fault="x"), passed=False),
                            CONFIG, round="r2")
    return str(path)


def test_list_table_and_filters(db, capsys):
    assert run_cli(["memory", "list", "--memory", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["id", "created"] and len(lines) == 4
    assert "lossy" in lines[1] and "reject" in lines[1] and "+12.01%" in lines[3]
    assert run_cli(["memory", "list", "--memory", db, "--deployment", "alpha", "--verdict", "promote", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["candidate"], r["verdict"], r["round"]) for r in rows] == [("deep", "promote", "r1")]


def test_show_prints_the_numbers(db, capsys):
    assert run_cli(["memory", "show", "1", "--memory", db]) == 0
    out = capsys.readouterr().out
    assert "deep" in out and '"depth": [5, 8]' in out and "verdict     PROMOTE" in out and "gain        +12.01%" in out
    assert run_cli(["memory", "show", "3", "--memory", db, "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["verdict"] == "reject" and entry["guard_passed"] is False and entry["reasons"] == ["guard-failed"]


def test_deployments_ranked_by_similarity_to_one(db, tmp_path, capsys):
    with Memory(db) as m:  # alpha with another token budget and a version bump: alike, below alpha itself
        m.record_evaluation(fingerprint("alpha-v2", torch="2.14"), evaluation(spec("deep", depth=8)), CONFIG)
    assert run_cli(["memory", "deployments", "--memory", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[1:]] == ["alpha", "beta", "alpha-v2"]
    assert run_cli(["memory", "deployments", "--memory", db, "--like", "alpha", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["similarity"], r["seeds"]) for r in rows] == [("alpha-v2", 0.95, True), ("beta", 0.8, True)]
    assert rows[0]["differences"] == "same target and drafter, torch 2.13 vs 2.14"
    assert rows[0]["evaluations"] == 1 and rows[0]["promotions"] == 1
    assert run_cli(["memory", "deployments", "--memory", db, "--like", "alpha"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "similarity  differences" in out[0] and out[1].split()[1] == "alpha-v2" and "0.95" in out[1]
    assert run_cli(["memory", "deployments", "--memory", db, "--like", "gamma"]) == 2
    assert capsys.readouterr().err.startswith("error: --like 'gamma' matches 0 stored deployments")


def test_export_to_file(db, tmp_path):
    out = tmp_path / "export.json"
    assert run_cli(["memory", "export", "--memory", db, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["evaluations"]) == 3 and len(data["deployments"]) == 2



def test_an_export_imports_into_another_memory(db, tmp_path, capsys):
    """`memory import FILE`: another machine's export merged in (a new database is created), the
    counts printed; the same file again adds nothing; a file that is no export is one error line,
    the memory as it was."""
    out, other = tmp_path / "export.json", tmp_path / "elsewhere" / "m.sqlite"
    assert run_cli(["memory", "export", "--memory", db, "--out", str(out)]) == 0
    assert run_cli(["memory", "import", str(out), "--memory", str(other)]) == 0
    assert capsys.readouterr().out.strip().startswith(f"imported into {other}: 3 evaluations, 0 noise floors, "
                                                      "4 systems, 2 deployments (0 already held); 0 kernel table")
    assert run_cli(["memory", "import", str(out), "--memory", str(other)]) == 0
    assert ": 0 evaluations, 0 noise floors, 0 systems, 0 deployments (9 already held)" in capsys.readouterr().out
    for bad, message in ((tmp_path / "missing.json", "error: cannot read "), (tmp_path / "bad.json", "is not JSON"),
                         (tmp_path / "list.json", "error: not a memory export")):
        if bad.name != "missing.json":
            bad.write_text("{" if bad.name == "bad.json" else "[]")
        assert run_cli(["memory", "import", str(bad), "--memory", str(other)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    with Memory(other) as m:
        assert len(m.export()["evaluations"]) == 3

def test_bad_input(db, tmp_path, capsys):
    assert run_cli(["memory", "show", "42", "--memory", db]) == 2
    assert capsys.readouterr().err.strip() == f"error: no memory entry 42 in {db}"
    assert run_cli(["memory", "list", "--memory", str(tmp_path / "none.sqlite")]) == 2
    assert "no memory database at" in capsys.readouterr().err


def test_tables_are_as_wide_as_their_content(db, capsys):
    """Issue 56: `memory list` cut candidate names at 20 characters (and deployment names at 16,
    rounds at 8); every column is now as wide as its widest cell, and the columns stay aligned."""
    long_candidate, long_deployment = "stock+depth=3+topk=2+tree_budget=12", "a-deployment-with-a-long-name"
    with Memory(db) as m:
        m.record_evaluation(fingerprint(long_deployment, gpu="NVIDIA H100 80GB HBM3"),
                            evaluation(spec(long_candidate, depth=3)), CONFIG, round="20261207T120000Z-fixture/r12")
    assert run_cli(["memory", "list", "--memory", db]) == 0
    header, newest, *_ = capsys.readouterr().out.splitlines()
    assert f"  {long_deployment}  {long_candidate}  " in newest and newest.endswith("20261207T120000Z-fixture/r12")
    assert newest.index(long_candidate) == header.index("candidate")  # aligned under its header
    assert run_cli(["memory", "deployments", "--memory", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    gpu = lines[0].index("gpu")
    assert [line[gpu:].split("  ")[0] for line in lines[1:]] == ["NVIDIA H200", "NVIDIA H100", "NVIDIA H100 80GB HBM3"]
    assert lines[-1].split()[1] == long_deployment


def test_like_with_nothing_to_compare_says_so(tmp_path, capsys):
    """Issue 56: `deployments --like NAME` with no other deployment stored printed only a header;
    it says in one line that there is nothing to compare with, and how to get something, exit 0."""
    path = tmp_path / "one.sqlite"
    with Memory(path) as m:
        m.record_evaluation(fingerprint("alpha"), evaluation(spec("deep", depth=8)), CONFIG, round="r1")
    assert run_cli(["memory", "deployments", "--memory", str(path), "--like", "alpha"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.count("\n") == 1 and out.startswith(f"no other deployment in {path} to compare 'alpha'")
    assert "specpilot memory import" in out
    assert run_cli(["memory", "deployments", "--memory", str(path), "--like", "alpha", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
