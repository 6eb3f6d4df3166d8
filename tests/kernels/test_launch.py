"""specpilot.kernels.launch: when the kernels launch with programmatic dependent launch."""

import pytest
import torch

from specpilot.kernels import launch


@pytest.fixture
def gpu_of(monkeypatch):
    """Pretend cuda:0 has this compute capability."""
    def set_capability(major: int):
        monkeypatch.setattr(launch, "_capability", lambda index: (major, 0))
    return set_capability


def test_pdl_needs_the_variable_a_hopper_gpu_and_no_interpreter(monkeypatch, gpu_of):
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gpu_of(9)
    monkeypatch.delenv("SPECPILOT_PDL", raising=False)
    assert not launch.pdl(cuda)  # off unless asked for
    monkeypatch.setenv("SPECPILOT_PDL", "1")
    assert launch.pdl(cuda)
    assert not launch.pdl(torch.device("cpu"))
    gpu_of(8)
    assert not launch.pdl(cuda)  # griddepcontrol needs sm_90
    gpu_of(10)
    assert launch.pdl(cuda)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not launch.pdl(cuda)


def test_launch_options_add_the_attribute_only_with_pdl():
    assert launch.launch_options(True) == {"launch_pdl": True}
    assert launch.launch_options(False) == {}


def test_a_scope_decides_over_the_variable(monkeypatch, gpu_of):
    """A system's `pdl` knob opens `pdl_scope(True)`; a system without it opens `pdl_scope(None)`,
    where SPECPILOT_PDL still decides (a benchmark can force it process-wide)."""
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("SPECPILOT_PDL", raising=False)
    gpu_of(9)
    with launch.pdl_scope(True):
        assert launch.pdl(cuda)
        with launch.pdl_scope(None):
            assert not launch.pdl(cuda)
        assert launch.pdl(cuda)  # restored on exit
    assert not launch.pdl(cuda)
    monkeypatch.setenv("SPECPILOT_PDL", "1")
    with launch.pdl_scope(None):
        assert launch.pdl(cuda)
    with launch.pdl_scope(False):
        assert not launch.pdl(cuda)
    monkeypatch.delenv("SPECPILOT_PDL")
    with launch.knob_scope(True):  # a system's knob: on turns PDL on, off leaves the variable to decide
        assert launch.pdl(cuda)
    with launch.knob_scope(False):
        assert not launch.pdl(cuda)
        monkeypatch.setenv("SPECPILOT_PDL", "1")
        assert launch.pdl(cuda)
