"""GEMV kernel (1..8 rows) vs the reference, W12 and plain weights (interpreter on CPU)."""

import dataclasses

import pytest
import torch

from specpilot.kernels.configs import KernelPath, LaunchConfig
from specpilot.kernels.workspace import SplitKWorkspace
from specpilot.w12 import encode

# numpy (the interpreter) warns when 0 * Inf makes a NaN, which these tests do on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CONFIGS = [  # few programs each: the interpreter pays per program
    LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128),
    LaunchConfig(KernelPath.GEMV, block_n=16, block_k=256, split_k=2),
    LaunchConfig(KernelPath.GEMV, block_n=4, block_k=128, split_k=3, num_warps=2),
    LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128, num_stages=3),  # a pipelined K loop
    LaunchConfig(KernelPath.GEMV, block_n=16, block_k=256, split_k=2, num_stages=2),  # 1 step per split
    LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128, ptx_decode=False),  # the portable decoder by name
]


@pytest.fixture(scope="module")
def weights(make_weight, to_device):
    w = make_weight(37, 300)
    return {"w12": to_device(encode(w)), "dense": to_device(w)}


# Under the interpreter every config decodes W12 with the portable decoder (`launch.ptx_decode`), so
# the config that asks for it by name runs the plain config's code: compiled (on a GPU) only.
HERE = CONFIGS if torch.cuda.is_available() else [c for c in CONFIGS if c.ptx_decode]
# every config at 1 and 8 rows (one and eight accumulators); the masked row block of 3 rows (four
# accumulators, one past M) on the plain and the split-K config
ROWS = [(c, M) for c in HERE for M in (1, 8)] + [(c, 3) for c in CONFIGS[:2]]


@pytest.mark.parametrize("fmt", ["w12", "dense"])
@pytest.mark.parametrize("config, M", ROWS, ids=lambda v: v.label() if isinstance(v, LaunchConfig) else str(v))
@pytest.mark.slow
def test_matches_reference(weights, make_x, check, M, fmt, config):
    from specpilot.kernels.gemv import gemv

    x = make_x(M, 300)  # float32 output: the bound is tight enough to see a lost escape
    check(gemv(x, weights[fmt], config), x, weights[fmt])


@pytest.mark.parametrize("M", [1, 3])
def test_bf16_activations(weights, make_x, check, M):
    from specpilot.kernels.gemv import gemv

    x = make_x(M, 300, dtype=torch.bfloat16)
    for weight in weights.values():
        check(gemv(x, weight, CONFIGS[1]), x, weight)


@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (5, 1), (3, 129)])
@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3]], ids=lambda c: c.label())
def test_tiny_and_odd_shapes(make_weight, make_x, to_device, check, shape, config):
    from specpilot.kernels.gemv import gemv

    w = make_weight(*shape, seed=2)
    x = make_x(2, shape[1])
    for weight in map(to_device, (encode(w), w, w.float())):
        check(gemv(x, weight, config), x, weight)


def test_plain_weight_views_that_break_pair_alignment(make_x, to_device, check, device):
    """A BF16 view starting at an odd column (2-byte aligned) cannot be read a pair per 32-bit
    load: `dense_pairs` says so and the per-code loads give a correct output -- under the
    interpreter the contiguous copy's bit for bit. (Compiled, the two loads get different register
    layouts, so the sum over each row's lanes is ordered differently: on the H200 the outputs
    differed in the last 1-3 bits.)"""
    from specpilot.kernels.gemv import dense_pairs, gemv

    full = to_device((torch.randn(8, 258, generator=torch.Generator().manual_seed(4)) * 0.02).bfloat16())
    view, copy = full[:, 1:-1], full[:, 1:-1].contiguous()
    assert not dense_pairs(view) and dense_pairs(copy)
    x = make_x(2, 256)
    config = LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128)
    y, y_copy = gemv(x, view, config), gemv(x, copy, config)
    check(y, x, view)
    check(y_copy, x, copy)
    if device == "cpu":
        assert torch.equal(y.view(torch.int32), y_copy.view(torch.int32))


@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.slow
def test_pipelined_loop_on_even_tiles(make_weight, make_x, to_device, check, M):
    """N and K multiples of the tile (the unmasked loads): a pipelined K loop gives the plain loop's
    result bit for bit (same arithmetic in the same order)."""
    from specpilot.kernels.gemv import gemv

    w = make_weight(16, 384, seed=3)
    x = make_x(M, 384)
    plain = LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128)
    for weight in map(to_device, (encode(w), w)):
        y = gemv(x, weight, dataclasses.replace(plain, num_stages=3))
        check(y, x, weight)
        assert torch.equal(y.view(torch.int32), gemv(x, weight, plain).view(torch.int32))


@pytest.mark.parametrize("M", [1, 5])
def test_w12_equals_the_bf16_kernel_without_escapes(check_w12_equals_plain, M):
    """Decoding scaled by 2^(112 - e0) and scaling each row back is exact, and both formats sum
    the same products in the same order: on weights without escapes the W12 kernel gives the
    plain kernel's output bit for bit."""
    from specpilot.kernels.gemv import gemv

    check_w12_equals_plain(gemv, LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128, split_k=2), 24, M)


@pytest.mark.parametrize("config", [c for c in (CONFIGS[0], CONFIGS[1], CONFIGS[5]) if c in HERE],
                         ids=lambda c: c.label())
@pytest.mark.slow
def test_escape_blocks_match_the_reference(make_x, to_device, check, block_weight, config):
    """Escape blocks with one K split and with two (each split adds its own columns), and with the
    portable decoder; the epilogue correction too; with escapes "off" the output differs, so they
    are really added."""
    from specpilot.kernels.gemm import ESC_BLOCKS, escape_plan
    from specpilot.kernels.gemv import gemv

    enc = to_device(encode(block_weight(37, 300)))
    assert escape_plan(enc, config)[0] == ESC_BLOCKS
    for M in (1, 5):
        x = make_x(M, 300)
        y = gemv(x, enc, config)
        check(y, x, enc)
        check(gemv(x, enc, config, escapes="epilogue"), x, enc)
        assert not torch.equal(gemv(x, enc, config, escapes="off"), y)


@pytest.mark.parametrize("config", [c for c in (CONFIGS[0], CONFIGS[1], CONFIGS[5]) if c in HERE],
                         ids=lambda c: c.label())
@pytest.mark.slow
def test_escape_blocks_added_into_the_accumulators(make_x, to_device, check, config):
    """A slab of at most G = block_k / 8 entries is added into the [BN, G] accumulators, one entry
    per lane (the path the benchmark shapes take: a few escapes per row block), with and without
    K splits; the test weight of `test_escape_blocks_match_the_reference` needs wider slabs,
    which take the one-hot sum after the loop."""
    from specpilot.kernels.configs import GEMV_MAX_M
    from specpilot.kernels.gemm import ESC_BLOCKS, escape_operands
    from specpilot.kernels.gemv import gemv
    from specpilot.kernels.launch import prepare_launch

    w = (torch.randn(37, 300, generator=torch.Generator().manual_seed(7)) * 0.02).bfloat16()
    w[1, 3] = 0.0  # one entry
    w[2, 299] = -0.0  # the last column
    w[9, 10], w[9, 200] = 1e-12, -3.0e4  # two entries each
    w[36, 150] = 0.0  # the last, partial row block
    enc = to_device(encode(w))
    for M in (1, 5):
        x = make_x(M, 300)
        y = gemv(x, enc, config)
        run = prepare_launch(x, enc, config, KernelPath.GEMV, GEMV_MAX_M, None)
        mode, _, _, slot = escape_operands(run, enc, config)  # what the launch above used
        assert mode == ESC_BLOCKS and slot <= config.block_k // 8
        check(y, x, enc)
        assert not torch.equal(gemv(x, enc, config, escapes="off"), y)
        x[:, 0] = float("inf")  # padding lanes read column 0 and must add 0, not 0 * Inf = NaN
        check(gemv(x, enc, config), x, enc)


@pytest.mark.slow
def test_split_k_is_deterministic_and_resets_its_counters(weights, make_x, device):
    from specpilot.kernels.gemv import gemv

    ws = SplitKWorkspace.allocate(device, 1 << 14, 64)
    x = make_x(3, 300)
    first = gemv(x, weights["w12"], CONFIGS[2], ws)
    assert int(ws.counters.abs().sum()) == 0
    again = gemv(x, weights["w12"], CONFIGS[2], ws)
    assert torch.equal(again.view(torch.int32), first.view(torch.int32))  # bit for bit, NaNs included


@pytest.mark.parametrize("K, col_dtype", [(40_000, torch.int16), (65_536 + 128, torch.int32)])
@pytest.mark.slow
def test_wide_rows_escape_columns(make_x, to_device, check, K, col_dtype):
    """Columns >= 32768 are negative in int16 storage (uint16 values); beyond 65536 they are int32."""
    from specpilot.kernels.gemm import gemm
    from specpilot.kernels.gemv import gemv

    w = (torch.randn(2, K, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    w[1, 39_000] = 40.0
    w[0, K - 1] = 0.0
    enc = to_device(encode(w))
    assert enc.esc_col.dtype == col_dtype
    x = make_x(1, K)
    check(gemv(x, enc, LaunchConfig(KernelPath.GEMV, 2, 4096, num_warps=2)), x, enc)
    check(gemm(x, enc, LaunchConfig(KernelPath.GEMM, 16, 1024)), x, enc)  # a 4096-column tile needs 256 KB of shared memory


def test_rejects_bad_inputs(weights, make_x):
    from specpilot.kernels.gemv import gemv

    with pytest.raises(ValueError, match="rows"):
        gemv(make_x(9, 300), weights["w12"], CONFIGS[0])
    with pytest.raises(ValueError, match="x must be"):
        gemv(make_x(2, 299), weights["w12"], CONFIGS[0])
    with pytest.raises(ValueError, match="gemm config"):
        gemv(make_x(2, 300), weights["w12"], LaunchConfig(KernelPath.GEMM, 16, 128))
