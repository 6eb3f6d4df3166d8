"""An interrupted or failed command removes the output directories it created and left empty (and
nothing else); Ctrl-C exits 130 for `bench` as for every command."""

from __future__ import annotations

import pytest

from specpilot.cli import INTERRUPTED, main
from specpilot.cli import bench as bench_cli
from specpilot.cli.outdirs import removed_if_left_empty
from specpilot.errors import ConfigError


def test_only_new_empty_directories_are_removed(tmp_path):
    before = tmp_path / "before"
    before.mkdir()
    with pytest.raises(ConfigError):
        with removed_if_left_empty(before / "a" / "b", tmp_path / "c"):
            (before / "a" / "b").mkdir(parents=True)
            (tmp_path / "c").mkdir()
            (tmp_path / "c" / "partial.json").write_text("{}")
            raise ConfigError("failed")
    assert before.is_dir() and not (before / "a").exists()
    assert (tmp_path / "c" / "partial.json").is_file()  # something was written: kept
    with removed_if_left_empty(tmp_path / "ok"):
        (tmp_path / "ok").mkdir()
    assert (tmp_path / "ok").is_dir()  # success: nothing is removed


@pytest.fixture
def interrupted_bench(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))

    def interrupted(*args, **kwargs):  # Ctrl-C while the systems are being timed
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "benchmark", interrupted)


def test_interrupted_bench_exits_130_and_leaves_no_directory(interrupted_bench, tmp_path, capsys):
    assert main(["bench"]) == INTERRUPTED
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted"  # after the run's plan line
    assert not (tmp_path / "home").exists()  # not even $SPECPILOT_HOME/runs/bench
    existing = tmp_path / "existing"
    existing.mkdir()
    assert main(["bench", "--out", str(existing)]) == INTERRUPTED
    assert existing.is_dir()  # it was there before: kept


def test_standalone_bench_exits_130_too(interrupted_bench, tmp_path, capsys):
    assert bench_cli.main(["--out", str(tmp_path / "o")]) == INTERRUPTED
    assert "interrupted" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_resume_without_out_is_one_error_line_and_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    assert main(["run", "--resume", "--devices", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --resume continues the run in --out: name it (--out RUN_DIR)"]
    assert not (tmp_path / "home").exists()
