"""The fused draft-layer kernels (`kernels/draft_layer.py`) against their pure-torch references (the
model's eager ops): norm+qkv+q/k norm+RoPE with the cache write, and the projections with a norm
prologue and a residual / SwiGLU epilogue; GQA, q/k norm on and off, M in {1, 4, 8, 16}, odd C.

Bounds (the kernels round wherever the reference rounds; only float32 summation order differs):
- float32: |out - ref| <= 1e-5 max |ref| (measured under the interpreter: <= 5e-7 relative).
- BF16: |out - ref| <= 2^-7 max |ref|: a float32 sum in another order may round a projection to
  the other BF16 neighbour (2^-8 relative), carried through a norm, RoPE or SiLU once (measured
  under the interpreter: 0, the same roundings as torch's at these shapes).
The cache: exactly the (row, slot) entries the reference writes, and nothing else.
"""

import pytest
import torch

from specpilot.kernels import draft_layer as K

REL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7}
ROWS = [(1, 1), (4, 2), (8, 8), (16, 4)]  # (M, T): B = M / T rows of the cache


def close(out: torch.Tensor, ref: torch.Tensor, dtype) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    err = (out.cpu().float() - ref.cpu().float()).abs().max()
    assert err <= REL[dtype] * ref.float().abs().max(), f"{err} vs max {ref.float().abs().max()}"


def rope(D: int, positions: int = 64):
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    emb = torch.outer(torch.arange(positions).float(), inv).repeat(1, 2)
    return emb.cos(), emb.sin()


def randn(*shape, scale=1.0, g, dtype, device):
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=["gqa", "mha"])
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: f"M{r[0]}T{r[1]}")
def test_norm_qkv_rope_matches_the_reference_and_writes_the_reference_slots(rows, heads, qk_norm, dtype, device):
    (M, T), (H, Hkv) = rows, heads
    B, C, D, S = M // T, 72, 32, 40
    g = torch.Generator().manual_seed(M + H)
    h = randn(M, C, g=g, dtype=dtype, device=device)
    norm_w = randn(C, scale=0.1, g=g, dtype=torch.float32, device=device).add(1).to(dtype)
    qkv_w = randn((H + 2 * Hkv) * D, C, scale=C**-0.5, g=g, dtype=dtype, device=device)
    qn, kn = ((randn(D, scale=0.1, g=g, dtype=torch.float32, device=device).add(1).to(dtype) for _ in "qk")
              if qk_norm else (None, None))
    cos, sin = (t.to(device) for t in rope(D))
    positions = torch.randint(0, 64, (M,), generator=g).to(device)
    slots = torch.stack([torch.randperm(S, generator=g)[:T] for _ in range(B)]).reshape(M).to(device)
    k_cache = randn(B, Hkv, S, D, g=g, dtype=dtype, device=device)  # stale entries must survive
    v_cache = randn(B, Hkv, S, D, g=g, dtype=dtype, device=device)
    k_ref, v_ref = k_cache.clone().cpu(), v_cache.clone().cpu()
    args = (h, norm_w, qkv_w, qn, kn, cos, sin, positions, slots)
    q = K.norm_qkv_rope(*args, k_cache, v_cache, T, H, Hkv, 1e-6)
    q_ref = K.reference_norm_qkv_rope(*(a.cpu() if a is not None else None for a in args), k_ref, v_ref, T, H, Hkv,
                                      1e-6)
    close(q, q_ref, dtype)
    close(k_cache, k_ref, dtype)
    close(v_cache, v_ref, dtype)
    written = torch.zeros(B, S, dtype=torch.bool)
    written[torch.arange(M) // T, slots.cpu()] = True
    for cache, ref in ((k_cache, k_ref), (v_cache, v_ref)):
        assert torch.equal(cache.cpu()[~written[:, None].expand(B, Hkv, S)], ref[~written[:, None].expand(B, Hkv, S)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epilogue", [K.RESIDUAL, K.SWIGLU, K.PLAIN], ids=["residual", "swiglu", "norm_plain"])
@pytest.mark.parametrize("M", [1, 4, 8, 16])
def test_rows_linear_matches_the_reference(M, epilogue, dtype, device):
    """gemv_residual (no norm), norm_gate_up_silu and norm_gemv, over sizes no block divides."""
    g = torch.Generator().manual_seed(M + epilogue)
    K_, N = (80, 72) if epilogue == K.RESIDUAL else (72, 40 if epilogue == K.SWIGLU else 200)
    x = randn(M, K_, g=g, dtype=dtype, device=device)
    w = randn(N * (2 if epilogue == K.SWIGLU else 1), K_, scale=K_**-0.5, g=g, dtype=dtype, device=device)
    residual = randn(M, N, g=g, dtype=dtype, device=device) if epilogue == K.RESIDUAL else None
    norm_w = None if epilogue == K.RESIDUAL else randn(K_, scale=0.1, g=g, dtype=torch.float32, device=device).add(1).to(dtype)
    args = (x, w, residual, norm_w, 1e-6, epilogue)
    y = K.rows_linear(*args)
    close(y, K.reference_rows_linear(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)), dtype)


def test_the_named_wrappers_run_their_epilogues(device):
    g = torch.Generator().manual_seed(9)
    h, x = randn(3, 48, g=g, dtype=torch.float32, device=device), randn(3, 64, g=g, dtype=torch.float32, device=device)
    w, wgu = randn(48, 64, g=g, dtype=torch.float32, device=device), randn(32, 48, g=g, dtype=torch.float32, device=device)
    nw = torch.ones(48, device=device)
    close(K.gemv_residual(h, x, w), h.cpu() + x.cpu() @ w.cpu().T, torch.float32)
    close(K.norm_gate_up_silu(h, nw, wgu, 1e-6), K.reference_rows_linear(h.cpu(), wgu.cpu(), None, nw.cpu(), 1e-6, K.SWIGLU),
          torch.float32)
    close(K.norm_gemv(h, nw, wgu, 1e-6), K.reference_rows_linear(h.cpu(), wgu.cpu(), None, nw.cpu(), 1e-6, K.PLAIN),
          torch.float32)


def test_more_rows_than_a_block_take_the_reference(device):
    """17 rows: not the kernels (their one row block is 16), the reference's result."""
    g = torch.Generator().manual_seed(2)
    x, w = randn(17, 32, g=g, dtype=torch.float32, device=device), randn(16, 32, g=g, dtype=torch.float32, device=device)
    assert not K.applies(x, 17) and K.applies(x, 16)
    assert torch.equal(K.rows_linear(x, w).cpu(), K.reference_rows_linear(x.cpu(), w.cpu(), None, None, 0.0, K.PLAIN))
    with pytest.raises(ValueError, match="rows_linear"):
        K.rows_linear_eager(x, w, None, None, 0.0, K.PLAIN)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_references_are_the_models_eager_ops_bit_for_bit(dtype):
    """kernels sit below models, so the references restate `models.ops`' RMSNorm, SwiGLU and
    q/k norm + RoPE: they must stay the same functions."""
    from specpilot.models import ops

    g = torch.Generator().manual_seed(0)
    M, T, C, H, Hkv, D, S = 8, 4, 96, 4, 2, 32, 16
    h = torch.randn(M, C, generator=g).to(dtype)
    nw = (1 + 0.1 * torch.randn(C, generator=g)).to(dtype)
    w = (torch.randn(2 * C, C, generator=g) / C**0.5).to(dtype)
    assert torch.equal(K.reference_rows_linear(h, w, None, nw, 1e-6, K.SWIGLU),
                       ops.silu_mul(torch.nn.functional.linear(ops.rms_norm(h, nw, 1e-6), w)))
    qkv_w = (torch.randn((H + 2 * Hkv) * D, C, generator=g) / C**0.5).to(dtype)
    qn, kn = ((1 + 0.1 * torch.randn(D, generator=g)).to(dtype) for _ in range(2))
    cos, sin = rope(D)
    pos, slots = torch.randint(0, 64, (M,), generator=g), torch.arange(M) % S
    kc, vc = (torch.zeros(M // T, Hkv, S, D, dtype=dtype) for _ in range(2))
    q = K.reference_norm_qkv_rope(h, nw, qkv_w, qn, kn, cos, sin, pos, slots, kc, vc, T, H, Hkv, 1e-6)
    x = ops.rms_norm(h, nw, 1e-6).view(M // T, T, C)
    c, s = (t[pos].to(dtype).view(M // T, T, 1, D) for t in (cos, sin))
    q_ops, k_ops, _ = ops.qkv_norm_rope(torch.nn.functional.linear(x, qkv_w), qn, kn, c, s, H, Hkv, D, 1e-6)
    assert torch.equal(q, q_ops.reshape(M, H, D))
    rows = torch.arange(M // T)[:, None].expand(M // T, T)
    assert torch.equal(kc[rows, :, slots.view(M // T, T)], k_ops)
