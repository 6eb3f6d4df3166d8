"""Shared by the GPU tests (marked `gpu`; skipped without CUDA by tests/conftest.py)."""

import pytest
import torch


@pytest.fixture(scope="module")
def full_precision():
    """float32 matmuls in float32 (no TF32) while these tests run."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32 = before[0]
    torch.set_float32_matmul_precision(before[1])
