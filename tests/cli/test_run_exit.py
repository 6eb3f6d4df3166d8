"""`specpilot run`: Ctrl-C in a round exits 130 and still writes the report; a refused --memory
leaves no run directory behind (exit 2, one line)."""

from __future__ import annotations

import pytest

from specpilot.cli import INTERRUPTED, main
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.loop import run as loop_run

pytestmark = pytest.mark.serial  # real workers timed under the process census; CI runs these after the parallel part


def quiet_setup(monkeypatch):
    """No noise-floor measurement (it starts worker processes): a stored-looking one instead."""

    def noise(self, *args, **kwargs):
        self.noise_id, self.per_evaluation = None, 1.0
        self.noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, 0.0, -0.0005), resamples=500),
                                self.controller.procedure)

    monkeypatch.setattr(loop_run._Run, "_noise", noise)


ARGS = ["--devices", "cpu", "--rounds", "1", "--agents", "knob", "--no-final", "--quiet", "--profile-tokens", "4"]


def test_ctrl_c_in_a_round_exits_130_and_keeps_the_report(home, tmp_path, monkeypatch, capsys, target_dir):
    quiet_setup(monkeypatch)

    def interrupted(self, candidate):  # Ctrl-C while the round profiles the incumbent
        raise KeyboardInterrupt

    monkeypatch.setattr(loop_run._Run, "measure", interrupted)
    dep = tmp_path / "tiny.toml"
    dep.write_text(f'name = "tiny"\ntarget = "{target_dir}"\ndrafter = "ngram"\nmax_new_tokens = 8\n')
    out = tmp_path / "run"
    assert main(["run", "--deployment", str(dep), "--out", str(out), *ARGS]) == INTERRUPTED
    printed = capsys.readouterr().out
    assert "stopped: interrupted" in printed and (out / "report.md").is_file()


def test_a_refused_memory_leaves_no_directories(home, tmp_path, capsys):
    bad = tmp_path / "memory.sqlite"
    bad.write_bytes(b"this is not a SQLite database" * 100)
    out = tmp_path / "runs" / "x"
    assert main(["run", "--out", str(out), "--memory", str(bad), *ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not a usable SpecPilot memory" in err[0]
    assert not (tmp_path / "runs").exists()  # neither --out nor the parent this invocation would have made
    assert not (home / "scratch").exists() and bad.read_bytes().startswith(b"this is not")


def test_an_early_failure_removes_only_what_it_created(home, tmp_path, capsys):
    existing = tmp_path / "existing"
    existing.mkdir()
    out = existing / "new" / "run"
    code = main(["run", "--out", str(out), "--gate", "specpilot.guard.no_such_module:gate", *ARGS])
    assert code == 2 and "token-forcing guard is needed" in capsys.readouterr().err
    assert existing.is_dir() and not (existing / "new").exists()
