"""The memory a CPU load needs, against MemAvailable, checked before loading (`engine.memory_check`):
the estimate is the loaded parameters' bytes exactly for a target and a draft model, widened or not
(a target made FP8 at load: its float32 load and its codes); refuse above what is available, note
above WARN_SHARE of it; `run` and `evaluate` refuse fixture-x16 on a machine that cannot hold their
copies before anything is loaded or made."""

from __future__ import annotations

import warnings

import pytest
import torch

from specpilot import env
from specpilot.cli import main
from specpilot.config import Deployment, load_deployment
from specpilot.engine import memory_check
from specpilot.engine.memory_check import PROCESS_BYTES, available_bytes, check_memory, weight_bytes
from specpilot.engine.session import Session
from specpilot.errors import ConfigError, Notice


def test_mem_available_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683772 kB\nMemFree:        22328692 kB\nMemAvailable:   22876072 kB\n")
    assert available_bytes(meminfo) == 22876072 * 1024
    meminfo.write_text("MemTotal:       24683772 kB\n")  # an old kernel
    assert available_bytes(meminfo) is None and available_bytes(tmp_path / "missing") is None


@pytest.mark.parametrize("factor", [1, 2])
def test_the_estimate_is_the_loaded_parameters(target_dir, drafter_dir, factor):
    """Target and draft model widened `factor` times: exactly the bytes of their loaded parameters."""
    dep = Deployment(name="tiny", target=str(target_dir), drafter=str(drafter_dir), target_expand=factor,
                     drafter_expand=factor)
    session = Session.load(dep, device="cpu")
    loaded = sum(p.numel() * p.element_size() for m in (session.target, session.drafter_model)
                 for p in m.parameters())
    assert weight_bytes(dep, torch.float32) == loaded
    assert weight_bytes(dep, torch.bfloat16) * 2 == loaded


def test_an_fp8_target_counts_its_float32_load_and_its_codes():
    """A target made FP8 at load: loaded in float32 whatever the dtype, one byte a weight beside it."""
    from dataclasses import replace

    from specpilot.config import TargetFormat
    from specpilot.models.config import ModelConfig
    from specpilot.models.expand import expanded_config
    from specpilot.models.fixture import fixture_path

    fp8 = load_deployment("fixture-x16-fp8")
    stored = replace(fp8, target_format=TargetFormat.STORED)
    params = expanded_config(ModelConfig.from_dir(fixture_path("target")), 16).num_params
    assert weight_bytes(fp8, torch.float32) == weight_bytes(stored, torch.float32) + params
    assert weight_bytes(fp8, torch.bfloat16) == weight_bytes(stored, torch.bfloat16) + 2 * params + params


def test_fixture_x16_on_a_cpu_is_17_gb_of_weights():
    """The issue's case: 18.9 GB peak in `bench` on a 23 GB machine (target 3.34B parameters in float32)."""
    assert 17.0e9 < weight_bytes(load_deployment("fixture-x16"), torch.float32) < 17.5e9


@pytest.fixture
def available(monkeypatch):
    """Set MemAvailable (bytes) for `check_memory`."""
    def set_to(n: int | None) -> None:
        monkeypatch.setattr(memory_check, "available_bytes", lambda: n)

    return set_to


def test_refuse_above_what_is_available_note_above_the_share(available, monkeypatch):
    dep = load_deployment("fixture")
    need = 2 * (weight_bytes(dep, torch.float32) + PROCESS_BYTES)
    available(need - 1)
    with pytest.raises(ConfigError, match=r"loading fixture on the CPU needs about 1\.2 GB of memory \(2 x 0\.6 GB: "
                                          r"two processes, each .*; only 1\.2 GB is available \(MemAvailable\)"):
        check_memory(dep, "cpu", 2, "two processes")
    available(int(need / 0.8))
    with pytest.warns(Notice, match=r"80% of the 1\.4 GB available"):
        assert check_memory(dep, "cpu", 2, "two processes").needed == need
    available(int(need / 0.6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_memory(dep, "cpu", 2, "two processes")
    monkeypatch.setenv("SPECPILOT_MEMORY_CHECK", "0")  # the refusal becomes a note
    available(need - 1)
    with pytest.warns(Notice, match="100% of the"):
        check_memory(dep, "cpu", 2, "two processes")


def test_nothing_is_checked_on_a_gpu_or_without_meminfo(available):
    dep = load_deployment("fixture-x16")
    available(1)
    assert check_memory(dep, "cuda:0") is None  # the weights go to device memory
    available(None)
    assert check_memory(dep, "cpu") is None


@pytest.mark.parametrize("argv, copies", [
    (["run", "--devices", "cpu", "--quiet"], "2 x 17.6 GB: the loop's process and its shared worker"),
    (["evaluate", "--candidate", "stock", "--devices", "cpu"], "2 x 17.6 GB: this process (the guard's scorer)"),
])
def test_run_and_evaluate_refuse_fixture_x16_before_loading(argv, copies, available, home, monkeypatch, capsys):
    def load(cls, *args, **kwargs):
        pytest.fail("a model was loaded before the memory check")

    def past_the_check():  # what both commands do next: were the check gone, no worker would start either
        pytest.fail("the command went past the memory check")

    monkeypatch.setattr(Session, "load", classmethod(load))
    monkeypatch.setattr(env, "writable_home", past_the_check)
    available(23_000_000_000)
    assert main([*argv, "--deployment", "fixture-x16"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: loading fixture-x16 on the CPU needs about 35.2 GB of memory") and copies in line
    assert "only 23.0 GB is available" in line and not home.exists()  # nothing made either
