"""`W12Weight`: the tensors of one W12-encoded matrix and what can be done with them as a unit.

Owns: the container (planes, per-row bases, CSR escapes), its exact storage cost, moving it
between devices, fusing projections row-wise (q/k/v -> qkv, gate/up -> gate_up), structural
validation of untrusted data (files), and turning it into a module. Does not own the encoding
rule (`codec.py`), the layout constants (`layout.py`) or files (`checkpoint.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specpilot.errors import CheckpointError
from specpilot.w12.layout import (
    MAX_BASE,
    MIN_BASE,
    escape_column_dtype,
    nibble_location,
    padded_columns,
    stored_positions,
)

PLANES = ("lo", "hi", "base", "esc_ptr", "esc_col", "esc_val")


@dataclass(frozen=True, repr=False)
class W12Weight:
    """A BF16 matrix [N, K] in W12 form; see `specpilot.w12.layout` for the meaning of each tensor."""

    shape: tuple[int, int]  # (N, K)
    lo: torch.Tensor  # [N, Kp] uint8: (offset & 1) << 7 | mantissa, in stored order
    hi: torch.Tensor  # [N, Kp/2] uint8: sign << 3 | offset >> 1, two nibbles per byte
    base: torch.Tensor  # [N] uint8: window bottom e0
    esc_ptr: torch.Tensor  # [N+1] int32: CSR row pointers into the escapes
    esc_col: torch.Tensor  # [E] int16 (uint16 values) or int32: escape columns
    esc_val: torch.Tensor  # [E] int16: escape BF16 bit patterns
    # Data kernels derive from the planes, cached per weight (`specpilot.kernels.escape_blocks`);
    # never saved, and a new weight (`to`, `concat_rows`, a file) starts empty.
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        N, K = self.shape
        Kp = padded_columns(K)
        expected = {
            "lo": (torch.uint8, (N, Kp)),
            "hi": (torch.uint8, (N, Kp // 2)),
            "base": (torch.uint8, (N,)),
            "esc_ptr": (torch.int32, (N + 1,)),
            "esc_col": (escape_column_dtype(Kp), (self.esc_val.shape[0],)),
            "esc_val": (torch.int16, (self.esc_val.shape[0],)),
        }
        for name, (dtype, shape) in expected.items():
            t = getattr(self, name)
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise ValueError(
                    f"W12 plane {name} of a {N}x{K} weight must be {dtype} {list(shape)}, "
                    f"got {t.dtype} {list(t.shape)}"
                )
            if not t.is_contiguous():
                raise ValueError(f"W12 plane {name} must be contiguous")

    def __repr__(self) -> str:
        N, K = self.shape
        return (f"W12Weight(N={N}, K={K}, escapes={self.num_escapes}, "
                f"bits/weight={self.bits_per_weight:.4f}, device={self.device})")

    @property
    def device(self) -> torch.device:
        return self.lo.device

    @property
    def num_escapes(self) -> int:
        return self.esc_val.shape[0]

    @property
    def nbytes_total(self) -> int:
        """Exact storage cost in bytes: both planes (with padding), bases, escape pointers and escapes."""
        return sum(t.numel() * t.element_size() for t in self.planes().values())

    @property
    def bits_per_weight(self) -> float:
        N, K = self.shape
        return 8.0 * self.nbytes_total / (N * K)

    def planes(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in PLANES}

    @classmethod
    def from_planes(cls, shape: tuple[int, int], planes: dict[str, torch.Tensor]) -> W12Weight:
        return cls(shape=(int(shape[0]), int(shape[1])), **{name: planes[name] for name in PLANES})

    def to(self, device: torch.device | str) -> W12Weight:
        planes = {k: v.to(device) for k, v in self.planes().items()}
        return W12Weight.from_planes(self.shape, planes)

    @classmethod
    def concat_rows(cls, weights: list[W12Weight]) -> W12Weight:
        """Stack [N_i, K] weights into one [sum N_i, K] weight (rows are stored independently)."""
        Ks = {w.shape[1] for w in weights}
        if len(Ks) != 1:
            raise ValueError(f"cannot fuse W12 weights with different in-features: {sorted(Ks)}")
        ptrs, total = [weights[0].esc_ptr[:1]], 0
        for w in weights:
            ptrs.append(w.esc_ptr[1:] + total)
            total += w.num_escapes
        return cls(
            shape=(sum(w.shape[0] for w in weights), Ks.pop()),
            lo=torch.cat([w.lo for w in weights]),
            hi=torch.cat([w.hi for w in weights]),
            base=torch.cat([w.base for w in weights]),
            esc_ptr=torch.cat(ptrs),
            esc_col=torch.cat([w.esc_col for w in weights]),
            esc_val=torch.cat([w.esc_val for w in weights]),
        )

    def take_rows(self, index: torch.Tensor) -> W12Weight:
        """The weight of rows `index` [M] (int64) in that order (a row permutation or selection; rows
        are stored independently, so this is exact)."""
        index = index.to(device=self.lo.device, dtype=torch.int64)
        ptr = self.esc_ptr.long()
        counts = (ptr[1:] - ptr[:-1])[index]  # [M]
        starts = ptr[:-1][index]
        new_ptr = torch.zeros(index.numel() + 1, dtype=torch.int64, device=index.device)
        new_ptr[1:] = counts.cumsum(0)
        # escape e of new row r comes from old escape starts[r] + (e - new_ptr[r])
        row_of = torch.repeat_interleave(torch.arange(index.numel(), device=index.device), counts)
        src = starts[row_of] + torch.arange(int(new_ptr[-1]), device=index.device) - new_ptr[:-1][row_of]
        return type(self)(
            shape=(index.numel(), self.shape[1]),
            lo=self.lo[index].contiguous(), hi=self.hi[index].contiguous(), base=self.base[index].contiguous(),
            esc_ptr=new_ptr.to(torch.int32), esc_col=self.esc_col[src].contiguous(),
            esc_val=self.esc_val[src].contiguous(),
        )

    def split_rows(self, sizes: list[int]) -> list[W12Weight]:
        """Consecutive row blocks of `sizes` rows (the inverse of `concat_rows`)."""
        if sum(sizes) != self.shape[0]:
            raise ValueError(f"row sizes {sizes} do not add up to {self.shape[0]} rows")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [self.take_rows(torch.arange(s, s + n)) for s, n in zip(starts, sizes)]

    def validate(self, where: str) -> None:
        """Check invariants a kernel relies on; raise `CheckpointError` naming `where` if one fails.

        Structural only (the CRCs in the file guard the bits): bases in 1..239, CSR pointers from 0
        to E and non-decreasing, escape columns strictly increasing within a row and < K, and every
        escape slot holding the placeholder code 0 (the kernels subtract the placeholder's product).
        """
        N, K = self.shape
        base = self.base.to(torch.int32)
        if N and (int(base.min()) < MIN_BASE or int(base.max()) > MAX_BASE):
            raise CheckpointError(f"{where}: window base outside {MIN_BASE}..{MAX_BASE}")
        ptr = self.esc_ptr.long()
        if int(ptr[0]) != 0 or int(ptr[-1]) != self.num_escapes or bool((ptr[1:] < ptr[:-1]).any()):
            raise CheckpointError(f"{where}: escape row pointers are not a valid CSR index")
        if not self.num_escapes:
            return
        from specpilot.w12.codec import escape_columns, escape_rows

        rows, cols = escape_rows(self), escape_columns(self)
        if int(cols.max()) >= K:
            raise CheckpointError(f"{where}: escape column out of range (K = {K})")
        same_row = rows[1:] == rows[:-1]
        if bool((same_row & (cols[1:] <= cols[:-1])).any()):
            raise CheckpointError(f"{where}: escape columns are not strictly increasing within a row")
        pos = stored_positions(cols)
        low = self.lo[rows, pos]
        byte, shift = nibble_location(pos)
        nibble = (self.hi[rows, byte].to(torch.int32) >> shift) & 0xF
        if bool((low != 0).any()) or bool((nibble != 0).any()):
            raise CheckpointError(f"{where}: an escape slot does not hold the placeholder code")
