"""Which computation an FP8 projection runs: a small registry of backends by name.

Owns `FP8Kernel` (the names), `FP8Backend` (the interface: `why_not` says whether it can run for
these operands, `run` computes y [M, N]), the registry, `resolve` (`auto` -> the Triton
weight-only kernel on CUDA, the reference elsewhere: on CPU the reference stays the default, and
the kernels run there only when named, under TRITON_INTERPRET=1; should the Triton kernel raise
on a device, outside a graph capture, `auto` warns once and takes the reference for the rest of
the process, while a kernel named explicitly raises), and `specpilot::fp8_linear`,
the custom op that keeps torch.compile out of the kernels' launch code (as `op.py` does for W12).

Backends:
  - `reference`: W dequantized by `FP8Weight`'s rule, rounded once to x's dtype, then `F.linear`
    -- the definition of the FP8 target (`models.fp8_linear`); every other backend is judged
    against it.
  - `triton`: the weight-only kernel (`fp8_gemm`): e4m3 weights, activations as they are, fp32
    accumulation, scales in fp32 (no rounding of the weights to x's dtype: within fp32
    accumulation rounding of the float32 dequantize-then-matmul).
  - `w8a8-triton`: activations quantized per token and scale group (`fp8_activations`), then the
    same kernel on e4m3 x e4m3.
  - `w8a8-scaled-mm`: the same activations, `torch._scaled_mm` with row-wise scales (cuBLASLt /
    CUTLASS on sm_89+; per-channel weights only).
The W8A8 backends compute a different function of the checkpoint (quantized activations): they
exist where a layout says W8A8 and for timing; `auto` never picks them.

Does not own the kernels (`fp8_gemm`), the activation rule (`fp8_activations`) or the module
(`models.fp8_linear`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.errors import ConfigError


class FP8Kernel(enum.Enum):
    AUTO = "auto"
    REFERENCE = "reference"
    TRITON = "triton"
    W8A8_TRITON = "w8a8-triton"
    W8A8_SCALED_MM = "w8a8-scaled-mm"


def parse_kernel(name: str | FP8Kernel) -> FP8Kernel:
    """An `FP8Kernel` from its name (ConfigError listing the names otherwise)."""
    if isinstance(name, FP8Kernel):
        return name
    try:
        return FP8Kernel(name)
    except ValueError:
        raise ConfigError(f"unknown FP8 kernel {name!r} (one of: {', '.join(k.value for k in FP8Kernel)})") from None


@dataclass(frozen=True)
class FP8Backend:
    """One way to compute y [M, N] = x [M, K] @ W.T for e4m3 codes [N, K] with scales [N, Kb]."""
    kernel: FP8Kernel
    why_not: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], str | None]  # None: it can run
    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]  # y in x's dtype


_REGISTRY: dict[FP8Kernel, FP8Backend] = {}


def register(backend: FP8Backend) -> None:
    _REGISTRY[backend.kernel] = backend


def backend(kernel: FP8Kernel) -> FP8Backend:
    return _REGISTRY[kernel]


# why `auto` stopped taking the Triton kernel in this process (its first run raised), or None
_AUTO_FALLBACK: str | None = None


def resolve(kernel: FP8Kernel, x: torch.Tensor) -> FP8Kernel:
    """`auto` -> `triton` for CUDA activations (Triton installed, and its first run in this process
    did not fail), else `reference`; others as named."""
    if kernel is not FP8Kernel.AUTO:
        return kernel
    from specpilot.kernels.dispatch import triton_installed

    ok = x.is_cuda and triton_installed() and _AUTO_FALLBACK is None
    return FP8Kernel.TRITON if ok else FP8Kernel.REFERENCE


def _auto_fails(error: Exception) -> None:
    """`auto`'s Triton run raised (a compiler or driver the kernel does not support): warn once and
    take the reference rule from now on in this process (a named `triton` kernel still raises)."""
    global _AUTO_FALLBACK
    import warnings

    _AUTO_FALLBACK = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    warnings.warn(f"FP8 kernel 'auto': the Triton kernel failed ({_AUTO_FALLBACK}); FP8 projections take the "
                  "reference rule (dequantize, then F.linear) in this process", RuntimeWarning, stacklevel=3)


def linear(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, block_k: int,
           kernel: FP8Kernel = FP8Kernel.AUTO) -> torch.Tensor:
    """x [..., K] @ W.T -> [..., N] in x's dtype by `kernel` (resolved); ValueError naming the
    kernel and the reason where it cannot run for these operands."""
    asked, kernel = kernel, resolve(kernel, x)
    N, K = data.shape
    if torch.compiler.is_compiling() and kernel is not FP8Kernel.REFERENCE:
        return torch.ops.specpilot.fp8_linear(x, data, scale, block_k, kernel.value)
    x2d = x.reshape(-1, K)  # [M, K]
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    chosen = backend(kernel)
    reason = chosen.why_not(x2d, data, scale, block_k)
    if reason is not None:
        raise ValueError(f"FP8 kernel {kernel.value!r} cannot run here: {reason}")
    try:
        y = chosen.run(x2d, data, scale, block_k)
    except Exception as e:  # noqa: BLE001 -- only `auto` falls back, and only outside a graph capture
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if asked is not FP8Kernel.AUTO or kernel is FP8Kernel.REFERENCE or capturing:
            raise
        _auto_fails(e)
        y = backend(FP8Kernel.REFERENCE).run(x2d, data, scale, block_k)
    return y.reshape(*x.shape[:-1], N)


@torch.library.custom_op("specpilot::fp8_linear", mutates_args=())
def _fp8_linear_op(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, block_k: int,
                   kernel: str) -> torch.Tensor:
    return linear(x, data, scale, block_k, FP8Kernel(kernel))


@_fp8_linear_op.register_fake
def _(x, data, scale, block_k, kernel):
    return x.new_empty(*x.shape[:-1], data.shape[0])


# -- backends ---------------------------------------------------------------------------------
def _dequantize(data: torch.Tensor, scale: torch.Tensor, block_k: int, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] by `FP8Weight.dequantize`'s rule: code * scale in float32, rounded once to dtype."""
    K = data.shape[1]
    return (data.float() * scale.repeat_interleave(block_k, dim=1)[:, :K]).to(dtype)


def _kernel_problem(x, data, scale, block_k) -> str | None:
    """Why the Triton kernel cannot take these operands (device, malformed operands), or None."""
    from specpilot.kernels.dispatch import kernels_available
    from specpilot.kernels.fp8_gemm import check_operands

    if not kernels_available(x):
        return "needs a CUDA device, or the CPU interpreter (TRITON_INTERPRET=1), and Triton"
    try:
        check_operands(x, data, scale, block_k)
    except ValueError as err:
        return str(err)
    return None


def _triton(x, data, scale, block_k):
    from specpilot.kernels.fp8_gemm import fp8_gemm

    return fp8_gemm(x, data, scale, block_k)


def _w8a8_triton(x, data, scale, block_k):
    from specpilot.kernels.fp8_activations import quantize_activations
    from specpilot.kernels.fp8_gemm import fp8_gemm

    codes, x_scale = quantize_activations(x, min(block_k, x.shape[1]))
    return fp8_gemm(codes, data, scale, block_k, x_scale=x_scale, out_dtype=x.dtype)


def _scaled_mm_problem(x, data, scale, block_k) -> str | None:
    N, K = data.shape
    if not x.is_cuda or torch.cuda.get_device_capability(x.device) < (8, 9):
        return "torch._scaled_mm needs a CUDA GPU of compute capability 8.9 or newer"
    if block_k < K:
        return f"torch._scaled_mm takes row-wise (per-channel) weight scales, not blocks of {block_k} columns"
    if x.dtype != torch.bfloat16:
        return f"torch._scaled_mm with row-wise scales writes bf16; activations are {x.dtype}"
    if N % 16 or K % 16:
        return f"torch._scaled_mm needs N and K multiples of 16, got [{N}, {K}]"
    return _kernel_problem(x, data, scale, block_k)


def _scaled_mm(x, data, scale, block_k):
    from specpilot.kernels.fp8_activations import quantize_activations

    codes, x_scale = quantize_activations(x, x.shape[1])  # [M, K] e4m3, [M, 1]
    return torch._scaled_mm(codes, data.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype)


register(FP8Backend(FP8Kernel.REFERENCE, lambda x, d, s, b: None,
                    lambda x, d, s, b: F.linear(x, _dequantize(d, s, b, x.dtype))))
register(FP8Backend(FP8Kernel.TRITON, _kernel_problem, _triton))
register(FP8Backend(FP8Kernel.W8A8_TRITON, _kernel_problem, _w8a8_triton))
register(FP8Backend(FP8Kernel.W8A8_SCALED_MM, _scaled_mm_problem, _scaled_mm))
