"""Python-side plumbing shared by the kernel wrappers: weight operands, input checks, split-K plan.

Owns: flattening a `W12Weight` or a plain weight into the pointer/size/stride arguments of the
kernels (one kernel body serves both formats), validating activations, planning the split-K grid,
choosing the decoder (inline PTX on a GPU), whether a launch uses programmatic dependent launch
(`pdl`, `pdl_scope`: every kernel of the package asks here), and the two concessions to Triton's
CPU interpreter (TRITON_INTERPRET=1), which computes on the raw bits of bfloat16 values in
`tl.dot` and truncates float32 -> bfloat16 casts instead of rounding them
(triton-lang/triton#11584): there, dots run on float32 operands (the same values, since both are
exact BF16) and outputs are stored as float32 and rounded by PyTorch. No Triton import. Does not
own the kernels (`gemv.py`, `gemm.py`) or config choice (`configs.py`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass

import torch

from specpilot import env
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat, auto_split_k
from specpilot.kernels.workspace import SplitKWorkspace, shared_workspace
from specpilot.w12.layout import padded_columns
from specpilot.w12.weight import W12Weight

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class WeightOperands:
    """Kernel arguments describing a weight; plain weights pass themselves as the unused planes."""

    fmt: WeightFormat
    w: torch.Tensor  # W12: lo [N, Kp] uint8; plain: weight [N, K]
    hi: torch.Tensor  # W12: hi [N, Kp/2] uint8
    base: torch.Tensor  # W12: [N] uint8
    esc_ptr: torch.Tensor
    esc_col: torch.Tensor
    esc_val: torch.Tensor
    N: int
    K: int
    Kp: int  # K rounded up to 128: the column range the K loop covers
    stride_w: int
    stride_hi: int

    @property
    def is_w12(self) -> bool:
        return self.fmt is WeightFormat.W12

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights decode to."""
        return torch.bfloat16 if self.is_w12 else self.w.dtype

    @property
    def device(self) -> torch.device:
        return self.w.device


def weight_operands(weight: W12Weight | torch.Tensor) -> WeightOperands:
    if isinstance(weight, W12Weight):
        N, K = weight.shape
        return WeightOperands(
            WeightFormat.W12, weight.lo, weight.hi, weight.base, weight.esc_ptr, weight.esc_col,
            weight.esc_val, N, K, padded_columns(K), weight.lo.stride(0), weight.hi.stride(0),
        )
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError(f"weight must be a W12Weight or a 2-D tensor, got {type(weight).__name__}")
    if weight.dtype not in FLOAT_DTYPES or weight.stride(1) != 1:
        raise ValueError(f"plain weights must be float16/bfloat16/float32 with contiguous rows, got {weight.dtype}")
    N, K = weight.shape
    w = weight
    return WeightOperands(WeightFormat.DENSE, w, w, w, w, w, w, N, K, padded_columns(K), w.stride(0), 0)


def check_activations(x: torch.Tensor, ops: WeightOperands, max_m: int) -> None:
    if x.dim() != 2 or x.shape[1] != ops.K:
        raise ValueError(f"x must be [M, {ops.K}], got {list(x.shape)}")
    if not 1 <= x.shape[0] <= max_m:
        raise ValueError(f"this kernel takes 1..{max_m} rows, got M = {x.shape[0]}")
    if x.dtype not in FLOAT_DTYPES or x.stride(1) != 1:
        raise ValueError(f"x must be float16/bfloat16/float32 with contiguous rows, got {x.dtype}")
    if x.device != ops.device:
        raise ValueError(f"x is on {x.device}, the weight on {ops.device}")


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 under the CPU interpreter."""
    return _sm_count(device) if device.type == "cuda" else 1


@dataclass(frozen=True)
class SplitPlan:
    split_k: int
    steps_per_split: int  # K steps (of block_k columns) each split covers
    workspace: SplitKWorkspace  # passed even when split_k = 1, so pointer types never change


def plan_split(cfg: LaunchConfig, ops: WeightOperands, M: int, n_tiles: int,
               workspace: SplitKWorkspace | None) -> SplitPlan:
    """How many programs share each row tile along K, and the workspace they reduce through."""
    workspace = workspace or shared_workspace(ops.device)
    k_steps = -(-ops.Kp // cfg.block_k)
    split = cfg.split_k or auto_split_k(n_tiles, k_steps, sm_count(ops.device), cfg.programs_per_sm, cfg.fit_wave)
    split = max(1, min(split, k_steps))
    while split > 1 and not workspace.fits(split, M, ops.N, n_tiles):
        split -= 1
    steps = -(-k_steps // split)
    split = -(-k_steps // steps)  # drop splits that would get no K steps
    return SplitPlan(split, steps, workspace)


@dataclass(frozen=True)
class Launch:
    """What a GEMV or GEMM launch needs beyond its path's own meta-parameters."""

    ops: WeightOperands
    y: torch.Tensor  # [M, N], the kernel's output (`output_buffer`)
    grid: tuple[int, int]  # (row tiles, K splits)
    args: tuple  # the kernels' shared positional arguments: pointers, sizes, strides
    even_n: bool  # N a multiple of block_n
    even_k: bool  # K a multiple of block_k
    steps_per_split: int  # K steps each of the grid's K splits covers
    pdl: bool = False  # launched with programmatic dependent launch (`pdl`)


def prepare_launch(x: torch.Tensor, weight, config: LaunchConfig, path: KernelPath, max_m: int,
                   workspace: SplitKWorkspace | None) -> Launch:
    """Check the inputs of `path`'s kernel, allocate its output and plan its grid (split-K included)."""
    if config.path is not path:
        raise ValueError(f"{path.value}() got a {config.path.value} config")
    ops = weight_operands(weight)
    check_activations(x, ops, max_m)
    M = x.shape[0]
    y = output_buffer(x, ops.N)  # [M, N]
    n_tiles = -(-ops.N // config.block_n)
    plan = plan_split(config, ops, M, n_tiles, workspace)
    args = (x, ops.w, ops.hi, ops.base, ops.esc_ptr, ops.esc_col, ops.esc_val, y,
            plan.workspace.partials, plan.workspace.counters,
            M, ops.N, ops.K, ops.Kp, plan.split_k, plan.steps_per_split,
            x.stride(0), y.stride(0), ops.stride_w, ops.stride_hi)
    return Launch(ops, y, (n_tiles, plan.split_k), args, ops.N % config.block_n == 0, ops.K % config.block_k == 0,
                  plan.steps_per_split, pdl(x.device))


def bf16_dots(x: torch.Tensor, ops: WeightOperands) -> bool:
    """Whether tl.dot may take BF16 operands (both sides BF16, and not under the interpreter)."""
    return x.dtype == torch.bfloat16 and ops.dtype == torch.bfloat16 and not env.triton_interpret()


def output_buffer(x: torch.Tensor, N: int) -> torch.Tensor:
    """The [M, N] tensor the kernel stores to: x's dtype, float32 under the interpreter."""
    dtype = torch.float32 if env.triton_interpret() else x.dtype
    return torch.empty(x.shape[0], N, dtype=dtype, device=x.device)


def ptx_decode(config: LaunchConfig | None = None) -> bool:
    """Whether W12 tiles decode with the inline-PTX decoder: on a GPU, unless the config opts out."""
    return not env.triton_interpret() and (config is None or config.ptx_decode)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


_scope: contextvars.ContextVar[bool | None] = contextvars.ContextVar("specpilot_pdl", default=None)


@contextlib.contextmanager
def pdl_scope(on: bool | None):
    """Within: the kernels launch with PDL iff `on` (a system's `pdl` knob; None: `SPECPILOT_PDL`
    decides), where `pdl` allows it at all."""
    token = _scope.set(on)
    try:
        yield
    finally:
        _scope.reset(token)


def knob_scope(knob: bool):
    """`pdl_scope` of a system's `pdl` knob: on, every launch within uses PDL; off, `SPECPILOT_PDL`
    decides (the knob never turns PDL off)."""
    return pdl_scope(True if knob else None)


def pdl(device: torch.device) -> bool:
    """Whether the kernels launch with programmatic dependent launch: inside `pdl_scope(True)` (or,
    outside any scope, with `SPECPILOT_PDL=1`), on a GPU of compute capability 9.0 or later, not
    under the interpreter. A kernel so launched may start while the one before it in the stream
    finishes: it loads its weights (and their side data), then waits (`tiles.wait_for_inputs`)
    before it reads activations or stores anything. CUDA graphs keep the launch attribute of each
    kernel they capture."""
    wanted = _scope.get()
    if not (env.pdl() if wanted is None else wanted) or device.type != "cuda" or env.triton_interpret():
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


def launch_options(pdl_launch: bool) -> dict:
    """Extra keyword arguments of a kernel launch: `launch_pdl` when launching with PDL."""
    return {"launch_pdl": True} if pdl_launch else {}
