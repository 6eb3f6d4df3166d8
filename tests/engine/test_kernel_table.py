"""The `kernel_table` knob: it needs Triton kernels, and every swapped projection of the target reads it."""

import pytest

from specpilot.config import Kernel, System
from specpilot.engine.session import with_kernels
from specpilot.errors import ConfigError
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
