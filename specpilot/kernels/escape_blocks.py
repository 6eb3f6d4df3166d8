"""Escape blocks: a W12 weight's escapes regrouped per row block, as the GEMM and the GEMV add them.

The GEMM decodes every escape slot as the placeholder code, which in its scaled domain
(w * 2^(112 - e0), see `specpilot.w12.layout`) is 2^-15. The CSR correction after the K loop
(`gemm.py`, ESC_EPILOGUE) costs a chain of dependent loads per row block -- CSR range, then
escapes, then the x columns they name, for every 16 escapes -- at the end of every program, which
costs more of the kernel than escape blocks do (`scripts/w12_escape_cost.py` times both). Adding them inside the K loop, per (row block, K tile), costs
as much as the epilogue: the x gather then stalls every step. Here each row block of `block_n` rows -- under split-K, each (row block, K
split) -- gets a fixed number `slot` of *entries* (row in block, column, value) at an address the
program computes from its ids: it loads them before its K loop (nothing waits on them there), and
after the loop one gather of x at their columns and one dot -- a one-hot [block_n, slot] matrix of
entry values times those x columns -- add them, one memory round trip in all, before the partial
sums are reduced. The GEMV (`gemv.py`) reads the same slabs; one of at most G = block_k / 8
entries it adds straight into its [block_n, G] accumulators, one entry per lane, with no dot.

Entries live in the scaled domain. An escape (n, c, v) is, with v' = v * 2^(112 - e0[n]):
- one entry v' - 2^-15 when that is exactly a BF16 number (always for v = +-0, the common escape
  of trained checkpoints),
- else two entries, v' and -2^-15.
Both are exact BF16 and their products with x exact in float32, so the sum is the one the
epilogue correction computes. A weight with an escape this cannot express exactly -- Inf, NaN,
or v' outside the normal BF16 range (subnormal escapes of a normal row, say) -- has no escape
blocks; nor has one whose busiest row block needs more than `MAX_SLOT` entries (all-escape rows):
both keep the epilogue correction. Padding entries have value 0 and read x as 0.

Layout: `words` [row_blocks * splits, slot] int32 = row_in_block << 24 | column, `values` (same
shape) int16 (BF16 bits); slab = row_block * splits + split. Built with torch ops on the weight's
device, once per (weight, block_n, split width) and cached on the weight (`W12Weight.derived`).
Not part of the file format: derived data of 6 * slot bytes per row block (0.2-0.8% of the planes on the benchmark's random weights).
Does not own the kernels (`gemm.py`, `gemv.py`) or the format (`specpilot.w12`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.w12 import layout
from specpilot.w12.codec import escape_columns, escape_rows
from specpilot.w12.weight import W12Weight

SLOT_STEP = 16  # the fewest entries per row block: a tl.dot's smallest K (slots are powers of two)
MAX_SLOT = 256  # a one-hot [block_n, 256] operand is the size of a 64 x 256 weight tile
PLACEHOLDER_SCALED = 2.0 ** (layout.SCALE_BIAS - 127)  # what an escape slot decodes to: 2^-15
ROW_SHIFT = 24  # words: row_in_block << 24 | column
MAX_COLUMNS = 1 << ROW_SHIFT
MIN_NORMAL = 2.0 ** -126


@dataclass(frozen=True)
class EscapeBlocks:
    block_n: int
    splits: int  # slabs per row block: the K splits of the launch they were built for (1: all columns)
    slot: int  # entries per slab: a power of two, 16..MAX_SLOT
    words: torch.Tensor  # [row_blocks * splits, slot] int32: row_in_block << 24 | column
    values: torch.Tensor  # [row_blocks * splits, slot] int16: BF16 bits of the scaled entry (0: padding)

    @property
    def entries(self) -> int:
        """Real entries (no entry is zero: the rest is padding)."""
        return int((self.values != 0).sum())

    @property
    def nbytes(self) -> int:
        return self.words.numel() * 4 + self.values.numel() * 2


def _exact_bf16(v: torch.Tensor) -> torch.Tensor:
    """Which float64 values are exactly a normal (or zero) BF16 number."""
    return (v.to(torch.bfloat16).double() == v) & ((v == 0) | (v.abs() >= MIN_NORMAL)) & v.isfinite()


def _entries(weight: W12Weight):
    """(rows, cols, bf16 bits) of every entry, or None when an escape cannot be an exact entry."""
    rows, cols = escape_rows(weight), escape_columns(weight)  # [E] int64
    v = weight.esc_val.view(torch.bfloat16).double()  # the escape values, exact
    shift = (layout.SCALE_BIAS - weight.base.to(torch.int64)[rows]).double()
    scaled = v * torch.exp2(shift)  # exact in float64 for every finite BF16 value and base
    single = scaled - PLACEHOLDER_SCALED  # rounded when the two are far apart (a tiny escape)
    back = single - scaled  # Knuth's two-sum: the rounding error of that subtraction, exactly
    error = (scaled - (single - back)) + (-PLACEHOLDER_SCALED - back)
    one = (error == 0) & _exact_bf16(single)
    two = ~one & _exact_bf16(scaled)
    if not bool((one | two).all()):
        return None
    first = torch.where(one, single, scaled)  # [E]: the entry every escape has
    cancel = torch.full_like(first[two], -PLACEHOLDER_SCALED)  # the second entry of the others
    rows = torch.cat([rows, rows[two]])
    cols = torch.cat([cols, cols[two]])
    value = torch.cat([first, cancel]).to(torch.bfloat16).view(torch.int16)
    return rows, cols, value


def build(weight: W12Weight, block_n: int, k_split: int | None = None) -> EscapeBlocks | None:
    """The escape blocks of `weight` for row blocks of `block_n` -- one slab per (row block, K
    split) when `k_split` (columns per split-K program) is given, so each program reads only its
    own entries -- or None when the weight has no escapes, one no entry can express exactly, or a
    slab that would need > MAX_SLOT entries."""
    N, K = weight.shape
    if not weight.num_escapes or block_n > 1 << (32 - ROW_SHIFT) or K > MAX_COLUMNS:
        return None
    found = _entries(weight)
    if found is None:
        return None
    rows, cols, value = found
    splits = -(-layout.padded_columns(K) // k_split) if k_split else 1
    slabs = -(-N // block_n) * splits
    slab = (rows // block_n) * splits + (cols // k_split if k_split else 0)  # [entries]
    counts = torch.bincount(slab, minlength=slabs)
    busiest = int(counts.max())
    slot = max(SLOT_STEP, 1 << (busiest - 1).bit_length())  # a power of two (tl.arange)
    if slot > MAX_SLOT:
        return None
    order = torch.argsort(slab, stable=True)
    slab, rows, cols, value = slab[order], rows[order], cols[order], value[order]
    starts = torch.cumsum(counts, 0) - counts  # [slabs]
    index = slab * slot + torch.arange(slab.numel(), device=slab.device) - starts[slab]
    words = torch.zeros(slabs * slot, dtype=torch.int32, device=slab.device)
    values = torch.zeros(slabs * slot, dtype=torch.int16, device=slab.device)
    words[index] = (((rows % block_n) << ROW_SHIFT) | cols).to(torch.int32)
    values[index] = value
    return EscapeBlocks(block_n, splits, slot, words.view(slabs, slot), values.view(slabs, slot))


def escape_blocks(weight: W12Weight, block_n: int, k_split: int | None = None) -> EscapeBlocks | None:
    """`build`, cached on the weight per (row-block size, split width). While a CUDA graph is being
    captured nothing is built (it syncs with the host): an uncached one then returns None, and the
    caller falls back to the epilogue correction, which is exact too."""
    key = ("escape_blocks", block_n, k_split)
    if key not in weight.derived:
        if weight.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        weight.derived[key] = build(weight, block_n, k_split)
    return weight.derived[key]


def reference_correction(blocks: EscapeBlocks, x: torch.Tensor, N: int) -> torch.Tensor:
    """[M, N] float64: what every row's entries add, sum of x[m, column] * value (scaled domain).
    For tests: the kernel adds exactly these products."""
    words = blocks.words.reshape(-1).long()
    values = blocks.values.reshape(-1).view(torch.bfloat16).double()
    keep = values != 0
    block = torch.nonzero(keep).squeeze(1) // (blocks.slot * blocks.splits)
    words, values = words[keep], values[keep]
    rows = block * blocks.block_n + ((words >> ROW_SHIFT) & 0xFF)
    cols = words & (MAX_COLUMNS - 1)
    out = torch.zeros(x.shape[0], N, dtype=torch.float64, device=x.device)
    out.index_add_(1, rows, x.double()[:, cols] * values)
    return out
