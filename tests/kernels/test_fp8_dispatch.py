"""The FP8 kernel registry and `FP8Linear`'s choice: `auto` is the reference on CPU (bit-equal to
the dequantization rule), a named kernel runs under the interpreter within the fp32 bound, an
FP8 checkpoint made by `convert_fp8` gives the same greedy tokens with the Triton kernel as with
its reference path; kernels that cannot run, and unknown names, are one-line errors."""

import pytest
import torch
import torch.nn.functional as F

from specpilot.errors import ConfigError
from specpilot.kernels.fp8_dispatch import FP8Kernel, parse_kernel, resolve
from specpilot.models.fp8_linear import E4M3, FP8Linear, FP8Weight, set_fp8_kernel


def weight(N=48, K=256, block_k=128, seed=0) -> FP8Weight:
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randn(N, K, generator=g) * 100).clamp(-448, 448).to(E4M3)
    return FP8Weight(codes, torch.rand(N, -(-K // block_k), generator=g) * 1e-3 + 1e-4, block_k)


def test_names_and_auto():
    assert parse_kernel("w8a8-scaled-mm") is FP8Kernel.W8A8_SCALED_MM
    with pytest.raises(ConfigError, match="unknown FP8 kernel 'fp4'.*reference, triton"):
        parse_kernel("fp4")
    assert resolve(FP8Kernel.AUTO, torch.ones(1)) is FP8Kernel.REFERENCE  # CPU: the reference stays the default
    assert resolve(FP8Kernel.TRITON, torch.ones(1)) is FP8Kernel.TRITON


def test_cpu_default_is_the_dequantization_rule_bit_for_bit():
    w = weight()
    x = torch.randn(2, 3, 256)
    module = FP8Linear(w)
    assert module.kernel is FP8Kernel.AUTO
    assert torch.equal(module(x), F.linear(x, w.dequantize()))
    from specpilot.kernels.fp8_dispatch import linear

    assert torch.equal(linear(x, w.data, w.scale, 128, FP8Kernel.REFERENCE), module(x))


@pytest.mark.parametrize("kernel", ["triton", "w8a8-triton"])
def test_named_kernels_run_under_the_interpreter(device, check, kernel):
    from specpilot.kernels.fp8_activations import quantize_activations
    from specpilot.kernels.fp8_gemm import dequantize

    w = weight(block_k=256 if kernel == "w8a8-triton" else 128)
    module = FP8Linear(w, kernel).to(device)
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(1))
    y = module(x.to(device)).cpu()
    assert y.shape == (2, 3, 48)
    x2 = x.reshape(6, 256)
    if kernel == "w8a8-triton":
        xq, xs = quantize_activations(x2, 256)
        x2 = dequantize(xq, xs, 256)
    check(y.reshape(6, 48), x2, w.dequantize())


def test_kernels_that_cannot_run_say_why(monkeypatch):
    module = FP8Linear(weight(), "w8a8-scaled-mm")
    with pytest.raises(ValueError, match="'w8a8-scaled-mm' cannot run here: torch._scaled_mm needs a CUDA GPU"):
        module(torch.randn(1, 256))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="'triton' cannot run here: needs a CUDA device, or the CPU interpreter"):
        FP8Linear(weight(), "triton")(torch.randn(1, 256))
    with pytest.raises(ConfigError, match="unknown FP8 kernel"):
        FP8Linear(weight(), "fast")


def test_a_converted_checkpoint_decodes_the_same_tokens_with_the_kernel(tmp_path, device):
    """`fp8 convert`'s block-wise twin of a tiny model (partial 128-blocks): greedy next tokens at
    every position and the logits, Triton kernel vs reference path, float32 (the interpreter on
    CPU, compiled on a GPU)."""
    from specpilot.models.fp8_checkpoint import convert_fp8
    from specpilot.models.loading import load_model
    from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint

    src = write_random_checkpoint(tmp_path / "src", tiny_config(num_layers=2, hidden_size=144, intermediate_size=200,
                                                                num_heads=4, num_kv_heads=2, head_dim=40))
    convert_fp8(src, tmp_path / "fp8")
    model = load_model(tmp_path / "fp8", device=device, dtype=torch.float32)
    tokens = torch.tensor([[5, 17, 300, 9, 4000, 2, 77, 1024]], device=device)
    with torch.no_grad():
        set_fp8_kernel(model, "reference")  # 'auto' is the kernel itself on a GPU
        ref = model.forward_causal(tokens)
        assert set_fp8_kernel(model, "triton") == 2 * 4  # qkv, o, gate_up, down per layer
        got = model.forward_causal(tokens)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()
    assert not torch.equal(got, ref)  # a different summation: the kernel did run


def test_auto_falls_back_to_the_reference_once_when_the_kernel_fails(monkeypatch):
    """A Triton run that raises (a compiler the kernel does not support) under `auto`: one warning,
    the reference's result, and the reference from then on; a named kernel still raises."""
    from dataclasses import replace

    from specpilot.kernels import fp8_dispatch as d

    def broken(*args):
        raise RuntimeError("no e4m3 on this device\nmore")

    monkeypatch.setattr(d, "_AUTO_FALLBACK", None)
    monkeypatch.setattr(d, "resolve", lambda k, x: d.FP8Kernel.TRITON if d._AUTO_FALLBACK is None and k is d.FP8Kernel.AUTO
                        else (d.FP8Kernel.REFERENCE if k is d.FP8Kernel.AUTO else k))
    triton = d.backend(d.FP8Kernel.TRITON)
    monkeypatch.setitem(d._REGISTRY, d.FP8Kernel.TRITON, replace(triton, why_not=lambda *a: None, run=broken))
    data = (torch.randn(8, 16) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(8, 1) + 0.1
    x = torch.randn(3, 16)
    want = d.linear(x, data, scale, 16, d.FP8Kernel.REFERENCE)
    with pytest.warns(RuntimeWarning, match="no e4m3 on this device"):
        assert torch.equal(d.linear(x, data, scale, 16, d.FP8Kernel.AUTO), want)
    assert d._AUTO_FALLBACK.startswith("RuntimeError: no e4m3 on this device")
    assert torch.equal(d.linear(x, data, scale, 16, d.FP8Kernel.AUTO), want)  # no second warning needed
    with pytest.raises(RuntimeError, match="no e4m3"):
        d.linear(x, data, scale, 16, d.FP8Kernel.TRITON)
