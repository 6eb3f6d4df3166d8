"""`specpilot run`: Ctrl-C in a round exits 130 and still writes the report; a refused --memory
or --coding-agent leaves no run directory behind (exit 2, one line)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from specpilot.cli import INTERRUPTED, main
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.loop import run as loop_run
from specpilot.loop.context import RunContext
from specpilot.loop.interrupt import INTERRUPT_LINE
from specpilot.loop.noise import NoiseChoice

pytestmark = pytest.mark.serial  # real workers timed under the process census; CI runs these after the parallel part


def quiet_setup(monkeypatch):
    """No noise-floor measurement (it starts worker processes): a stored-looking one instead."""

    def noise(ctx, *args, **kwargs):
        return NoiseChoice(floor=NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, 0.0, -0.0005), resamples=500),
                                            ctx.controller.procedure), id=None, load=None, per_evaluation=1.0)

    monkeypatch.setattr(loop_run, "choose_noise", noise)


ARGS = ["--devices", "cpu", "--rounds", "1", "--agents", "knob", "--no-final", "--quiet", "--profile-tokens", "4"]


@pytest.fixture
def python_handles_ctrl_c():
    """Python's own SIGINT handler, as in a terminal (a test process started in the background by a
    non-interactive shell inherits SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_a_round_exits_130_and_keeps_the_report(home, tmp_path, monkeypatch, capsys, target_dir,
                                                          python_handles_ctrl_c):
    quiet_setup(monkeypatch)

    def interrupted(self, candidate):  # Ctrl-C while the round profiles the incumbent
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)

    monkeypatch.setattr(RunContext, "measure", interrupted)
    dep = tmp_path / "tiny.toml"
    dep.write_text(f'name = "tiny"\ntarget = "{target_dir}"\ndrafter = "ngram"\nmax_new_tokens = 8\n')
    out = tmp_path / "run"
    assert main(["run", "--deployment", str(dep), "--out", str(out), *ARGS]) == INTERRUPTED
    printed, err = capsys.readouterr()
    assert "stopped: interrupted" in printed and (out / "report.md").is_file()
    assert err.splitlines()[0] == INTERRUPT_LINE  # acknowledged, though --quiet (issue 56)
    report = (out / "report.md").read_text()  # a CPU run: the knobs it did not run as set say what ran (issue 56)
    assert "cuda_graphs = true  # on cpu: false (" in report and 'kernel = "cublas"  # on cpu: "torch" (' in report


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


@pytest.mark.parametrize("command, message", [
    ("no-such-coding-agent -p {task_file}", "error: --coding-agent: no program 'no-such-coding-agent' on PATH"),
    ("/nowhere/agent --yes", "error: --coding-agent: /nowhere/agent is not an executable file"),
], ids=["not-on-path", "no-such-file"])
def test_a_coding_agent_that_does_not_exist_is_refused_up_front(home, tmp_path, monkeypatch, capsys, command, message):
    """Issue 56: `--coding-agent` took a program that does not exist (every round's agent then
    failed); it is refused before the run starts: one `error:` line, exit 2, nothing made."""
    from specpilot.cli import run as cli_run

    def started(flag):
        raise AssertionError("the run started")

    monkeypatch.setattr(cli_run, "worker_devices", started)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--coding-agent", command, *ARGS]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message)
    assert not out.exists() and not home.exists()
    with pytest.raises(AssertionError, match="the run started"):  # a program that exists passes the check
        main(["run", "--out", str(out), "--coding-agent", f"{sys.executable} agent.py {{task_file}}", *ARGS])
