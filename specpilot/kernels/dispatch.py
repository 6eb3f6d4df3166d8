"""One entry point for a projection y = x @ W.T with our kernels, choosing the path by M.

Owns: deciding whether the kernels can run at all (CUDA or the CPU interpreter, Triton installed),
the dispatch by M (`configs.choose`: GEMV / tensor-core GEMM with a launch config, or the weight
decoded into a cached buffer then cuBLAS, per the tuned table or the fallback rule), and importing
the kernel modules lazily, so importing `specpilot.kernels` never imports Triton.

Does not own the kernels, their configs, or the modules that call this (`specpilot.models.linear`,
`specpilot.models.w12_linear`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import weakref

import torch
import torch.nn.functional as F

from specpilot import env
from specpilot.kernels.configs import (
    Fallback,
    KernelPath,
    LaunchConfig,
    WeightFormat,
    choose,
)
from specpilot.w12.weight import W12Weight


# looked up once, at import: a compiled graph traces `kernels_available`, and a cached function
# there is one Dynamo steps over with a warning
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_installed() -> bool:
    return TRITON_INSTALLED


def kernels_available(x: torch.Tensor) -> bool:
    """Whether our Triton kernels can run on tensors like x (every kernel module's test): on CUDA, or
    on CPU under TRITON_INTERPRET=1."""
    return TRITON_INSTALLED and (x.is_cuda or env.triton_interpret())


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


def unpacked(weight: W12Weight | torch.Tensor) -> torch.Tensor:
    """The plain [N, K] weight for cuBLAS: W12 decoded (bit-exact) into the device's shared buffer
    (`workspace.unpack_buffer`), valid until the next projection decodes; plain weights as they are."""
    if isinstance(weight, W12Weight):
        from specpilot.kernels.w12_unpack import unpack
        from specpilot.kernels.workspace import unpack_buffer

        return unpack(weight, out=unpack_buffer(weight.device, *weight.shape))
    return weight


DECODED_RESERVE = 0.10  # share of a GPU's memory a kept copy must leave free; with less, decode at each call
_decoded: dict[int, torch.Tensor | None] = {}  # id(W12Weight) -> its BF16 copy (None: no room for one)


def room_for_copy(weight: W12Weight) -> bool:
    """Whether a BF16 copy of `weight` leaves DECODED_RESERVE of its GPU free (memory the caching
    allocator holds unused counts as free); always on CPU."""
    if weight.device.type != "cuda":
        return True
    free, total = torch.cuda.mem_get_info(weight.device)
    cached = torch.cuda.memory_reserved(weight.device) - torch.cuda.memory_allocated(weight.device)
    return free + cached - 2 * weight.shape[0] * weight.shape[1] >= DECODED_RESERVE * total


def decoded(weight: W12Weight | torch.Tensor) -> torch.Tensor:
    """The plain [N, K] weight, for W12 decoded on first use and kept while the W12Weight lives
    (`Fallback.DECODED_CUBLAS`: BF16's memory beside W12's, for cuBLAS at BF16's speed). Where the
    copy would not leave `DECODED_RESERVE` of the GPU free, the weight decodes into the shared
    buffer at each call instead (`unpacked`), decided once per weight; the values are the same."""
    if not isinstance(weight, W12Weight):
        return weight
    key = id(weight)
    if key not in _decoded:
        _decoded[key] = dense(weight) if room_for_copy(weight) else None
        weakref.finalize(weight, _decoded.pop, key, None)
    copy = _decoded[key]
    return copy if copy is not None else unpacked(weight)


def kept_copy(weight: W12Weight | torch.Tensor) -> bool:
    """Whether a decoded BF16 copy of this W12 weight is kept (`decoded`)."""
    return isinstance(weight, W12Weight) and _decoded.get(id(weight)) is not None


_PREFILL: contextvars.ContextVar[bool] = contextvars.ContextVar("specpilot_prefill", default=False)


@contextlib.contextmanager
def prefill_scope():
    """Calls within take cuBLAS on a W12 weight's kept decoded copy over the kernels (`eager_copy`):
    for an eager prefill, which pays the kernels' host-side launch (Python, descriptors) at every
    call where a captured step pays it once. Not for a step's warm-up before its capture: that
    runs the kernels, so that they are compiled and their derived data (escape blocks) built
    outside the capture."""
    token = _PREFILL.set(True)
    try:
        yield
    finally:
        _PREFILL.reset(token)


def eager_copy(x2d: torch.Tensor, weight: W12Weight | torch.Tensor) -> bool:
    """Whether this call takes cuBLAS on the kept copy, without asking `choose`: within
    `prefill_scope`, no CUDA graph being captured, on a W12 weight whose decoded copy is kept (a
    call above RULE_MAX_M rows made it; none is made for this one)."""
    return _PREFILL.get() and kept_copy(weight) and not capturing(x2d)


def capturing(x: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on x's device's current stream."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def run_fallback(x2d: torch.Tensor, weight: W12Weight | torch.Tensor, fallback: Fallback) -> torch.Tensor:
    """y [M, N] for x [M, K] by cuBLAS on the decoded weight: decoded into the shared buffer at
    this call, or kept decoded (bit-exact either way)."""
    w = decoded(weight) if fallback is Fallback.DECODED_CUBLAS else unpacked(weight)
    return F.linear(x2d, w.to(x2d.dtype))


def linear(x: torch.Tensor, weight: W12Weight | torch.Tensor, config: LaunchConfig | None = None,
           table: str = "") -> torch.Tensor:
    """x [..., K] @ W [N, K].T -> [..., N] in x's dtype, float32 accumulation.

    Runs `config`, else what `configs.choose` picks for these M rows on this device (`table`: a
    candidate's tuned table over the device's): our GEMV/GEMM kernels with a launch config, or
    cuBLAS on the weight decoded into a shared buffer (or kept decoded), the measured faster path of
    a row count or, where nothing was measured, the rule (kernels up to RULE_MAX_M rows, cuBLAS on
    the kept decoded weight above). An eager prefill's call on a W12 weight with a kept copy takes
    cuBLAS on the copy instead of the kernels (`prefill_scope`), asking nothing else: an eager
    call pays every line of this function in host time, the prefill's bound.
    """
    N, K = weight.shape
    x2d = x.reshape(-1, K)  # [M, K]
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    M = x2d.shape[0]
    if M == 0:
        return x.new_empty(*x.shape[:-1], N)
    if config is None and eager_copy(x2d, weight):  # whatever `choose` says, the copy gives the same values
        choice = Fallback.DECODED_CUBLAS
    else:
        fmt = WeightFormat.W12 if isinstance(weight, W12Weight) else WeightFormat.DENSE
        choice = config or choose(fmt, M, N, K, device_name(x.device), table)
    if isinstance(choice, Fallback):
        y = run_fallback(x2d, weight, choice)
    else:
        y = run_config(x2d, weight, choice)
    return y.reshape(*x.shape[:-1], N)
