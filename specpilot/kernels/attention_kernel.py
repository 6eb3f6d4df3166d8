"""The Triton kernels of `attention.py` (imported on first use: importing Triton needs it installed)."""

import triton
import triton.language as tl

from specpilot.kernels.tiles import release_dependents, wait_for_inputs


@triton.jit
def _dot(a, b, DOT_BF16: tl.constexpr):
    """a @ b in float32: BF16 operands on the tensor cores, or IEEE float32 (float32 models, the interpreter)."""
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def split_attention_kernel(
    q_ptr, k_ptr, v_ptr, bias_ptr, o_part_ptr, lse_part_ptr, o_ptr, count_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sb_b, sb_m, sb_s, so_b, so_t, so_h,
    T, G, Hkv, M, S, chunk, n_split, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_BF16: tl.constexpr, DIRECT: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One (key split, query tile, batch row x KV head): softmax(q k^T * scale + bias) v over the
    split's keys, normalised within the split, and its log-sum-exp (-inf where the split admits no
    key for a query). Query row m of KV head j is query t = m % T of head j * G + m // T. Key tiles
    the bias masks for every query of the tile are skipped: their K/V are never loaded.

    MERGE: the last split of a (query tile, batch row x KV head) to arrive at its counter (in
    `count_ptr`, zero between launches) merges all splits in split order, as `merge_splits_kernel`
    would (the same sums in the same order: the same output), and resets the counter; no second
    launch."""
    split = tl.program_id(0)
    tile = tl.program_id(1)
    bj = tl.program_id(2)
    b = bj // Hkv
    j = bj % Hkv
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    m_ok = m < M
    t = m % T
    h = j * G + m // T
    d = tl.arange(0, D)
    wait_for_inputs(PDL)  # q, the cache and the bias are all written by the kernels before this one
    q = tl.load(q_ptr + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + d[None, :], mask=m_ok[:, None], other=0.0)
    run_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    start = split * chunk
    end = tl.minimum(start + chunk, S)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        n_ok = n < end
        bias = tl.load(bias_ptr + b * sb_b + m[:, None] * sb_m + n[None, :] * sb_s,
                       mask=m_ok[:, None] & n_ok[None, :], other=float("-inf")).to(tl.float32)
        # a key tile no query of the tile may see (the unfilled end of the cache) is not read at all
        if tl.max(tl.max(bias, axis=1), axis=0) > float("-inf"):
            k = tl.load(k_ptr + b * sk_b + j * sk_h + n[None, :] * sk_s + d[:, None], mask=n_ok[None, :], other=0.0)
            s = _dot(q, k, DOT_BF16) * scale + bias  # [BLOCK_M, BLOCK_N] fp32
            new_max = tl.maximum(run_max, tl.max(s, axis=1))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # no admitted key yet: exp(-inf) = 0
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(run_max - shift)
            run_sum = run_sum * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + b * sv_b + j * sv_h + n[:, None] * sv_s + d[None, :], mask=n_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + _dot(p, v, DOT_BF16)
            run_max = new_max
    release_dependents(PDL)
    some = run_sum > 0
    out = acc / tl.where(some, run_sum, 1.0)[:, None]
    lse = tl.where(some, run_max + tl.log(tl.where(some, run_sum, 1.0)), float("-inf"))
    if DIRECT:
        tl.store(o_ptr + b * so_b + t[:, None] * so_t + h[:, None] * so_h + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])
    else:
        row = (bj * n_split + split) * M + m  # o_part [B*Hkv, n_split, M, D], lse_part [B*Hkv, n_split, M]
        tl.store(o_part_ptr + row[:, None] * D + d[None, :], out, mask=m_ok[:, None])
        tl.store(lse_part_ptr + row, lse, mask=m_ok)
        if MERGE:
            # every thread's partial stores before the arrival (acq_rel, gpu scope); the last
            # split reads the others' from L2 (.cg), and resets the counter for the next launch
            tl.debug_barrier()
            counter = count_ptr + bj * tl.num_programs(1) + tile
            if tl.atomic_add(counter, 1) == n_split - 1:
                _merge(o_part_ptr, lse_part_ptr, o_ptr, so_b, so_t, so_h, bj, b, j, m, m_ok, T, G, M, n_split,
                       D, ".cg")
                tl.atomic_xchg(counter, 0, sem="relaxed")


@triton.jit
def _merge(o_part_ptr, lse_part_ptr, o_ptr, so_b, so_t, so_h, bj, b, j, m, m_ok, T, G, M, n_split,
           D: tl.constexpr, CACHE: tl.constexpr):
    """Write the splits of one (query tile, batch row x KV head) weighted by exp(lse - max lse):
    the softmax over all keys, in split order. A split that admits no key for a query (weight 0)
    is not read; a query no split admits gets zeros."""
    d = tl.arange(0, D)
    top = tl.full(m.shape, float("-inf"), tl.float32)
    for sp in range(0, n_split):
        lse = tl.load(lse_part_ptr + (bj * n_split + sp) * M + m, mask=m_ok, other=float("-inf"), cache_modifier=CACHE)
        top = tl.maximum(top, lse)
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros(m.shape, tl.float32)
    acc = tl.zeros([m.shape[0], D], tl.float32)
    for sp in range(0, n_split):
        row = (bj * n_split + sp) * M + m
        w = tl.exp(tl.load(lse_part_ptr + row, mask=m_ok, other=float("-inf"), cache_modifier=CACHE) - shift)
        part = tl.load(o_part_ptr + row[:, None] * D + d[None, :], mask=(m_ok & (w > 0))[:, None], other=0.0,
                       cache_modifier=CACHE)
        acc += w[:, None] * part
        total += w
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    t = m % T
    h = j * G + m // T
    tl.store(o_ptr + b * so_b + t[:, None] * so_t + h[:, None] * so_h + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def merge_splits_kernel(
    o_part_ptr, lse_part_ptr, o_ptr, so_b, so_t, so_h,
    T, G, Hkv, M, n_split,
    D: tl.constexpr, BLOCK_M: tl.constexpr, PDL: tl.constexpr = False,
):
    """`_merge` of one (query tile, batch row x KV head), as a second launch (where the counters of
    the split kernel's own merge do not fit)."""
    tile = tl.program_id(0)
    bj = tl.program_id(1)
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    wait_for_inputs(PDL)
    release_dependents(PDL)
    _merge(o_part_ptr, lse_part_ptr, o_ptr, so_b, so_t, so_h, bj, bj // Hkv, bj % Hkv, m, m < M, T, G, M, n_split,
           D, "")
