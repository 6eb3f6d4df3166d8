"""The Triton kernels compiled for a real GPU against the pure-torch reference (`pytest -m gpu`).

`tests/kernels` runs the same kernels under Triton's interpreter on CPU; this file checks what only
a GPU can: the compiled GEMV, tensor-core GEMM and W12 unpack, reached through
`specpilot.kernels.dispatch` the way the engine reaches them. Invariants: the unpack equals the
reference decoder bit for bit; a projection equals `reference_linear` within `error_bound`, with
non-finite outputs equal exactly. Kernel modules are imported inside the tests, so collecting this
file on a CPU machine never imports Triton compiled (which would break the interpreter tests).
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

# (M, N, K): GEMV rows (1, 2), tensor-core GEMM rows (5, 16, 64), past GEMM_MAX_M (65: decode +
# cuBLAS); odd N and K included.
SHAPES = [(1, 37, 300), (2, 256, 640), (5, 1000, 2048), (16, 512, 1536), (64, 384, 1024), (65, 96, 512)]


def weight_with_escapes(N: int, K: int, seed: int = 0) -> torch.Tensor:
    """BF16 [N, K] of scale 0.02 with escapes in the first rows: zeros, values far outside the
    row's window (large and subnormal), +Inf and NaN, and a zero in the last column."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.02
    w[0, 3] = float("inf")
    w[1] = 0.0
    w[2, ::7] = 0.0
    w[3, 1], w[3, 2] = 3.0e4, 1e-40
    w[4, K // 2] = float("nan")
    w[N - 1, K - 1] = 0.0
    return w.bfloat16()


def activations(M: int, K: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """[M, K] on CUDA, BF16 values held in `dtype`; x[0, 3] = 0 makes 0 * Inf = NaN in row 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).bfloat16()
    x[0, 3] = 0.0
    return x.to(device="cuda", dtype=dtype)


def assert_within_error_bound(y: torch.Tensor, x: torch.Tensor, weight) -> None:
    from specpilot.kernels.timing import check_output

    assert y.dtype == x.dtype and y.shape == (x.shape[0], weight.shape[0])
    worst = check_output(y, x, weight)  # raises where NaN/Inf positions differ from the reference
    assert worst <= 1.0, f"error {worst:.3g}x the bound"


@pytest.mark.parametrize("N, K", [(37, 300), (1000, 2048)])
def test_unpack_kernel_equals_the_reference_decoder(N, K):
    from specpilot.kernels.dispatch import dense
    from specpilot.w12 import decode, encode

    enc = encode(weight_with_escapes(N, K).cuda())
    assert enc.num_escapes > 0
    got, want = dense(enc), decode(enc)
    assert got.is_cuda and torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_w12_projection_matches_the_reference(M, N, K, dtype):
    from specpilot.kernels.dispatch import kernels_available, linear
    from specpilot.w12 import encode

    x = activations(M, K, dtype)
    assert kernels_available(x)
    weight = encode(weight_with_escapes(N, K)).to("cuda")
    assert_within_error_bound(linear(x, weight), x, weight)


@pytest.mark.parametrize("M, N, K", SHAPES[:4])
def test_dense_projection_matches_the_reference(M, N, K):
    from specpilot.kernels.dispatch import linear

    x = activations(M, K, torch.bfloat16)
    weight = (torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * 0.02).bfloat16().cuda()
    assert_within_error_bound(linear(x, weight), x, weight)
