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
