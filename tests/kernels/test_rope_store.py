"""The rope_store kernel (`kernels/rope_store.py`): q returned and k, v written into the cache, against
its reference (the compiled op's rounding, restated in torch) and against the model's eager path
(`ops.qkv_norm_rope` on the cast tables, then the two indexed cache writes); GQA and MHA, q/k norm
on and off, several (B, T), head sizes 32 to 128, a cache that is a span of a longer one.

Bounds:
- against the reference: float32 |d| <= 1e-6 max |ref| (rsqrt and the norm's summation order);
  BF16 within one BF16 ulp of the head's largest |ref| (those can move the one rounding after the
  norm to the other neighbour; measured under the interpreter: 0, bit for bit);
- against the eager path: float32 as above (the eager op rounds nowhere: the same math); BF16
  |d| <= 2^-6 max |ref|: the eager ops round the weight product, both RoPE products and their sum
  (each <= 2^-9 of the largest value), the kernel once at the store;
- v is copied bit for bit, and every cache entry the eager path does not write is left as it was.
"""

import pytest
import torch

from specpilot.kernels import rope_store as R
from specpilot.models import ops

CASES = [  # (B, T, H, Hkv, D)
    (1, 1, 4, 2, 32),
    (2, 3, 4, 2, 64),
    (3, 5, 2, 2, 32),
    (2, 4, 8, 1, 128),
]


@pytest.fixture(autouse=True)
def interpreted(interpreter, device):
    if device == "cpu":
        interpreter("specpilot.kernels.rope_store_kernel", "rope_store_kernel")


def tables(D: int, positions: int = 64):
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    emb = torch.outer(torch.arange(positions).float(), inv).repeat(1, 2)
    return emb.cos(), emb.sin()


def inputs(B, T, H, Hkv, D, dtype, qk_norm, device, S=24, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * T + H)
    qkv = (torch.randn(B, T, (H + 2 * Hkv) * D, generator=g) * 2).to(dtype)
    weights = [(1 + 0.1 * torch.randn(D, generator=g)).to(dtype) if qk_norm else None for _ in "qk"]
    cos, sin = tables(D)
    positions = torch.randint(0, 64, (B, T), generator=g)
    slots = torch.stack([torch.randperm(S, generator=g)[:T] for _ in range(B)])
    # the layer's cache is the first S slots of a longer one (a span's strides), stale entries random
    k_cache = torch.randn(B, Hkv, S + 8, D, generator=g).to(dtype)[:, :, :S]
    v_cache = torch.randn(B, Hkv, S + 8, D, generator=g).to(dtype)[:, :, :S]
    tensors = (qkv, *weights, cos, sin, positions, k_cache, v_cache, slots)
    return [t.to(device) if t is not None else None for t in tensors]


def eager_path(qkv, qw, kw, cos, sin, positions, k_cache, v_cache, slots, H, Hkv, D, eps):
    """What `Transformer.forward` runs without the kernel (`Transformer._rope`, `Attention.attend`)."""
    B, T, _ = qkv.shape
    c, s = cos[positions].to(qkv.dtype).unsqueeze(2), sin[positions].to(qkv.dtype).unsqueeze(2)
    q, k, v = ops.qkv_norm_rope(qkv, qw, kw, c, s, H, Hkv, D, eps)
    rows = torch.arange(B)[:, None].expand(B, T)
    k_cache[rows, :, slots] = k
    v_cache[rows, :, slots] = v
    return q


def ulp_of_head_max(ref: torch.Tensor) -> torch.Tensor:
    """One BF16 ulp of each head's largest |value|, broadcast over the head [.., D]."""
    top = ref.float().abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(top)) - 7)


def check(out, ref, dtype, bound):
    out, ref = out.cpu(), ref.cpu()
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    err = (out.float() - ref.float()).abs()
    if bound == "ulp":
        assert (err <= ulp_of_head_max(ref)).all(), f"{err.max()}"
    else:
        assert err.max() <= bound * ref.float().abs().max(), f"{err.max()} vs max {ref.float().abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "llama"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}T{}H{}Hkv{}D{}".format(*c))
def test_the_kernel_matches_the_reference_and_the_eager_path(case, qk_norm, dtype, device):
    B, T, H, Hkv, D = case
    args = inputs(B, T, H, Hkv, D, dtype, qk_norm, device)
    qkv, cos, k_cache, v_cache = args[0], args[3], args[6], args[7]
    assert R.applies(qkv, D, cos.shape[-1]) and not k_cache.is_contiguous()
    cpu = [t.cpu() if t is not None else None for t in args]
    ref_k, ref_v, eager_k, eager_v = cpu[6].clone(), cpu[7].clone(), cpu[6].clone(), cpu[7].clone()
    before_k = cpu[6].clone()
    q = R.qk_norm_rope_store(*args, H, Hkv, D, 1e-6)
    q_ref = R.reference_qk_norm_rope_store(*cpu[:6], ref_k, ref_v, cpu[8], H, Hkv, D, 1e-6)
    q_eager = eager_path(*cpu[:6], eager_k, eager_v, cpu[8], H, Hkv, D, 1e-6)
    assert q.shape == (B, T, H, D)
    reference_bound = 1e-6 if dtype == torch.float32 else "ulp"
    eager_bound = 1e-6 if dtype == torch.float32 else 2.0**-6
    check(q, q_ref, dtype, reference_bound)
    check(k_cache, ref_k, dtype, reference_bound)
    check(q, q_eager, dtype, eager_bound)
    check(k_cache, eager_k, dtype, eager_bound)
    assert torch.equal(v_cache.cpu(), eager_v) and torch.equal(ref_v, eager_v)  # v: copied as it is
    written = torch.zeros(B, k_cache.shape[2], dtype=torch.bool)
    written[torch.arange(B)[:, None].expand(B, T), cpu[8]] = True
    stale = ~written[:, None, :].expand(B, Hkv, -1)
    assert torch.equal(k_cache.cpu()[stale], before_k[stale])  # slots not written: untouched


def test_row_blocks_split_the_rows(device, monkeypatch):
    """Several programs along the rows (a small row block) give the reference's result."""
    monkeypatch.setattr(R, "INTERPRETER_BLOCK_M", 2)
    monkeypatch.setattr(R, "MAX_BLOCK_M", 2)
    B, T, H, Hkv, D = 3, 5, 4, 2, 32
    args = inputs(B, T, H, Hkv, D, torch.float32, True, device, seed=3)
    cpu = [t.cpu().clone() for t in args]
    q = R.qk_norm_rope_store(*args, H, Hkv, D, 1e-6)
    q_ref = R.reference_qk_norm_rope_store(*cpu, H, Hkv, D, 1e-6)
    check(q, q_ref, torch.float32, 1e-6)
    check(args[6], cpu[6], torch.float32, 1e-6)


def test_the_reference_is_the_eager_path_on_float32_and_unsupported_shapes_take_it(device):
    """On float32 models the compiled op's rounding is no rounding: the reference equals the eager
    ops bit for bit. A head size the kernel does not take (16) runs the reference."""
    B, T, H, Hkv, D = 2, 3, 4, 2, 16
    args = [t.cpu() if t is not None else None for t in inputs(B, T, H, Hkv, D, torch.float32, True, "cpu")]
    eager_k, eager_v = args[6].clone(), args[7].clone()
    q_eager = eager_path(*args[:6], eager_k, eager_v, args[8], H, Hkv, D, 1e-6)
    moved = [t.to(device).clone() for t in args]
    assert not R.applies(moved[0], D, D)
    q = R.qk_norm_rope_store(*moved, H, Hkv, D, 1e-6)
    assert torch.equal(q.cpu(), q_eager)
    assert torch.equal(moved[6].cpu(), eager_k) and torch.equal(moved[7].cpu(), eager_v)


def test_bad_shapes_are_one_value_error(device):
    B, T, H, Hkv, D = 1, 2, 4, 2, 32
    args = inputs(B, T, H, Hkv, D, torch.float32, True, device)
    with pytest.raises(ValueError, match="rope_store"):
        R.qk_norm_rope_store_eager(*args, H, Hkv + 1, D, 1e-6)
