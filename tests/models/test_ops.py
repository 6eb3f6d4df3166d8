"""models/ops.py: the compiled elementwise ops survive the many variants one process runs."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch._dynamo

from specpilot.models import ops


def _variants():
    """Ranks 3 and 4, batch and token counts of 1 and more (Dynamo specializes size 1), three
    dtypes: more entries than Dynamo's default limit of 8."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    for rank, B, T, dtype in itertools.product((3, 4), (1, 2), (1, 3), dtypes):
        shape = (B, T, 8) if rank == 3 else (B, T, 2, 8)
        yield torch.randn(shape, dtype=dtype), torch.ones(8, dtype=dtype), 1e-6


@pytest.mark.slow
def test_compiled_norm_survives_more_variants_than_torchs_default_limit():
    """Dynamo's default keeps 8 entries per function; fullgraph=True makes the 9th a hard error,
    which the whole GPU test folder hit. `allow_recompiles` (run by the first compilation of an op) lifts it."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256):
        fn = torch.compile(ops.rms_norm, dynamic=True, fullgraph=True, backend="eager")
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):  # the failure this guards against
            for x, w, eps in _variants():
                fn(x, w, eps)
        torch._dynamo.reset()
        ops.allow_recompiles()
        assert torch._dynamo.config.recompile_limit == ops.RECOMPILE_LIMIT
        fn = ops._compiled("rms_norm", "eager")
        for x, w, eps in _variants():
            assert torch.equal(fn(x, w, eps), ops.rms_norm(x, w, eps))
    torch._dynamo.reset()


def test_allow_recompiles_never_lowers_the_limit():
    with torch._dynamo.config.patch(recompile_limit=1000, accumulated_recompile_limit=10_000):
        ops.allow_recompiles()
        assert torch._dynamo.config.recompile_limit == 1000
        assert torch._dynamo.config.accumulated_recompile_limit == 10_000


def test_inside_a_compiled_function_fused_hands_out_the_plain_ops(monkeypatch):
    """A forward under `compiled_static` (draft_compile, verify_compile) asks `fused` for its ops on
    CUDA too: it must get the plain functions, which the enclosing graph fuses with its neighbours.
    The separately compiled op ended the traced graph at every forward (a graph break each)."""
    monkeypatch.setattr(ops, "fusion_enabled", lambda device: True)  # the CUDA path, on any machine
    dev = torch.device("cpu")
    assert ops.fused("rms_norm", dev) is ops._compiled("rms_norm")  # outside a trace: the compiled op

    def block(x, w):
        h, y = ops.fused("add_rms_norm", dev)(x, x, w, 1e-6)
        return ops.fused("silu_mul", dev)(torch.cat([y, h], -1))

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x, w = torch.randn(2, 3, 8), torch.rand(8)
    out = torch.compile(block, backend=backend, fullgraph=True, dynamic=False)(x, w)  # fullgraph: no break
    torch._dynamo.reset()
    h, y = ops.add_rms_norm(x, x, w, 1e-6)
    assert len(graphs) == 1 and torch.equal(out, ops.silu_mul(torch.cat([y, h], -1)))


def test_inductor_launches_its_kernels_with_pdl_where_ours_do(monkeypatch):
    from specpilot.kernels import launch

    cuda = torch.device("cuda")
    monkeypatch.setattr(launch, "pdl", lambda device: False)
    assert ops.inductor_options(cuda) is None
    monkeypatch.setattr(launch, "pdl", lambda device: True)
    assert ops.inductor_options(cuda) == {"triton.enable_pdl": True}  # this torch has the option


@pytest.mark.parametrize("zero_centered", [True, False])
def test_gemma_ops_trace_whole_and_equal_the_plain_math(zero_centered):
    """Gemma's norms (Gemma-3's (1 + w), Gemma-4's w, its weightless v norm), norm + RoPE, the
    post-norm residual add and GELU-tanh x up trace as one graph each (fullgraph, dynamic shapes:
    what `fused` compiles on CUDA) and give the plain functions' values."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 4, 8, generator=g), torch.randn(8, generator=g)
    cos, sin = torch.randn(2, 3, 1, 8, generator=g), torch.randn(2, 3, 1, 8, generator=g)
    h, gate_up = torch.randn(2, 3, 16, generator=g), torch.randn(2, 3, 32, generator=g)
    cases = [("gemma_rms_norm", (x, w, 1e-6, zero_centered)), ("gemma_rms_norm", (x, None, 1e-6, False)),
             ("gemma_norm_rope", (x, w, cos, sin, 1e-6, zero_centered)),
             ("gemma_add_norm", (h, h.flip(-1), torch.randn(16, generator=g), 1e-6, zero_centered)),
             ("gelu_tanh_mul", (gate_up,))]
    for name, args in cases:
        assert torch.equal(ops._compiled(name, "eager")(*args), ops.FUSABLE[name](*args)), name
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_attention_bias_is_the_mask_as_0_or_minus_inf_with_groups_folded(dtype, groups, traced):
    mask = torch.rand(2, 1, 3, 7, generator=torch.Generator().manual_seed(groups)) > 0.5  # [B,1,T,S]
    want = torch.zeros(2, groups, 3, 7, dtype=dtype).masked_fill_(~mask, float("-inf")).reshape(2, 1, groups * 3, 7)
    fn = (lambda m: ops.attention_bias(m, dtype, groups))
    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(mask) if traced else fn(mask)
    assert got.dtype == dtype and torch.equal(got, want)
