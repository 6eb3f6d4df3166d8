"""A --device this machine cannot use is one `error:` line and exit 2, for every command that takes one
(resolved once, in `env.resolve_device`)."""

from __future__ import annotations

import pytest
import torch

from specpilot import env
from specpilot.cli import main
from specpilot.errors import ConfigError

# a device no machine here has: on a CPU-only torch "no CUDA", on a GPU machine "index out of range"
MISSING = "cuda:99"


def one_error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_resolve_device_names_the_problem(monkeypatch):
    assert env.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="unknown device 'gpu'"):
        env.resolve_device("gpu")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with pytest.raises(ConfigError, match="CPU-only build"):
        env.resolve_device("cuda")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        env.resolve_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"only 2 CUDA GPU\(s\) visible"):
        env.resolve_device("cuda:2")
    assert env.resolve_device("cuda:1") == torch.device("cuda:1")
    monkeypatch.setenv("SPECPILOT_DEVICE", "tpu7")
    with pytest.raises(ConfigError, match="unknown device 'tpu7'"):
        env.resolve_device(None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_generate_device_cuda_without_cuda(capsys, target_dir):
    code = main(["generate", "--target", str(target_dir), "--prompt", "x", "--device", "cuda"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and "device 'cuda'" in line and "use cpu" in line
    assert "CPU-only build" in line or "no CUDA GPU is visible" in line


@pytest.mark.parametrize("command", [
    ["generate", "--prompt", "x"],
    ["bench", "--n-prompts", "1", "--max-new-tokens", "2", "--no-progress"],
    ["w12", "convert", "SRC", "DST"],
])
def test_every_device_flag_is_checked(command, capsys, target_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    argv = [str(target_dir) if a == "SRC" else str(tmp_path / "w12") if a == "DST" else a for a in command]
    if command[0] == "generate":
        argv += ["--target", str(target_dir)]
    assert main([*argv, "--device", MISSING]) == 2
    assert "cuda:99" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "home" / "runs").exists() and not (tmp_path / "w12").exists()  # bench: no empty out dir


def test_guard_device(capsys, tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text('{"prompt_ids": [1, 2], "output_ids": [3]}\n')
    code = main(["guard", "--target", "fixture", "--candidate", str(records), "--stock", str(records),
                 "--device", MISSING])
    assert code == 2 and "cuda:99" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["run", "--no-final"], ["evaluate", "--candidate", "stock"]])
def test_worker_devices_are_checked(command, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    assert main([*command, "--devices", f"cpu,{MISSING}"]) == 2
    assert "cuda:99" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "home").exists()  # refused before any directory or memory is made
