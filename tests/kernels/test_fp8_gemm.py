"""The FP8 kernel (`specpilot.kernels.fp8_gemm`) against the dequantize-then-matmul reference:
every finite e4m3 code decoded bit-exactly, exact sums where the math is exact, and within the
fp32-accumulation bound (`kernels.reference.error_bound`) for per-channel and block-wise scales,
several M (tile edges 1..129), bf16 / fp16 / float32 activations, split K and W8A8; malformed
operands are one-line ValueErrors."""

import pytest
import torch

E4M3 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def k():
    """The kernel module, imported once the conftest has set TRITON_INTERPRET (a `@triton.jit`
    decides interpreted or compiled when it is defined)."""
    from specpilot.kernels import fp8_gemm

    return fp8_gemm


def codes(N: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, K, generator=g) * 120).clamp(-448, 448).to(E4M3)


def scales(N: int, K: int, block_k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 100)
    return (torch.rand(N, -(-K // block_k), generator=g) + 0.05) * 1e-3


def test_every_finite_code_decodes_exactly(k, device):
    """x = the identity (M = 128 rows: the largest row tile) reads each weight column back: y = W.T
    bit for bit, every finite e4m3 byte (both signs, subnormals, +-0, +-448) in some column."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)  # 254 codes
    data = finite.repeat(16 * 128 // 254 + 1)[:16 * 128].view(16, 128).view(E4M3)
    scale = torch.exp2(torch.arange(16, dtype=torch.float32) - 8)[:, None]  # [16, 1], exact products
    x = torch.eye(128, device=device)
    y = k.fp8_gemm(x, data.to(device), scale.to(device), 128)
    assert torch.equal(y.cpu(), (data.float() * scale).T)


def test_sums_are_exact_where_the_math_is(k, device):
    """Small-integer x, codes of magnitude 2^-3..15 and power-of-two block scales: every product and
    partial sum is representable, so the kernel equals the reference exactly (block scales too)."""
    g = torch.Generator().manual_seed(5)
    sign = 1 - 2 * torch.randint(0, 2, (40, 256), generator=g)
    data = ((torch.rand(40, 256, generator=g) * 14.875 + 0.125) * sign).to(E4M3)  # multiples of 2^-6
    scale = torch.exp2(torch.randint(-3, 3, (40, 2), generator=g).float())
    x = torch.randint(-4, 5, (5, 256), generator=g).float()
    y = k.fp8_gemm(x.to(device), data.to(device), scale.to(device), 128)
    assert torch.equal(y.cpu(), x @ k.dequantize(data, scale, 128).T)


@pytest.mark.parametrize("block_k", ["channel", 128, 64])
@pytest.mark.parametrize("M", [1, 5, 17, 40, 129])
def test_weight_only_within_fp32_accumulation_of_the_reference(k, device, check, M, block_k):
    N, K = 72, 320  # partial row tile, partial K tile and (block 128) a partial scale block
    bk = K if block_k == "channel" else block_k
    data, scale = codes(N, K, M), scales(N, K, bk, M)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).bfloat16()
    y = k.fp8_gemm(x.to(device), data.to(device), scale.to(device), bk)
    check(y, x, k.dequantize(data, scale, bk))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_activation_dtypes(k, device, check, dtype):
    data, scale = codes(48, 256, 1), scales(48, 256, 128, 1)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = k.fp8_gemm(x.to(device), data.to(device), scale.to(device), 128)
    assert y.dtype == dtype
    check(y, x, k.dequantize(data, scale, 128))


def test_split_k_is_within_the_bound_and_deterministic(k, device, check):
    data, scale = codes(40, 512, 3), scales(40, 512, 128, 3)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(3))
    config = k.FP8Config(16, 32, 128, split_k=3)  # 4 K tiles over 2 splits of 2 (no empty split)
    y = k.fp8_gemm(x.to(device), data.to(device), scale.to(device), 128, config=config)
    check(y, x, k.dequantize(data, scale, 128))
    assert torch.equal(y, k.fp8_gemm(x.to(device), data.to(device), scale.to(device), 128, config=config))


@pytest.mark.parametrize("block_k", ["channel", 128])
def test_w8a8_matches_its_quantized_reference(k, device, check, block_k):
    from specpilot.kernels.fp8_activations import quantize_activations

    N, K, M = 40, 256, 6
    bk = K if block_k == "channel" else block_k
    data, scale = codes(N, K, 7), scales(N, K, bk, 7)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(8)).bfloat16()
    xq, xs = quantize_activations(x, bk)
    y = k.fp8_gemm(xq.to(device), data.to(device), scale.to(device), bk, x_scale=xs.to(device), out_dtype=torch.float32)
    assert y.dtype == torch.float32
    check(y, k.dequantize(xq, xs, bk), k.dequantize(data, scale, bk))
    assert torch.equal(y.cpu(), y.cpu())  # (finite)
    rel = (y.cpu() - k.reference(x, data, scale, bk)).abs().max() / k.reference(x, data, scale, bk).abs().max()
    assert 0 < rel < 0.05  # activation quantization changes the function, a little


def test_malformed_operands_are_rejected(k, device):
    data, scale = codes(16, 256, 0).to(device), scales(16, 256, 128, 0).to(device)
    x = torch.randn(2, 256, device=device).bfloat16()
    cases = [
        ((x, data.float(), scale, 128), "e4m3 weight codes"),
        ((x, data, scale[:, :1], 128), r"float32 weight scales \[16, 2\] for block_k=128"),
        ((x, data, scale.half(), 128), "float32 weight scales"),
        ((x[:, :200], data, scale, 128), r"activations \[M, 256\]"),
        ((x.to(torch.int32), data, scale, 128), "bf16, fp16 or float32 activations"),
        ((x, data, scales(16, 256, 40, 0).to(device), 40), "multiple of 16 columns"),
        ((x, data, scale, 0), "positive integer block_k"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            k.fp8_gemm(*args)
    with pytest.raises(ValueError, match=r"activation scales \[2, 2\]"):
        k.fp8_gemm(x.to(E4M3), data, scale, 128, x_scale=torch.ones(2, 1, device=device))
    with pytest.raises(ValueError, match="e4m3 activation codes"):
        k.fp8_gemm(x, data, scale, 128, x_scale=torch.ones(2, 2, device=device))
