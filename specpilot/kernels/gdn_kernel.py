"""The Triton kernels of `gdn.py` (imported on first use: importing Triton needs it installed)."""

import triton
import triton.language as tl

# ROUND codes: the grid a float32 value is rounded to where the reference rounds to the model dtype
ROUND_NONE: tl.constexpr = tl.constexpr(0)  # float32
ROUND_BF16: tl.constexpr = tl.constexpr(1)
ROUND_F16: tl.constexpr = tl.constexpr(2)


@triton.jit
def _round(x, ROUND: tl.constexpr):
    """x (float32) rounded to the nearest value of the ROUND grid, ties to even, kept in float32.
    BF16 by integer arithmetic on the bits (finite values): the interpreter truncates float32 ->
    bfloat16 casts (triton-lang/triton#11584), and a value on the BF16 grid casts exactly either way."""
    if ROUND == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        x = x.to(tl.float16).to(tl.float32)
    return x


@triton.jit
def _masked(mask, cond):
    """mask & cond for a scalar cond (the interpreter's `&` of a scalar and a block gives int32)."""
    return tl.where(cond, mask, False)


@triton.jit
def gdn_conv_kernel(
    x_ptr, win_ptr, pos_ptr, w_ptr, par_ptr, dep_ptr, cm_ptr, y_ptr,
    sx_b, sx_t, sw_b, sw_t, sp_b, sp_t, swc, swk, spar_b, sdep_b, sy_b, sy_t,
    T, Cc,
    K: tl.constexpr, BLOCK_C: tl.constexpr, TREE: tl.constexpr, ROUND: tl.constexpr, COMMIT: tl.constexpr,
    KP2: tl.constexpr,
):
    """One (token, channel block): y = silu(round(sum_j w[:, K-1-j] * input j steps back)), the
    input j steps back being the token's j-th ancestor in the chunk (TREE: by `parents`; else token
    t - j) while j <= its depth, else entry K-1-(j-depth) of the committed window, and zero where
    its position (position of the token - j) is below 0. Summed oldest first in float32.
    COMMIT (a one-token chunk, T == 1: no other program reads this block of the window): then the
    window takes the token's input, entries 1..K-2 moving down one, where commit[b] >= 0; the
    shifted block is loaded whole before it is stored."""
    bt = tl.program_id(0)
    cb = tl.program_id(1)
    b = bt // T
    t = bt % T
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < Cc
    pos = tl.load(pos_ptr + b * sp_b + t * sp_t)
    if TREE:
        depth = tl.load(dep_ptr + b * sdep_b + t)
    else:
        depth = t
    acc = tl.zeros([BLOCK_C], tl.float32)
    for i in tl.static_range(K):
        j = K - 1 - i  # steps back, oldest first (a constexpr: not annotated, Triton 3.6 refuses re-binding one)
        if TREE:
            anc = t
            for _ in tl.static_range(K - 1 - i):  # j steps up (inline: a bound must stay a constexpr)
                anc = tl.load(par_ptr + b * spar_b + anc, mask=anc >= 0, other=-1)
        else:
            anc = t - j
        live = pos - j >= 0
        inside = depth >= j
        xv = tl.load(x_ptr + b * sx_b + anc * sx_t + c, mask=_masked(c_ok, inside & live), other=0.0)
        wv = tl.load(win_ptr + b * sw_b + (K - 1 - (j - depth)) * sw_t + c, mask=_masked(c_ok, (depth < j) & live),
                     other=0.0)
        wt = tl.load(w_ptr + c * swc + i * swk, mask=c_ok, other=0.0).to(tl.float32)
        acc += (xv.to(tl.float32) + wv.to(tl.float32)) * wt  # one of the two is zero
    z = _round(acc, ROUND)  # the reference rounds the conv to the model dtype before the SiLU
    y = _round(z / (1.0 + tl.exp(-z)), ROUND)
    tl.store(y_ptr + b * sy_b + t * sy_t + c, y.to(y_ptr.dtype.element_ty), mask=c_ok)
    if COMMIT:
        keep = tl.load(cm_ptr + b) >= 0
        r = tl.arange(0, KP2)[:, None]  # new entry r <- old entry r + 1, the last <- the token's input
        cc = c[None, :]
        ok = _masked((r < K - 1) & c_ok[None, :], keep)
        old = tl.load(win_ptr + b * sw_b + (r + 1) * sw_t + cc, mask=ok & (r < K - 2), other=0.0)
        xin = tl.load(x_ptr + b * sx_b + cc + r * 0, mask=ok & (r == K - 2), other=0.0)
        tl.store(win_ptr + b * sw_b + r * sw_t + cc, tl.where(r == K - 2, xin, old), mask=ok)


@triton.jit
def _softplus(x):
    """log(1 + e^x) as torch's softplus (x itself above 20), with an exact-ish log1p (Goldberg's)."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    d = u - 1.0
    log1p = tl.where(d == 0.0, e, tl.log(u) * (e / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _token(y_ptr, a_ptr, b_ptr, par_ptr, state_ptr, node_ptr,
           b, h, hk, t, T, tree, fresh, kk, k_ok, vv, v_ok, s_off, sn_n,
           sy_b, sy_t, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, spar_b,
           A, dt_bias, Hk, Dk, Dv, scale, BETA_ROUND: tl.constexpr):
    """Everything token t needs that does not depend on the running state, loaded ahead of its
    step: its parent p (t - 1 in a chunk), the parent's state where it is not the running one (the
    committed state, zero if fresh, for p = -1; else node p's, stored by this program before),
    q, k [BK] normalised (q scaled), v [BV], the decay exp(g) and beta. Past the last token
    (t = T) nothing is read."""
    ok = t < T
    p = tl.load(par_ptr + b * spar_b + t, mask=ok & (tree != 0), other=t - 1)  # a chunk: t - 1
    m = _masked(k_ok[:, None] & v_ok[None, :], ok & (p != t - 1) & ((p >= 0) | (fresh == 0)))
    pq = tl.where(p < 0, state_ptr + s_off, node_ptr + p * sn_n + s_off)
    S_in = tl.load(pq, mask=m, other=0.0)
    row = y_ptr + b * sy_b + t * sy_t
    q = tl.load(row + hk * Dk + kk, mask=_masked(k_ok, ok), other=0.0).to(tl.float32)
    k = tl.load(row + (Hk + hk) * Dk + kk, mask=_masked(k_ok, ok), other=0.0).to(tl.float32)
    v = tl.load(row + 2 * Hk * Dk + h * Dv + vv, mask=_masked(v_ok, ok), other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    a = tl.load(a_ptr + b * sa_b + t * sa_t + h * sa_h, mask=ok, other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + b * sb_b + t * sb_t + h * sb_h, mask=ok, other=0.0).to(tl.float32)
    beta = _round(1.0 / (1.0 + tl.exp(-bb)), BETA_ROUND)  # sigmoid in b's dtype
    decay = tl.exp(A * _softplus(a + dt_bias))
    return p, S_in, q, k, v, decay, beta


@triton.jit(do_not_specialize=["T", "tree"])
def gdn_recurrence_kernel(
    y_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, state_ptr, fresh_ptr, commit_ptr, par_ptr, node_ptr, o_ptr,
    sy_b, sy_t, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, ss_b, ss_h, ss_k, spar_b, sn_b, sn_n, sn_h,
    so_b, so_t, so_h,
    T, tree, Hv, G, Hk, Dk, Dv, scale,
    BK: tl.constexpr, BV: tl.constexpr, ROUND: tl.constexpr, BETA_ROUND: tl.constexpr,
):
    """One (value block, batch row x value head): the gated delta rule over the T tokens, the
    state block S [BK, BV] in float32 registers. Each token starts from its parent's state: the
    running one when the parent is the previous token (always in a chunk), else the committed
    state (zero if fresh) or the parent node's stored state. A chunk (tree == 0) writes the state
    after token commit[b] over the committed one; a tree writes every node's into node_state.
    The same instructions compute every token in both modes, so a node's state and output are bit
    for bit those of the chunk of its root path."""
    vb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hv
    h = bh % Hv
    hk = h // G
    kk = tl.arange(0, BK)
    k_ok = kk < Dk
    vv = vb * BV + tl.arange(0, BV)
    v_ok = vv < Dv
    mask = k_ok[:, None] & v_ok[None, :]
    s_off = kk[:, None] * ss_k + vv[None, :]  # both states' inner [Dk, Dv] contiguous (the wrapper checks)
    state_ptr += b * ss_b + h * ss_h
    node_ptr += b * sn_b + h * sn_h
    fresh = tl.load(fresh_ptr + b).to(tl.int32)
    commit = tl.load(commit_ptr + b, mask=tree == 0, other=-1)
    A = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    dt_bias = tl.load(dtb_ptr + h).to(tl.float32)
    S = tl.load(state_ptr + s_off, mask=_masked(mask, fresh == 0), other=0.0)
    p, S_in, q, k, v, decay, beta = _token(
        y_ptr, a_ptr, b_ptr, par_ptr, state_ptr, node_ptr, b, h, hk, 0, T, tree, fresh, kk, k_ok, vv, v_ok,
        s_off, sn_n, sy_b, sy_t, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, spar_b, A, dt_bias, Hk, Dk, Dv, scale, BETA_ROUND)
    for t in range(T):
        S = tl.where(p == t - 1, S, S_in)
        q_t, k_t, v_t, decay_t, beta_t = q, k, v, decay, beta
        # the next token's inputs are loaded before this step's math: their latency overlaps it
        # (its parent's state, if stored, was stored before this iteration and the barrier below)
        p, S_in, q, k, v, decay, beta = _token(
            y_ptr, a_ptr, b_ptr, par_ptr, state_ptr, node_ptr, b, h, hk, t + 1, T, tree, fresh, kk, k_ok, vv,
            v_ok, s_off, sn_n, sy_b, sy_t, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, spar_b, A, dt_bias, Hk, Dk, Dv,
            scale, BETA_ROUND)
        S = S * decay_t
        kv = tl.sum(S * k_t[:, None], axis=0)  # [BV]
        delta = (v_t - kv) * beta_t
        S = S + k_t[:, None] * delta[None, :]
        o = tl.sum(S * q_t[:, None], axis=0)
        tl.store(o_ptr + b * so_b + t * so_t + h * so_h + vv, _round(o, ROUND).to(o_ptr.dtype.element_ty), mask=v_ok)
        if tree != 0:
            tl.store(node_ptr + t * sn_n + s_off, S, mask=mask)
            tl.debug_barrier()  # node t's state is read back (by other threads) when a later node continues it
        elif t == commit:
            tl.store(state_ptr + s_off, S, mask=mask)
