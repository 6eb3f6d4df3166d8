"""One entry point for a projection y = x @ W.T with our kernels, choosing the path by M.

Owns: deciding whether the kernels can run at all (CUDA or the CPU interpreter, Triton installed),
the M-based dispatch (GEMV / tensor-core GEMM up to 64 rows via `configs.choose_config`; above
that, decode once and call cuBLAS), and importing the kernel modules lazily, so importing
`specpilot.kernels` never imports Triton.

Does not own the kernels, their configs, or the modules that call this (`specpilot.models.linear`,
`specpilot.models.w12_linear`).
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

from specpilot import env
from specpilot.kernels.configs import (
    GEMM_MAX_M,
    KernelPath,
    LaunchConfig,
    WeightFormat,
    choose_config,
)
from specpilot.w12.weight import W12Weight


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def kernels_available(x: torch.Tensor) -> bool:
    """Whether `linear` can run for activations like x: on CUDA, or on CPU under TRITON_INTERPRET=1."""
    return triton_installed() and (x.is_cuda or env.triton_interpret())


@functools.cache
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device: torch.device) -> str:
    """The GPU's name (selects its tuned config table); '' on CPU."""
    if device.type != "cuda":
        return ""
    return _cuda_name(device.index if device.index is not None else torch.cuda.current_device())


def dense(weight: W12Weight | torch.Tensor) -> torch.Tensor:
    """The plain [N, K] weight; W12 is unpacked by the Triton kernel (bit-exact)."""
    if isinstance(weight, W12Weight):
        from specpilot.kernels.w12_unpack import unpack

        return unpack(weight)
    return weight


def run_config(x2d: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig,
               escapes: str = "auto") -> torch.Tensor:
    """y [M, N] for x [M, K] with exactly this launch config (the benchmark's entry point);
    `escapes` as in `gemm.gemm` ("off" only for timing what escapes cost)."""
    if config.path is KernelPath.GEMV:
        from specpilot.kernels.gemv import gemv

        return gemv(x2d, weight, config, escapes=escapes)
    from specpilot.kernels.gemm import gemm

    return gemm(x2d, weight, config, escapes=escapes)


def linear(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig | None = None) -> torch.Tensor:
    """x [..., K] @ W [N, K].T -> [..., N] in x's dtype, float32 accumulation.

    Up to 64 rows run our GEMV/GEMM kernels (`config`, or the tuned/heuristic choice); more rows
    decode the weight once and use cuBLAS, since the product is then compute-bound.
    """
    N, K = weight.shape
    x2d = x.reshape(-1, K)  # [M, K]
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    M = x2d.shape[0]
    if M == 0:
        return x.new_empty(*x.shape[:-1], N)
    if M > GEMM_MAX_M:
        y = F.linear(x2d, dense(weight).to(x.dtype))
    else:
        fmt = WeightFormat.W12 if isinstance(weight, W12Weight) else WeightFormat.DENSE
        config = config or choose_config(fmt, M, N, K, device_name(x.device))
        y = run_config(x2d, weight, config)
    return y.reshape(*x.shape[:-1], N)
