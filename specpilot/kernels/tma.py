"""Tensor descriptors for the GEMM's weight and x tiles (`LaunchConfig.tma`, `LaunchConfig.tma_x`).

With `tma` the GEMM loads each K step's weight tile with two TMA copies (W12: the lo plane viewed as
int64 [N, Kp/8] and the hi plane as int32 [N, Kp/8], boxes [block_n, block_k/8]; plain weights: one
box [block_n, block_k] of the weight) instead of 16-byte cp.async per thread; Triton pipelines them
through shared memory with mbarriers. The tile's values and the sums are the same, so the output is
bit-identical to the cp.async path. TMA reads zeros outside the tensor, as the cp.async path's
masks do (rows past N, groups past Kp, columns past K).

A TMA box needs a 16-byte-aligned base and row stride, at most 256 elements per dimension and at
least 16 bytes in its inner one; a weight or config that cannot meet that takes the cp.async path
(`descriptors` returns None), as does any GPU before sm_90: the option is a speed choice, never a
reason to fail. W12 descriptors are cached on the weight (`W12Weight.derived`, like the escape
blocks); a plain weight's are built per call (Python only, nothing on the GPU).

With `tma_x` the x^T tile of each K step comes by TMA too: one box [BM, BK] of x (`x_descriptor`;
zeros past M and K, as the masked loads read), transposed in shared memory for the MMA. x's
descriptor is built per call (its address changes); the same alignment rules apply, and an x that
breaks them (an odd row stride, a sliced view, a K step of 512) or is float32 takes the plain
loads. So does an x that fills less than three quarters of the box's rows: a box hanging far past
x's last row is slower than the plain loads, the more so the more rows it fills with zeros. The
search times tma_x at each bucket's full row count, where the box fits exactly; the dispatcher's
configs at row counts between the bounds, with this rule, are timed by `scripts/w12_kernels.py --shipped`.

Which configs use TMA is the search's and the tuned table's choice (`search.py`, `configs.py`).
Does not own the kernel (`gemm.py`).
"""

from __future__ import annotations

import torch

from specpilot.kernels.configs import LaunchConfig
from specpilot.kernels.launch import WeightOperands
from specpilot.w12.weight import W12Weight

WORD = 8  # weights per group: one int64 of lo bytes, one int32 of hi nibbles
MAX_BOX = 256  # elements per box dimension (a TMA limit)
ALIGN = 16  # bytes: base address and row stride
TMA_MAJOR = 9  # compute capability from which GPUs have TMA (Hopper)


def _box_ok(t: torch.Tensor, box: list[int]) -> bool:
    return (t.data_ptr() % ALIGN == 0 and (t.stride(0) * t.element_size()) % ALIGN == 0 and t.stride(1) == 1
            and all(1 <= b <= MAX_BOX for b in box) and box[-1] * t.element_size() >= ALIGN)


def _no_tma(t: torch.Tensor) -> bool:
    """True on a GPU before sm_90 (the interpreter on CPU emulates TMA)."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < TMA_MAJOR


def _descriptor(t: torch.Tensor, box: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor  # lazy: the package imports without Triton

    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], box)


def x_descriptor(x: torch.Tensor, block_m: int, config: LaunchConfig):
    """The descriptor of x [M, K]'s tiles [block_m, block_k] for `config.tma_x`, or None where TMA
    cannot load them or x fills less than three quarters of the box's rows (then the kernel reads x
    with masked loads)."""
    if not config.tma_x or x.element_size() != 2 or _no_tma(x):
        return None  # float32 x (IEEE dots) keeps the plain loads: only 16-bit boxes are built and tested
    if 4 * (block_m - x.shape[0]) > block_m:
        return None  # over a quarter of the box past x's last row: slow (see the module docstring)
    box = [block_m, config.block_k]
    return _descriptor(x, box) if _box_ok(x, box) else None


def descriptors(weight: W12Weight | torch.Tensor, ops: WeightOperands, config: LaunchConfig):
    """(lo, hi) descriptors of `weight`'s tiles for `config` (a plain weight: (w, w)), or None where
    TMA cannot load them (see the module docstring; GPUs before sm_90 have no TMA)."""
    if _no_tma(ops.w):
        return None
    if not ops.is_w12:
        box = [config.block_n, config.block_k]
        if not _box_ok(ops.w, box):
            return None
        d = _descriptor(ops.w, box)
        return d, d
    key = ("tma", config.block_n, config.block_k)
    if key not in weight.derived:
        try:
            lo, hi = ops.w.view(torch.int64), ops.hi.view(torch.int32)  # [N, Kp/8] each
        except RuntimeError:  # a view whose strides do not allow the wider dtype
            lo = hi = None
        box = [config.block_n, config.block_k // WORD]
        ok = lo is not None and _box_ok(lo, box) and _box_ok(hi, box)
        weight.derived[key] = (_descriptor(lo, box), _descriptor(hi, box)) if ok else None
    return weight.derived[key]
