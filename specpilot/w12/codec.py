"""The reference W12 codec: BF16 [N, K] <-> `W12Weight`, bit-exact for every BF16 pattern.

Owns: choosing each row's exponent window, splitting weights into dense codes and escapes, and
the inverse. Pure PyTorch; runs on whatever device the tensor is on (encoding on a GPU is much
faster for whole checkpoints). Does not own the physical layout constants (`layout.py`) or
kernels (`specpilot.kernels`).

Window rule: among the windows [e0, e0 + 15] with 1 <= e0 <= 239, pick the one holding the most
normal weights of the row; ties go to the smallest e0. Only normal numbers are ever coded densely,
so the rule and its tie-break are a pure function of the row's exponent histogram.
"""

from __future__ import annotations

import torch

from specpilot.errors import ConfigError
from specpilot.w12.layout import (
    MAX_BASE,
    MIN_BASE,
    WINDOW,
    bf16_to_bits,
    bits_to_bf16,
    bits_to_int16,
    code_parts,
    dense_bits,
    escape_column_dtype,
    pack_planes,
    padded_columns,
    unpack_planes,
)
from specpilot.w12.weight import W12Weight

ENCODE_CHUNK_ELEMENTS = 1 << 24  # rows are encoded in chunks of about this many weights


def exponent_histogram(bits: torch.Tensor) -> torch.Tensor:
    """[R, K] BF16 bit patterns -> [R, 256] int32 counts of each exponent field among normal values."""
    exponent = (bits >> 7) & 0xFF
    normal = (exponent != 0) & (exponent != 255)
    hist = torch.zeros(bits.shape[0], 256, dtype=torch.int32, device=bits.device)
    return hist.scatter_add_(1, exponent.long(), normal.to(torch.int32))


def choose_windows(hist: torch.Tensor) -> torch.Tensor:
    """[R, 256] exponent counts -> [R] int32 window bottoms e0 (most weights covered, smallest e0 on ties)."""
    R = hist.shape[0]
    cum = torch.cat([hist.new_zeros(R, 1), hist.cumsum(1, dtype=torch.int32)], dim=1)  # cum[:, i] = sum hist[:, :i]
    starts = torch.arange(MIN_BASE, MAX_BASE + 1, device=hist.device)
    covered = cum[:, starts + WINDOW] - cum[:, starts]  # [R, 239]: weights in window e0 = starts[j]
    best = covered.max(dim=1, keepdim=True).values
    # Explicit tie-break (do not rely on argmax's choice among equal maxima): first maximal start.
    first = torch.where(covered == best, starts, MAX_BASE + 1).min(dim=1).values
    return first.to(torch.int32)


def _encode_rows(bits: torch.Tensor, Kp: int):
    """Encode [R, K] bit patterns; returns planes and the escapes of these rows."""
    R, K = bits.shape
    base = choose_windows(exponent_histogram(bits))  # [R]
    exponent = (bits >> 7) & 0xFF
    offset = exponent - base[:, None]
    # 1 <= base <= 239 keeps exponent fields 0 (zero/subnormal) and 255 (Inf/NaN) out of every window.
    dense = (offset >= 0) & (offset < WINDOW)
    low, nibble = code_parts(bits, torch.where(dense, offset, 0))
    low = torch.where(dense, low, 0)  # escape slots hold the placeholder code 0
    nibble = torch.where(dense, nibble, 0)
    if Kp != K:
        low = torch.nn.functional.pad(low, (0, Kp - K))
        nibble = torch.nn.functional.pad(nibble, (0, Kp - K))
    lo, hi = pack_planes(low, nibble)
    rows, cols = (~dense).nonzero(as_tuple=True)  # row-major: sorted by (row, col)
    return (
        lo,
        hi,
        base.to(torch.uint8),
        torch.bincount(rows, minlength=R),
        cols,
        bits[rows, cols],
    )


def encode(weight: torch.Tensor) -> W12Weight:
    """BF16 weight [N, K] -> `W12Weight` on the same device; `decode` inverts it bit for bit."""
    if weight.dtype != torch.bfloat16:
        raise TypeError(f"W12 encodes bfloat16 weights, got {weight.dtype}")
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] == 0:
        raise ValueError(f"W12 encodes non-empty 2-D weights [N, K], got shape {list(weight.shape)}")
    N, K = weight.shape
    Kp = padded_columns(K)
    rows_per_chunk = max(1, ENCODE_CHUNK_ELEMENTS // K)
    parts = [_encode_rows(bf16_to_bits(weight[r : r + rows_per_chunk]), Kp) for r in range(0, N, rows_per_chunk)]
    lo, hi, base, counts, cols, vals = (torch.cat(p) for p in zip(*parts))
    esc_ptr = torch.zeros(N + 1, dtype=torch.int64, device=weight.device)
    esc_ptr[1:] = counts.cumsum(0)
    col_dtype = escape_column_dtype(Kp)
    return W12Weight(
        shape=(N, K),
        lo=lo,
        hi=hi,
        base=base,
        esc_ptr=esc_ptr.to(torch.int32),
        esc_col=bits_to_int16(cols) if col_dtype == torch.int16 else cols.to(col_dtype),
        esc_val=bits_to_int16(vals),
    )


def escape_rows(weight: W12Weight) -> torch.Tensor:
    """[E] int64 row of every escape (expanded from the CSR pointers; no host sync)."""
    N = weight.shape[0]
    counts = (weight.esc_ptr[1:] - weight.esc_ptr[:-1]).long()
    rows = torch.arange(N, device=counts.device)
    return torch.repeat_interleave(rows, counts, output_size=weight.num_escapes)


def escape_columns(weight: W12Weight) -> torch.Tensor:
    """[E] int64 column of every escape (undoing the uint16-in-int16 storage)."""
    return weight.esc_col.long() & 0xFFFF if weight.esc_col.dtype == torch.int16 else weight.esc_col.long()


def decode(weight: W12Weight) -> torch.Tensor:
    """`W12Weight` -> the exact BF16 weight [N, K] it encodes (same device)."""
    K = weight.shape[1]
    bits = dense_bits(*unpack_planes(weight.lo, weight.hi), weight.base)[:, :K].contiguous()
    if weight.num_escapes:
        flat = escape_rows(weight) * K + escape_columns(weight)
        bits.view(-1)[flat] = weight.esc_val.to(torch.int32) & 0xFFFF
    return bits_to_bf16(bits)


def exact_bf16(weight: torch.Tensor, name: str) -> torch.Tensor:
    """`weight` as BF16, or a ConfigError if that would change any bit (NaN payloads included)."""
    weight = weight.detach()
    if weight.dtype == torch.bfloat16:
        return weight
    w16 = weight.to(torch.bfloat16)
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[weight.element_size()]
    if not torch.equal(w16.to(weight.dtype).view(as_int), weight.contiguous().view(as_int)):
        raise ConfigError(f"w12 needs BF16 weights: {name} holds {weight.dtype} values that BF16 cannot hold exactly")
    return w16
