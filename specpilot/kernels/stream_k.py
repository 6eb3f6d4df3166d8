"""Stream-K partition of the GEMM: every program gets the same number of K steps.

A launch has `units` = row tiles x K steps of work. The standard grid gives each (row tile, K
split) one program, so when the programs do not divide evenly over the SMs some SMs stream more
bytes than others and the call lasts as long as the busiest one (Qwen3-32B qkv at M = 1: 160 row
tiles of 64, two splits, 320 programs for 264 resident slots on an H200). Here `programs` programs
take contiguous, equal (to one step) ranges of the units in row-tile-major order:

    program p covers units [p * units // programs, (p + 1) * units // programs)

so a program finishes the tile its range starts in, may cover whole tiles, and starts the tile its
range ends in. Each program therefore leaves at most two partial tiles: the *head* (its first
segment, slot 0) and the *tail* (its last one, slot 1, when different). A tile's contributors are
the programs owner(first unit) .. owner(last unit); each stores its float32 partial in its own
slot, and the last to arrive at the tile's counter sums them in program order -- deterministic for a
given (shape, config, SM count), like `tiles.reduce_split_k`.

Owns the partition arithmetic in Python (the planner and the tests use it); `tiles.py` holds the
same formulas in Triton (`stream_first_unit`, `stream_owner`) and the reduction
(`reduce_stream_k`). No Triton import. Does not own the kernel (`gemm.py`) or the workspace
(`workspace.py`).
"""

from __future__ import annotations

SLOTS = 2  # partial tiles a program may leave: head and tail


def first_unit(p: int, units: int, programs: int) -> int:
    return p * units // programs


def owner(u: int, units: int, programs: int) -> int:
    """The program whose range holds unit u: the largest p with p * units // programs <= u."""
    return ((u + 1) * programs - 1) // units


def slot(p: int, tile_first: int, units: int, programs: int) -> int:
    """Workspace slot of program p's partial of the tile starting at unit `tile_first`: 0 when p's
    range starts inside that tile, else 1 (the tile is where p's range ends)."""
    return 0 if first_unit(p, units, programs) >= tile_first else 1


def workspace_floats(programs: int, M: int, block_n: int) -> int:
    """Float32 partials a launch may store: two slots of [M, block_n] per program."""
    return programs * SLOTS * M * block_n
