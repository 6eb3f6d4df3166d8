"""The `kernel_table` knob: it needs Triton kernels, every swapped projection of the target reads it, and one with nothing to read is a notice."""

import json
import warnings

import pytest

from specpilot.config import Kernel, System
from specpilot.engine.session import table_notice, with_kernels
from specpilot.errors import ConfigError, Notice
from specpilot.kernels import user_cache
from specpilot.models.random_checkpoint import random_model, tiny_config


def test_a_kernel_table_needs_triton_kernels_and_changes_the_fingerprint():
    with pytest.raises(ConfigError, match="kernel_table needs kernel = 'triton'"):
        System(kernel_table="/tmp/t.json")
    plain, tuned = System(kernel=Kernel.TRITON), System(kernel=Kernel.TRITON, kernel_table="/tmp/t.json")
    assert plain.fingerprint() != tuned.fingerprint() and tuned.diff(plain) == {"kernel_table": ["", "/tmp/t.json"]}
    assert System.from_dict(tuned.knobs()) == tuned.with_changes(name="stock")


@pytest.mark.parametrize("w12", [False, True])
def test_every_swapped_projection_reads_the_systems_table(monkeypatch, w12):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # swapping needs no kernel launch
    model = random_model(tiny_config(num_layers=2), seed=0)
    if w12:
        for p in model.parameters():
            p.data = p.data.bfloat16()
    system = System(kernel=Kernel.TRITON, w12=w12, kernel_lm_head=True, kernel_table="/tmp/t.json")
    swapped = with_kernels(model, system)
    tables = [m.table for m in swapped.modules() if hasattr(m, "table")]
    assert len(tables) == 2 * 4 + 1 and set(tables) == {"/tmp/t.json"}
    assert not any(hasattr(m, "table") for m in model.modules())  # the shared model keeps cuBLAS


def test_a_kernel_table_with_nothing_to_read_is_a_notice(tmp_path, monkeypatch):
    """A missing file (a run resumed on another machine) and a table of other software versions
    each give one notice naming why; a readable table, no table, or CPU give none."""
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    missing = tmp_path / "gone.json"
    with pytest.warns(Notice, match="there is no such file"):
        table_notice(str(missing), "NVIDIA H200")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"entries": [], "versions": {"torch": "0.0"}}))
    with pytest.warns(Notice, match="tuned under other software versions"):
        table_notice(str(other), "NVIDIA H200")
    mine = user_cache.write_document(tmp_path / "mine.json", {"entries": []})
    with warnings.catch_warnings():
        warnings.simplefilter("error", Notice)
        table_notice(str(mine), "NVIDIA H200")
        table_notice("", "NVIDIA H200")
        table_notice(str(missing), "")  # CPU: no table is read
