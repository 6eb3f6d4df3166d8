"""Engine tests: the Triton kernels (projections, split-KV attention) run on CPU under Triton's
interpreter where there is no GPU."""

import importlib
import importlib.util
import sys

import pytest
import torch

from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint, write_truncated_drafter

# Triton fixes interpreted vs compiled when `triton.language` is first imported, which Dynamo does:
# without CUDA, import it under TRITON_INTERPRET=1 now, at collection (as tests/kernels/conftest.py).
if not torch.cuda.is_available() and importlib.util.find_spec("triton") and "triton.language" not in sys.modules:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        importlib.import_module("triton.language")


@pytest.fixture
def interpreted_kernels(interpreter):
    """The Triton kernels on CPU, under the interpreter (`tests/conftest.interpreter`)."""
    interpreter("specpilot.kernels.gemv", "_gemv_kernel")


@pytest.fixture
def traced(monkeypatch):
    """Graphs Dynamo captured (a counting backend that runs them as they are: `ops.STATIC_BACKEND`)."""
    from specpilot.models import ops

    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(ops, "STATIC_BACKEND", backend)
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def target(target_dir):
    """The random test target (float32, CPU), loaded once per module."""
    return load_model(target_dir)


@pytest.fixture(scope="module")
def draft(drafter_dir):
    """The random test drafter (float32, CPU), loaded once per module."""
    return load_model(drafter_dir)


@pytest.fixture(scope="module")
def bf16_dirs(tmp_path_factory):
    """A two-layer target with exactly-BF16 weights (W12 encodes nothing else) and a one-layer drafter."""
    root = tmp_path_factory.mktemp("bf16")
    target = write_random_checkpoint(root / "target", tiny_config(num_layers=2), seed=0, dtype=torch.bfloat16)
    return target, write_truncated_drafter(target, root / "drafter", num_layers=1)
