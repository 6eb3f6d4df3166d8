"""`specpilot generate` end to end on the random test target: system files, and foreign CPU load."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.cli import main
from specpilot.control import load
from specpilot.engine.generator import Generator


def test_a_system_file_with_ngram_and_adaptive_depth_generates(capsys, target_dir, tmp_path):
    """Issue 56's reproduction: prompt lookup with depth tiers crashed on the first tier switch."""
    system = tmp_path / "tiers.toml"
    system.write_text('drafter = "ngram"\nadaptive_depth = [3, 7]\n')
    code = main(["generate", "--target", str(target_dir), "--system", str(system), "--prompt", "a b c a b c a b",
                 "--max-new-tokens", "40", "--device", "cpu", "--compare-ar", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["knobs"]["adaptive_depth"] == [3, 7] and report["identical_to_ar"]


def test_an_existing_save_jsonl_file_is_refused_before_any_model_loads(monkeypatch, capsys, target_dir, tmp_path):
    """Issue 56: `--save-jsonl FILE` refused an existing FILE only after generating; it is refused
    first (one `error:` line, exit 2, the file as it was), and `--overwrite` still lets it through."""
    from specpilot.engine.session import Session

    out = tmp_path / "outputs.jsonl"
    out.write_text("kept\n")
    loads = []

    def load(cls, *args, **kwargs):
        loads.append(args)
        raise RuntimeError("the models were loaded before the file was checked")

    monkeypatch.setattr(Session, "load", classmethod(load))
    argv = ["generate", "--target", str(target_dir), "--prompt", "a b", "--max-new-tokens", "4", "--device", "cpu",
            "--save-jsonl", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: {out}: already exists (pass --overwrite to replace it)\n"
    assert loads == [] and out.read_text() == "kept\n"
    with pytest.raises(RuntimeError, match="loaded"):
        main([*argv, "--overwrite"])


@pytest.fixture
def two_threads():
    """torch on two threads while the test runs (the session's fixture gives it one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def loaded(monkeypatch, share: float) -> list[int]:
    """Others use `share` of the CPU, by the load probe (nothing burns CPU); the list fills with
    torch's thread count at each `Generator.generate`."""
    monkeypatch.setattr(load, "default_probe", lambda: load.FixedProbe(share=share, loadavg=4.2))
    threads, generate = [], Generator.generate
    monkeypatch.setattr(Generator, "generate", lambda self, *a, **k: threads.append(torch.get_num_threads())
                        or generate(self, *a, **k))
    return threads


@pytest.mark.usefixtures("two_threads")
def test_under_foreign_load_torch_fits_the_free_cores_and_one_line_warns(monkeypatch, capsys, target_dir):
    threads = loaded(monkeypatch, 0.99)
    code = main(["generate", "--target", str(target_dir), "--prompt", "a b a b", "--max-new-tokens", "8",
                 "--device", "cpu", "--compare-ar"])
    err = capsys.readouterr().err.splitlines()
    assert code == 0 and threads and set(threads) == {1}  # every run on the one core the others left
    assert torch.get_num_threads() == 2  # and put back afterwards
    warnings = [line for line in err if line.startswith("warning:")]
    assert len(warnings) == 1 and err[-1] == warnings[0]
    assert "99% of the CPU" in warnings[0] and "not trustworthy" in warnings[0] and "1 of torch's 2" in warnings[0]
    assert any("speedup vs AR" in line for line in err)  # still printed, with the warning (the documented rule)


@pytest.mark.usefixtures("two_threads")
def test_under_foreign_load_json_carries_the_load(monkeypatch, capsys, target_dir):
    loaded(monkeypatch, 0.99)
    code = main(["generate", "--target", str(target_dir), "--prompt", "a b", "--max-new-tokens", "4",
                 "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    cpu_load = json.loads(out)["cpu_load"]
    assert code == 0 and cpu_load["foreign"] and cpu_load["torch_threads"] == 1 and cpu_load["default_threads"] == 2
    assert cpu_load["other_cpu_share"] == pytest.approx(0.99, abs=0.01) and err.startswith("warning:")


@pytest.mark.usefixtures("two_threads")
def test_on_a_quiet_cpu_nothing_changes(monkeypatch, capsys, target_dir):
    threads = loaded(monkeypatch, 0.02)
    code = main(["generate", "--target", str(target_dir), "--prompt", "a b", "--max-new-tokens", "4",
                 "--device", "cpu", "--compare-ar"])
    err = capsys.readouterr().err
    assert code == 0 and set(threads) == {2} and "warning" not in err and "speedup vs AR" in err
