"""Tensor-core GEMM kernel (1..128 rows) vs the reference, W12 and plain weights (interpreter on CPU)."""

import dataclasses

import pytest
import torch

from specpilot.kernels.configs import KernelPath, LaunchConfig, block_m
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12 import encode

# numpy (the interpreter) warns when 0 * Inf makes a NaN, which these tests do on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CONFIGS = [
    LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128),
    LaunchConfig(KernelPath.GEMM, block_n=32, block_k=256, split_k=2),
    LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, num_stages=3),
    LaunchConfig(KernelPath.GEMM, block_n=64, block_k=128, split_k=2, num_stages=2, ptx_decode=False),
]


@pytest.fixture(scope="module")
def weights(make_weight, to_device):
    w = make_weight(37, 300)
    return {"w12": to_device(encode(w)), "dense": to_device(w)}


@pytest.mark.parametrize("M", [1, 3, 8, 17, 64, 128])  # 128: a verify tree, a 128-row block
@pytest.mark.parametrize("fmt", ["w12", "dense"])
@pytest.mark.parametrize("config", CONFIGS[:2], ids=lambda c: c.label())
def test_matches_reference(weights, make_x, check, M, fmt, config):
    from specpilot.kernels.gemm import gemm

    x = make_x(M, 300)  # float32 output: the bound is tight enough to see a lost escape
    check(gemm(x, weights[fmt], config), x, weights[fmt])


@pytest.mark.parametrize("M", [3, 17])
def test_bf16_activations(weights, make_x, check, M):
    from specpilot.kernels.gemm import gemm

    x = make_x(M, 300, dtype=torch.bfloat16)
    for weight in weights.values():
        check(gemm(x, weight, CONFIGS[0]), x, weight)


@pytest.mark.parametrize("M", [1, 17])
@pytest.mark.parametrize("fmt", ["w12", "dense"])
@pytest.mark.parametrize("config", CONFIGS[2:], ids=lambda c: c.label())
@pytest.mark.slow
def test_variants_match_reference(weights, make_x, check, M, fmt, config):
    """A pipelined loop, a 64-row block, the portable decoder by name (split-K: 2 splits of 1-2 K steps)."""
    from specpilot.kernels.gemm import gemm

    x = make_x(M, 300)
    check(gemm(x, weights[fmt], config), x, weights[fmt])


@pytest.mark.parametrize("shape", [(16, 256), (37, 300)])
@pytest.mark.slow
def test_pipelined_loop_matches_the_plain_loop(make_weight, make_x, to_device, check, shape):
    """Even tiles (unmasked loads) and odd ones: a pipelined K loop gives the plain loop's result
    bit for bit (same arithmetic in the same order)."""
    from specpilot.kernels.gemm import gemm

    w = make_weight(*shape, seed=5)
    x = make_x(5, shape[1])
    plain = LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128)
    for weight in map(to_device, (encode(w), w)):
        y = gemm(x, weight, dataclasses.replace(plain, num_stages=3))
        check(y, x, weight)
        assert torch.equal(y.view(torch.int32), gemm(x, weight, plain).view(torch.int32))


@pytest.mark.parametrize("M", [1, 20])
def test_w12_equals_the_bf16_kernel_without_escapes(check_w12_equals_plain, M):
    """Decoding scaled by 2^(112 - e0) and scaling each row back is exact: on weights without
    escapes the W12 kernel gives the plain kernel's output bit for bit (same tiles, same order)."""
    from specpilot.kernels.gemm import gemm

    check_w12_equals_plain(gemm, LaunchConfig(KernelPath.GEMM, block_n=16, block_k=256, split_k=2), 40, M)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label())
@pytest.mark.slow
def test_escape_blocks_match_the_reference(make_x, to_device, check, block_weight, config):
    """Escape blocks for every test config: split-K (each split adds its own columns), a 64-row
    block, a pipelined loop, the portable decoder; the epilogue correction too."""
    from specpilot.kernels.gemm import ESC_BLOCKS, escape_plan, gemm

    enc = to_device(encode(block_weight(37, 300)))
    mode, found = escape_plan(enc, config)
    assert mode == ESC_BLOCKS and found.entries > enc.num_escapes  # some escapes took two entries
    for M in (1, 17, 100):
        x = make_x(M, 300)
        check(gemm(x, enc, config), x, enc)
        check(gemm(x, enc, config, escapes="epilogue"), x, enc)


@pytest.mark.parametrize("M", [1, 17, 33])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.slow
def test_gather_from_transposed_x_equals_the_row_gather(make_x, to_device, check, block_weight, M, split_k):
    """`gather_t` reads the escape blocks' x values from a transposed copy: the same values, so
    the same output bit for bit; without escape blocks (the epilogue path, plain weights) it
    changes nothing."""
    from specpilot.kernels.gemm import gemm

    enc = to_device(encode(block_weight(37, 300)))
    x = make_x(M, 300)
    rows = LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, split_k=split_k)
    transposed = dataclasses.replace(rows, gather_t=True)
    assert transposed.label().endswith(" xT")
    y = gemm(x, enc, transposed)
    check(y, x, enc)
    assert torch.equal(y.view(torch.int32), gemm(x, enc, rows).view(torch.int32))
    epilogue = gemm(x, enc, transposed, escapes="epilogue")
    assert torch.equal(epilogue.view(torch.int32), gemm(x, enc, rows, escapes="epilogue").view(torch.int32))


@pytest.mark.parametrize("M", [1, 17, 33])
@pytest.mark.parametrize("config", [
    LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, num_stages=2),
    LaunchConfig(KernelPath.GEMM, block_n=32, block_k=256, split_k=2),
    LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, split_k=3, gather_t=True),
], ids=lambda c: c.label())
@pytest.mark.slow
def test_tma_loads_give_the_cp_async_result(make_x, make_weight, to_device, check, block_weight, M, config):
    """`tma` loads the weight tiles from tensor descriptors: the same tiles (TMA's zeros past N,
    Kp and K are the masks' zeros), so the output equals the cp.async path's bit for bit -- W12
    with escape blocks, with the epilogue correction (Inf/NaN escapes), plain BF16 and float32
    weights, on shapes no tile divides (37 rows, 300 columns)."""
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.launch import weight_operands
    from specpilot.kernels.tma import descriptors

    tma = dataclasses.replace(config, tma=True)
    assert tma.label().endswith(" tma") and LaunchConfig.from_dict(tma.to_dict()) == tma
    blocks, heavy = to_device(encode(block_weight(37, 304))), to_device(encode(make_weight(37, 304)))
    plain = to_device(make_weight(37, 304, seed=6))
    x = make_x(M, 304)
    for weight in (blocks, heavy, plain, plain.float()):
        assert descriptors(weight, weight_operands(weight), tma) is not None  # TMA really runs
        y = gemm(x, weight, tma)
        check(y, x, weight)
        assert torch.equal(y.view(torch.int32), gemm(x, weight, config).view(torch.int32))
    y = gemm(x, blocks, tma, escapes="epilogue")
    assert torch.equal(y.view(torch.int32), gemm(x, blocks, config, escapes="epilogue").view(torch.int32))


def test_tma_falls_back_to_cp_async_where_a_descriptor_cannot_describe_the_weight(make_x, make_weight, to_device, check):
    """A TMA box needs 16-byte-aligned rows and at most 256 elements per side: a plain weight of
    300 BF16 columns (600-byte rows) or a 512-column K step keeps the cp.async path -- same
    output, no error; W12 planes (rows of Kp bytes, Kp a multiple of 128) always qualify."""
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.launch import weight_operands
    from specpilot.kernels.tma import descriptors

    w = to_device(make_weight(37, 300, seed=7))
    x = make_x(3, 300)
    tma = LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, tma=True)
    assert descriptors(w, weight_operands(w), tma) is None
    assert descriptors(w, weight_operands(w), dataclasses.replace(tma, block_k=512)) is None
    enc = to_device(encode(w))
    assert descriptors(enc, weight_operands(enc), tma) is not None
    y = gemm(x, w, tma)
    check(y, x, w)
    assert torch.equal(y.view(torch.int32), gemm(x, w, dataclasses.replace(tma, tma=False)).view(torch.int32))
    with pytest.raises(ValueError, match="tma and tma_x are options of the GEMM path"):
        LaunchConfig(KernelPath.GEMV, block_n=4, block_k=128, tma=True)


@pytest.mark.parametrize("M", [16, 27, 48, 100])
@pytest.mark.parametrize("config", [
    LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, num_stages=2),
    LaunchConfig(KernelPath.GEMM, block_n=32, block_k=256, split_k=2, tma=True),
    LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, split_k=3, gather_t=True, tma=True),
], ids=lambda c: c.label())
@pytest.mark.slow
def test_tma_x_loads_give_the_plain_result(make_x, make_weight, to_device, check, block_weight, M, config):
    """`tma_x` loads each K step's x tile as a TMA box of x [BM, BK] and transposes it in shared
    memory: the same values (TMA's zeros past M and K are the masks' zeros), so the output equals the
    masked loads' bit for bit -- W12 with escape blocks and with the epilogue correction, plain
    weights, with and without the weight tiles by TMA, on 37 x 304 (no tile divides K), at row
    counts that fill a box, or three quarters of one (x's box is used for no others)."""
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.tma import x_descriptor

    tx = dataclasses.replace(config, tma_x=True)
    assert tx.label().endswith(" tmax") and LaunchConfig.from_dict(tx.to_dict()) == tx
    blocks, heavy = to_device(encode(block_weight(37, 304))), to_device(encode(make_weight(37, 304)))
    plain = to_device(make_weight(37, 304, seed=6))
    x = make_x(M, 304, dtype=torch.bfloat16)
    assert x_descriptor(x, block_m(KernelPath.GEMM, M), tx) is not None  # TMA really runs
    for weight in (blocks, heavy, plain):
        y = gemm(x, weight, tx)
        check(y, x, weight)
        assert torch.equal(y.view(torch.int16), gemm(x, weight, config).view(torch.int16))
    y = gemm(x, blocks, tx, escapes="epilogue")
    assert torch.equal(y.view(torch.int16), gemm(x, blocks, config, escapes="epilogue").view(torch.int16))


@pytest.mark.slow
def test_tma_x_falls_back_to_plain_loads_where_a_descriptor_cannot_describe_x(make_x, to_device, check, block_weight):
    """x's box needs 16-byte-aligned rows and a K step of at most 256; float32 x keeps the plain
    loads too (only 16-bit boxes are built), and so does an x that fills less than three quarters
    of the box's rows (boxes far past x's last row were slow on the H200). Each case runs the
    masked loads: same output, no error."""
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.tma import x_descriptor

    tx = LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, tma_x=True)
    w300, w304 = (to_device(encode(block_weight(37, k))) for k in (300, 304))
    cases = {"600-byte rows": (make_x(3, 300, dtype=torch.bfloat16), w300, tx),
             "float32": (make_x(3, 304), w304, tx),
             "512-column step": (make_x(3, 304, dtype=torch.bfloat16), w304, dataclasses.replace(tx, block_k=512)),
             "17 rows in a 32-row box": (make_x(17, 304, dtype=torch.bfloat16), w304, tx),
             "47 rows in a 64-row box": (make_x(47, 304, dtype=torch.bfloat16), w304, tx)}
    for name, (x, w, cfg) in cases.items():
        assert x_descriptor(x, block_m(KernelPath.GEMM, x.shape[0]), cfg) is None, name
        y, plain = gemm(x, w, cfg), gemm(x, w, dataclasses.replace(cfg, tma_x=False))
        check(y, x, w)
        assert torch.equal(y.view(torch.int16), plain.view(torch.int16)), name  # float32: as int16 pairs
    with pytest.raises(ValueError, match="tma and tma_x are options of the GEMM path"):
        LaunchConfig(KernelPath.GEMV, block_n=4, block_k=128, tma_x=True)


def test_escape_modes(weights, make_x, to_device):
    """Weights with Inf/NaN/subnormal escapes fall back to the epilogue; "blocks" then refuses;
    a weight without escapes adds none; an unknown mode is an error."""
    from specpilot.kernels.gemm import ESC_EPILOGUE, ESC_NONE, escape_plan, gemm

    assert escape_plan(weights["w12"], CONFIGS[0])[0] == ESC_EPILOGUE
    with pytest.raises(ValueError, match="no escape blocks"):
        gemm(make_x(2, 300), weights["w12"], CONFIGS[0], escapes="blocks")
    assert escape_plan(encode(torch.ones(4, 128).bfloat16()), CONFIGS[0])[0] == ESC_NONE
    assert escape_plan(weights["dense"], CONFIGS[0])[0] == ESC_NONE
    with pytest.raises(ValueError, match="escapes must be one of"):
        gemm(make_x(2, 300), weights["w12"], CONFIGS[0], escapes="sometimes")


def test_many_escapes_per_tile_and_non_finite_ones_in_one_chunk(make_x, to_device, check):
    from specpilot.kernels.gemm import gemm

    g = torch.Generator().manual_seed(4)
    w = (torch.randn(20, 256, generator=g) * 0.02).bfloat16()
    w[3, ::5] = 0.0  # 52 escapes in one row: four chunks of 16
    w[3, 17] = float("inf")  # non-finite escapes inside a chunk of finite ones
    w[3, 18] = float("inf")
    w[7, 40:60] = 1e-39
    w[8, 100] = float("nan")
    enc = to_device(encode(w))
    x = make_x(5, 256)
    x[1, 17] = 0.0  # 0 * Inf -> NaN in row 3 for token 1 only
    for config in (CONFIGS[0], CONFIGS[2]):
        check(gemm(x, enc, config), x, enc)


@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (5, 1), (3, 129)])
def test_tiny_and_odd_shapes(make_weight, make_x, to_device, check, shape):
    from specpilot.kernels.gemm import gemm

    w = make_weight(*shape, seed=2)
    x = make_x(18, shape[1])
    for weight in map(to_device, (encode(w), w, w.float())):
        check(gemm(x, weight, CONFIGS[0]), x, weight)


@pytest.mark.slow
def test_split_k_is_deterministic_and_resets_its_counters(weights, make_x, check, device):
    from specpilot.kernels.gemm import gemm

    ws = SplitKWorkspace.allocate(device, 1 << 15, 64)
    x = make_x(17, 300)
    config = LaunchConfig(KernelPath.GEMM, block_n=16, block_k=128, split_k=3)
    first = gemm(x, weights["w12"], config, ws)
    assert int(ws.counters.abs().sum()) == 0
    again = gemm(x, weights["w12"], config, ws)
    assert torch.equal(again.view(torch.int32), first.view(torch.int32))  # bit for bit, NaNs included
    check(first, x, weights["w12"])


def test_rejects_bad_inputs(weights, make_x):
    from specpilot.kernels.gemm import gemm

    with pytest.raises(ValueError, match="rows"):
        gemm(make_x(129, 300), weights["w12"], CONFIGS[0])
    with pytest.raises(ValueError, match="gemv config"):
        gemm(make_x(2, 300), weights["w12"], LaunchConfig(KernelPath.GEMV, 4, 128))
    with pytest.raises(ValueError, match="block_n"):
        LaunchConfig(KernelPath.GEMM, 8, 128)
    with pytest.raises(ValueError, match="programs_per_sm"):
        LaunchConfig(KernelPath.GEMM, 16, 128, programs_per_sm=0)
    with pytest.raises(ValueError, match="gather_t"):
        LaunchConfig(KernelPath.GEMV, 4, 128, gather_t=True)
    with pytest.raises(ValueError, match="resident"):
        LaunchConfig(KernelPath.GEMM, 64, 256, resident=1)


def test_register_cap_follows_the_programs_per_sm_it_must_leave_room_for():
    base = LaunchConfig(KernelPath.GEMM, 64, 256, num_stages=2)
    capped = dataclasses.replace(base, resident=3)
    assert (base.max_registers, capped.max_registers) == (248, 168)  # 65536 registers / (128 threads x 3)
    assert capped.label() == "gemm n64 k256 w4 s2 r3"
    assert LaunchConfig.from_dict(capped.to_dict()) == capped
    assert LaunchConfig.from_dict({k: v for k, v in base.to_dict().items() if k != "resident"}) == base  # old tables
