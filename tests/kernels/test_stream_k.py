"""Stream-K grid: the partition arithmetic (pure Python) and the kernel on it (interpreter on CPU).

Under the interpreter a device has one SM, so a config's `programs_per_sm` is its program count.
"""

import dataclasses

import pytest
import torch

from specpilot.kernels import stream_k
from specpilot.kernels.configs import KernelPath, LaunchConfig
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12 import encode

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

STREAM = LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, stream_k=True)


@pytest.mark.parametrize("units", [1, 2, 7, 12, 100, 3200])
@pytest.mark.parametrize("programs", [1, 2, 3, 7, 132, 264])
def test_partition_covers_every_unit_once_with_equal_shares(units, programs):
    programs = min(programs, units)
    bounds = [stream_k.first_unit(p, units, programs) for p in range(programs + 1)]
    assert bounds[0] == 0 and bounds[-1] == units
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    for p in range(programs):
        for u in range(bounds[p], bounds[p + 1]):
            assert stream_k.owner(u, units, programs) == p


@pytest.mark.parametrize("k_steps,tiles,programs", [(3, 5, 7), (20, 160, 264), (16, 96, 132), (4, 64, 264), (1, 9, 4)])
def test_each_program_leaves_at_most_a_head_and_a_tail(k_steps, tiles, programs):
    """Segments of one program: only its first and last may be partial tiles (the two slots)."""
    units = tiles * k_steps
    programs = min(programs, units)
    for p in range(programs):
        u, end, segments = stream_k.first_unit(p, units, programs), stream_k.first_unit(p + 1, units, programs), []
        while u < end:
            s0 = u % k_steps
            s1 = min(k_steps, s0 + end - u)
            segments.append(s0 == 0 and s1 == k_steps)
            u += s1 - s0
        assert all(segments[1:-1])  # middle segments are whole tiles


@pytest.mark.parametrize("k_steps,tiles,programs", [(3, 5, 7), (20, 160, 264), (16, 96, 132), (4, 64, 264), (7, 3, 2)])
def test_partial_tiles_never_share_a_workspace_slot(k_steps, tiles, programs):
    """(program, slot) is unique over every partial tile of a launch, so no contributor overwrites
    another's partial while it waits to be summed (the interpreter runs programs one at a time
    and could not show such a race)."""
    units = tiles * k_steps
    programs = min(programs, units)
    used = []
    for t in range(tiles):
        first, last = stream_k.owner(t * k_steps, units, programs), stream_k.owner(t * k_steps + k_steps - 1, units, programs)
        if first != last:  # a partial tile (one contributor: it covers the whole tile, stores nothing)
            used += [(p, stream_k.slot(p, t * k_steps, units, programs)) for p in range(first, last + 1)]
    assert len(used) == len(set(used))


@pytest.mark.parametrize("M", [1, 5, 17])
@pytest.mark.parametrize("programs", [1, 2, 5, 11])
@pytest.mark.parametrize("fmt", ["w12", "dense"])
def test_matches_reference(make_weight, make_x, to_device, check, M, programs, fmt):
    """37 x 300: 3 row tiles x 3 K steps = 9 units; 2, 5 and 11 programs split tiles unevenly
    (11 > 9: as many programs as units)."""
    from specpilot.kernels.gemm import gemm

    w = make_weight(37, 300, seed=9)
    weight = to_device(encode(w) if fmt == "w12" else w)
    x = make_x(M, 300)
    check(gemm(x, weight, dataclasses.replace(STREAM, programs_per_sm=programs)), x, weight)


@pytest.mark.parametrize("programs", [2, 4])
def test_escape_blocks_and_the_epilogue(make_x, to_device, check, block_weight, programs):
    """Escape blocks (one slab per row block, added by the segment holding K step 0) and the
    epilogue correction (added by the program finishing the tile) on the stream-K grid."""
    from specpilot.kernels.gemm import ESC_BLOCKS, escape_plan, gemm

    enc = to_device(encode(block_weight(37, 300)))
    config = dataclasses.replace(STREAM, programs_per_sm=programs, num_stages=2)
    assert escape_plan(enc, config)[0] == ESC_BLOCKS
    for M in (1, 17):
        x = make_x(M, 300)
        check(gemm(x, enc, config), x, enc)
        check(gemm(x, enc, config, escapes="epilogue"), x, enc)


def test_non_finite_escapes(make_x, to_device, check):
    from specpilot.kernels.gemm import gemm

    g = torch.Generator().manual_seed(4)
    w = (torch.randn(20, 300, generator=g) * 0.02).bfloat16()
    w[3, 17] = float("inf")
    w[8, 200] = float("nan")
    w[7, 40:60] = 1e-39
    enc = to_device(encode(w))
    x = make_x(5, 300)
    check(gemm(x, enc, dataclasses.replace(STREAM, programs_per_sm=4)), x, enc)


def test_deterministic_and_resets_its_counters(make_weight, make_x, check, device, to_device):
    from specpilot.kernels.gemm import gemm

    weight = to_device(encode(make_weight(37, 300, seed=3)))
    ws = SplitKWorkspace.allocate(device, 1 << 15, 64)
    x = make_x(17, 300)
    config = dataclasses.replace(STREAM, programs_per_sm=5)
    first = gemm(x, weight, config, ws)
    assert int(ws.counters.abs().sum()) == 0
    assert torch.equal(gemm(x, weight, config, ws).view(torch.int32), first.view(torch.int32))
    check(first, x, weight)


def test_fewer_programs_when_the_workspace_is_small(make_weight, make_x, check, device, to_device):
    """Two slots of [M, block_n] floats per program: a workspace of 2 x 17 x 16 x 2 floats holds
    two programs' partials, so a launch asking for 5 runs 2."""
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.launch import prepare_launch

    weight = to_device(encode(make_weight(37, 300, seed=3)))
    ws = SplitKWorkspace.allocate(device, stream_k.workspace_floats(2, 17, 16), 64)
    x = make_x(17, 300)
    config = dataclasses.replace(STREAM, programs_per_sm=5)
    assert prepare_launch(x, weight, config, KernelPath.GEMM, 64, ws).grid == (2, 1)
    check(gemm(x, weight, config, ws), x, weight)


def test_config_rules():
    assert STREAM.label() == "gemm n16 k128 w4 s1 streamk"
    assert LaunchConfig.from_dict(STREAM.to_dict()) == STREAM
    with pytest.raises(ValueError, match="stream_k"):
        LaunchConfig(KernelPath.GEMM, 16, 128, split_k=2, stream_k=True)
    with pytest.raises(ValueError, match="stream_k"):
        LaunchConfig(KernelPath.GEMV, 4, 128, stream_k=True)
