"""Triton projection kernels: W12 and plain-BF16 GEMV (1-8 rows) and tensor-core GEMM (up to 64 rows);
split-KV attention over a static cache.

Files: `tiles.py` (shared @triton.jit pieces), `gemv.py`, `gemm.py`, `w12_unpack.py` (kernels,
each with launcher and reference), `reference.py` (pure-torch reference and error bound),
`escape_blocks.py` (W12 escapes regrouped per row block for the GEMM and the GEMV),
`configs.py` (launch configs, heuristic, tuned tables; the shipped tables in `tuned/`),
`user_cache.py` (tables tuned on this machine, under $SPECPILOT_HOME, by versions), `tma.py` (tensor
descriptors of the GEMM's TMA loads), `launch.py` (operands, split-K plan), `workspace.py`
(split-K scratch), `dispatch.py` (choice by M), `op.py` (a projection as one custom op, opaque to
torch.compile), `aot.py` (compiling every variant without a GPU),
`search.py` (the launch-config search and the tuned tables it writes), `timing.py` (CUDA-graph
timing, and the checked timer the search runs on a GPU), `shape_tuning.py` (a deployment's
projection shapes tuned within a budget, largest excess over the byte floor first; the GPU bench on
its own weights), `attention.py` (split-KV attention for
calls with few queries, as one custom op; its kernels in `attention_kernel.py`), `draft_layer.py` (a
draft model's decoder layer in four fused kernels for few rows, as custom ops; its kernels in
`draft_layer_kernel.py`).
The modules that route a model's projections to these kernels live in `specpilot.models.linear`.

Importing this package imports neither Triton nor anything that needs a GPU; kernel modules are
imported on first use.
"""

from specpilot.kernels.configs import (
    Fallback,
    KernelPath,
    LaunchConfig,
    WeightFormat,
    choose_config,
)
from specpilot.kernels.dispatch import kernels_available, linear

__all__ = [
    "Fallback",
    "KernelPath",
    "LaunchConfig",
    "WeightFormat",
    "choose_config",
    "kernels_available",
    "linear",
]
