"""Kernel tests: compiled on a CUDA GPU when there is one, else on CPU under Triton's interpreter.

Triton decides interpreted vs compiled when a `@triton.jit` function is defined, and its own
standard library (tl.zeros, tl.sum, ...) is defined when `triton.language` is first imported --
which `torch` may do early (loading a model on the meta device imports it). So on a machine
without CUDA this conftest imports `triton.language` with TRITON_INTERPRET=1 at collection time,
then restores the variable; the tests below set it again while they run (the kernel modules are
imported then). If Triton was already imported compiled, or is not installed, the tests skip.
"""

import importlib
import importlib.util
import os
import sys

import pytest
import torch

from specpilot.kernels.reference import error_bound, reference_linear
from specpilot.w12.layout import bits_to_bf16

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"  # compiled kernels on a GPU, the interpreter on CPU

if not ON_GPU and importlib.util.find_spec("triton") is not None and "triton.language" not in sys.modules:
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    importlib.import_module("triton.language")
    if previous is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = previous


@pytest.fixture(scope="module", autouse=True)
def triton_runtime():
    """TRITON_INTERPRET=1 while each kernel test module runs, unset after it (module scope: tests/kernels is
    not a package, so a "package" fixture would outlive it and send every later test in the worker,
    hybrid GDN layers included, through the interpreter)."""
    pytest.importorskip("triton")
    if ON_GPU:
        yield
        return
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(standard.zeros, InterpretedFunction):
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set; run tests/kernels on its own")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        gemv = importlib.import_module("specpilot.kernels.gemv")
        if not isinstance(gemv._gemv_kernel, InterpretedFunction):
            pytest.skip("kernel modules were imported compiled before the interpreter tests")
        yield


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """A fresh SPECPILOT_HOME: tables a developer's own loop tuned (the user cache) never leak in."""
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))


def escape_heavy_weight(N: int, K: int, seed: int = 0) -> torch.Tensor:
    """BF16 [N, K] weights of scale 0.02 with every kind of escape in the first rows:
    row 0 zeros and +Inf, row 1 all zero, row 2 a high window with zeros (a missing placeholder
    correction would show), row 3 subnormals and large values, row 4 NaN, row 5 -Inf, and an
    escape in the last column of the last row and at a high-nibble column."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.02

    def cols(*c):
        return [k % K for k in c]

    if N > 6:
        w[0, cols(0, 7)] = 0.0
        w[0, cols(5)] = float("inf")
        w[1] = 0.0
        w[2] = torch.randn(K, generator=g) * 2.0**9
        w[2, cols(1, 70, 200)] = 0.0
        w[3, cols(2, 3)] = 1e-40
        w[3, cols(4, 100)] = 3.0e4
        w[4, cols(9)] = float("nan")
        w[5, cols(11)] = -float("inf")
    w[N - 1, K - 1] = 0.0
    w[N - 1, cols(64 + 3)] = 5e3
    return w.bfloat16()


def escape_free_weight(N: int, K: int, seed: int = 3, e0: int = 112) -> torch.Tensor:
    """BF16 [N, K] weights with no escapes: random signs and mantissas, exponents e0..e0+15 in
    every row (each exponent present, so every row's window is exactly that)."""
    g = torch.Generator().manual_seed(seed)
    exponent = e0 + torch.randint(0, 16, (N, K), generator=g)
    exponent[:, :16] = e0 + torch.arange(16)
    bits = (torch.randint(0, 2, (N, K), generator=g) << 15) | (exponent << 7) | torch.randint(0, 128, (N, K), generator=g)
    return bits_to_bf16(bits)


def escape_block_weight(N: int, K: int, seed: int = 6) -> torch.Tensor:
    """Scale-0.02 BF16 weights whose escapes all fit escape blocks (`specpilot.kernels.escape_blocks`):
    +-0 (one entry each), values far below and above the window (two entries), in a normal row, a
    high-window row and the last column; rows 3-5 need N > 5."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.02
    w[3, ::5] = 0.0
    w[3, 1] = -0.0
    w[4, 7] = 1e-12
    w[4, 8] = -3.0e4
    w[5] = torch.randn(K, generator=g) * 2.0**9
    w[5, [c % K for c in (1, 70, 200)]] = 0.0
    w[N - 1, K - 1] = 0.0
    w[N - 1, (64 + 3) % K] = 5e3
    return w.bfloat16()


def activations(M: int, K: int, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    """[M, K] activations on the test device, BF16 values (as the engine's are) held in `dtype`;
    x[0, 5] = 0 so the +Inf weight of row 0 yields NaN there, as in the reference."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).bfloat16()
    x[0, 5 % K] = 0.0
    return x.to(device=DEVICE, dtype=dtype)


def on_device(t):
    """A tensor or W12Weight moved to the test device."""
    return t.to(DEVICE)


def assert_matches_reference(y: torch.Tensor, x: torch.Tensor, weight) -> None:
    """Non-finite outputs equal the reference's exactly; finite ones are within `error_bound`.

    x and weight may live on the test device; the check runs on CPU in float64."""
    y, x, weight = y.cpu(), x.cpu(), weight.to("cpu")
    ref = reference_linear(x, weight)
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    inf = torch.isinf(ref)
    assert torch.equal(y[inf], ref[inf])
    fin = torch.isfinite(ref)
    assert torch.isfinite(y[fin]).all()
    exact, bound = error_bound(x, weight, y.dtype)
    err = (y.double() - exact).abs()
    worst = (err / bound)[fin].max().item() if fin.any() else 0.0
    assert worst <= 1.0, f"error {worst:.3g}x the bound"


def assert_w12_equals_plain(kernel, config, N: int, M: int) -> None:
    """On escape-free weights (`escape_free_weight` [N, 640]) `kernel` gives W12 the plain
    weights' output bit for bit: decoding scaled by 2^(112 - e0) and scaling each row back is
    exact, and the tiles and their order are the same."""
    from specpilot.w12 import encode

    w = escape_free_weight(N, 640)
    enc = encode(w)
    assert enc.num_escapes == 0
    x = activations(M, 640)
    y12 = kernel(x, on_device(enc), config)
    assert torch.equal(y12.view(torch.int32), kernel(x, on_device(w), config).view(torch.int32))


# Shared cases, handed to tests as fixtures (tests are not importable modules under
# --import-mode=importlib).
@pytest.fixture(scope="session")
def device():
    return DEVICE


@pytest.fixture(scope="session")
def to_device():
    return on_device


@pytest.fixture(scope="session")
def make_weight():
    return escape_heavy_weight


@pytest.fixture(scope="session")
def make_x():
    return activations


@pytest.fixture(scope="session")
def block_weight():
    return escape_block_weight


@pytest.fixture(scope="session")
def check():
    return assert_matches_reference


@pytest.fixture(scope="session")
def check_w12_equals_plain():
    return assert_w12_equals_plain


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _aot(*args: str, needs: str):
    """Run the AOT tool (`python -m specpilot.kernels.aot`) with `args` in a fresh process, where
    Triton is imported without TRITON_INTERPRET; skip unless Triton's NVIDIA backend ships the
    tool `needs` (ptxas, cuobjdump)."""
    import subprocess

    spec = importlib.util.find_spec("triton")
    if spec is None or not os.path.exists(os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", needs)):
        pytest.skip(f"Triton with its NVIDIA backend (bundled {needs}) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = env.get("TRITON_DEFAULT_FP_FUSION", "1")
    return subprocess.run([sys.executable, "-m", "specpilot.kernels.aot", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def aot():
    """`_aot`: the AOT tool's run, for the compile and SASS tests."""
    return _aot
