"""The Triton kernel of `rope_store.py` (imported on first use: importing Triton needs it installed)."""

import triton
import triton.language as tl

from specpilot.kernels import tiles
from specpilot.kernels.gdn_kernel import _round


@triton.jit
def rope_store_kernel(
    # pointers
    qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr,
    # sizes
    M, T, H, Hkv, eps,
    # strides (every innermost one is 1)
    sx_m, sr_p, sq_m, sq_h, skc_b, skc_h, skc_s, svc_b, svc_h, svc_s,
    # meta
    BLOCK_M: tl.constexpr, HALF: tl.constexpr, QK_NORM: tl.constexpr, ROUND: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One head (query heads 0..H-1, then the Hkv key heads, then the value heads) of BLOCK_M rows of
    the fused projection qkv [M, (H+2Hkv)D]: the head's D = 2 HALF columns loaded as two halves (the
    halves RoPE rotates into each other), in float32; for q and k the per-head RMSNorm (QK_NORM) and
    RoPE at each row's position, rounded as inductor's compiled `ops.qkv_norm_rope` rounds
    (`tiles.qk_norm_rope`); then one rounding at the store: queries to q [M, H, D], keys and values
    straight into the cache at (row m // T, the head, slot[m])."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1)
    m_ok = m < M
    d = tl.arange(0, HALF)
    ok = m_ok[:, None] & (d < HALF)[None, :]
    at = qkv_ptr + m[:, None] * sx_m + head * (2 * HALF) + d[None, :]
    tiles.wait_for_inputs(PDL)
    lo = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    hi = tl.load(at + HALF, mask=ok, other=0.0).to(tl.float32)
    tiles.release_dependents(PDL)
    if head < H + Hkv:  # q or k: norm and RoPE
        pos = tl.load(pos_ptr + m, mask=m_ok, other=0)
        lo, hi = tiles.qk_norm_rope(lo, hi, head < H, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, m_ok, sr_p, eps,
                                    HALF, QK_NORM, ROUND, False)
    # the one rounding, explicit: the interpreter's float32 -> BF16 cast truncates (`_round`)
    tiles.store_head(_round(lo, ROUND), _round(hi, ROUND), head, m, m_ok, T, H, Hkv, slot_ptr, q_ptr, sq_m, sq_h,
                     kc_ptr, skc_b, skc_h, skc_s, vc_ptr, svc_b, svc_h, svc_s, HALF)
