"""Escape tiles: a W12 weight's escapes regrouped per (row block, K tile) for the GEMM's K loop.

The GEMM decodes every escape slot as the placeholder code, which in its scaled domain
(w * 2^(112 - e0), see `specpilot.w12.layout`) is 2^-15. Correcting that after the K loop costs a
chain of dependent loads per row block (CSR range, escapes, gathered x) at the end of every
program, measured at +7% to +64% of the kernel (`bench/results/w12/w12_escape_cost.md`). Here the
correction becomes part of the K loop instead: for a launch tile (block_n, block_k), every
(row block, K tile) gets a fixed number `slot` of *entries* (row in block, column, value), stored
at an address the program computes from its ids, so the loads pipeline like the weights'. Each K
step adds one small dot: a one-hot [block_n, slot] matrix of entry values times the x columns the
entries name.

Entries live in the scaled domain. An escape (n, c, v) is, with v' = v * 2^(112 - e0[n]):
- one entry v' - 2^-15 when that is exactly a BF16 number (always for v = +-0, the common escape
  of trained checkpoints),
- else two entries, v' and -2^-15.
Both are exact BF16 and their products with x exact in float32, so the sum is the one the
epilogue correction computes. A weight with an escape this cannot express exactly -- Inf, NaN,
or v' outside the normal BF16 range (subnormal escapes of a normal row, say) -- has no escape
tiles; nor has one whose busiest tile needs more than `MAX_SLOT` entries (all-escape rows): both
keep the epilogue correction (`gemm.py`). Padding entries have value 0 and read x as 0.

Layout: `words` [tiles, slot] int32 = row_in_block << 24 | column, `values` [tiles, slot] int16
(BF16 bits), tile t = row_block * k_tiles + k_step. Built with torch ops on the weight's device,
once per (weight, block_n, block_k) and cached on the weight (`W12Weight.derived`). Not part of
the file format: derived data, about 6 * slot bytes per 64 x 256 tile (0.4-0.8% of the planes).
Does not own the kernels (`gemm.py`) or the format (`specpilot.w12`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.w12 import layout
from specpilot.w12.codec import escape_columns, escape_rows
from specpilot.w12.weight import W12Weight

SLOT_STEP = 16  # the fewest entries per tile: a tl.dot's smallest K (slots are powers of two)
MAX_SLOT = 64  # beyond this many entries in one tile the epilogue correction is cheaper
PLACEHOLDER_SCALED = 2.0 ** (layout.SCALE_BIAS - 127)  # what an escape slot decodes to: 2^-15
ROW_SHIFT = 24  # words: row_in_block << 24 | column
MAX_COLUMNS = 1 << ROW_SHIFT
MIN_NORMAL = 2.0 ** -126


@dataclass(frozen=True)
class EscapeTiles:
    block_n: int
    block_k: int
    k_tiles: int  # K steps of block_k columns over the padded width
    slot: int  # entries per tile: 16, 32 or 64
    words: torch.Tensor  # [row_blocks * k_tiles, slot] int32: row_in_block << 24 | column
    values: torch.Tensor  # [row_blocks * k_tiles, slot] int16: BF16 bits of the scaled entry (0: padding)
    entries: int  # real entries (the rest is padding)

    @property
    def nbytes(self) -> int:
        return self.words.numel() * 4 + self.values.numel() * 2


def _exact_bf16(v: torch.Tensor) -> torch.Tensor:
    """Which float64 values are exactly a normal (or zero) BF16 number."""
    return (v.to(torch.bfloat16).double() == v) & ((v == 0) | (v.abs() >= MIN_NORMAL)) & v.isfinite()


def _entries(weight: W12Weight):
    """(rows, cols, bf16 bits) of every entry, or None when an escape cannot be an exact entry."""
    rows, cols = escape_rows(weight), escape_columns(weight)  # [E] int64
    bits = weight.esc_val.to(torch.int32) & 0xFFFF
    v = (bits << 16).view(torch.float32).double()  # the escape values, exact
    shift = (layout.SCALE_BIAS - weight.base.to(torch.int64)[rows]).double()
    scaled = v * torch.exp2(shift)  # exact in float64 for every finite BF16 value and base
    single = scaled - PLACEHOLDER_SCALED
    one = _exact_bf16(single)
    two = ~one & _exact_bf16(scaled)
    if not bool((one | two).all()):
        return None
    first = torch.where(one, single, scaled)  # [E]: the entry every escape has
    cancel = torch.full_like(first[two], -PLACEHOLDER_SCALED)  # the second entry of the others
    rows = torch.cat([rows, rows[two]])
    cols = torch.cat([cols, cols[two]])
    value = torch.cat([first, cancel]).to(torch.bfloat16).view(torch.int16)
    return rows, cols, value


def build(weight: W12Weight, block_n: int, block_k: int) -> EscapeTiles | None:
    """The escape tiles of `weight` for a (block_n, block_k) launch tile, or None when the weight
    has no escapes, one no entry can express exactly, or a tile that would need > MAX_SLOT entries."""
    N, K = weight.shape
    if not weight.num_escapes or block_n > 1 << (32 - ROW_SHIFT) or K > MAX_COLUMNS:
        return None
    found = _entries(weight)
    if found is None:
        return None
    rows, cols, value = found
    k_tiles = -(-layout.padded_columns(K) // block_k)
    tiles = -(-N // block_n) * k_tiles
    tile = (rows // block_n) * k_tiles + cols // block_k  # [entries]
    counts = torch.bincount(tile, minlength=tiles)
    busiest = int(counts.max())
    slot = max(SLOT_STEP, 1 << (busiest - 1).bit_length())  # a power of two (tl.arange)
    if slot > MAX_SLOT:
        return None
    order = torch.argsort(tile, stable=True)
    tile, rows, cols, value = tile[order], rows[order], cols[order], value[order]
    starts = torch.cumsum(counts, 0) - counts  # [tiles]
    index = tile * slot + torch.arange(tile.numel(), device=tile.device) - starts[tile]
    words = torch.zeros(tiles * slot, dtype=torch.int32, device=tile.device)
    values = torch.zeros(tiles * slot, dtype=torch.int16, device=tile.device)
    words[index] = (((rows % block_n) << ROW_SHIFT) | cols).to(torch.int32)
    values[index] = value
    return EscapeTiles(block_n, block_k, k_tiles, slot, words.view(tiles, slot), values.view(tiles, slot),
                       entries=int(tile.numel()))


def escape_tiles(weight: W12Weight, block_n: int, block_k: int) -> EscapeTiles | None:
    """`build`, cached on the weight per launch tile. While a CUDA graph is being captured nothing is
    built (it syncs with the host): an uncached tile then returns None, and the caller falls back to
    the epilogue correction, which is exact too."""
    key = ("escape_tiles", block_n, block_k)
    if key not in weight.derived:
        if weight.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        weight.derived[key] = build(weight, block_n, block_k)
    return weight.derived[key]


def reference_correction(tiles: EscapeTiles, x: torch.Tensor, N: int) -> torch.Tensor:
    """[M, N] float64: the sum every row's entries contribute, x[m, col] * value (scaled domain).
    For tests: the kernel adds exactly these products."""
    M = x.shape[0]
    words = tiles.words.reshape(-1).long()
    values = tiles.values.reshape(-1).view(torch.bfloat16).double()
    keep = values != 0
    words, values = words[keep], values[keep]
    tile = torch.nonzero(keep).squeeze(1) // tiles.slot
    rows = (tile // tiles.k_tiles) * tiles.block_n + ((words >> ROW_SHIFT) & 0xFF)
    cols = words & (MAX_COLUMNS - 1)
    out = torch.zeros(M, N, dtype=torch.float64, device=x.device)
    out.index_add_(1, rows, x.double()[:, cols] * values)
    return out
