"""Prototype (not the product): W12 layout v2 and a swap-AB tensor-core kernel, to be timed on the
GPU before the product's kernels are rewritten around them.

Layout v2 per row: low plane byte c = (o & 1) << 7 | mantissa7; nibble plane: nibble = sign << 3 | o >> 1,
nibble byte 4g + i holds column 8g + i (low nibble) and 8g + 4 + i (high nibble). Kernels decode the
*scaled* weight w' = w * 2^(112 - e0), whose exponent field 112 + o needs no carry: its high byte is
sign << 7 | 0x38 | o >> 1, its low byte is the stored byte. y is scaled back per row by 2^(e0 - 112).
"""
import torch
import triton
import triton.language as tl

from specpilot.kernels import tiles

from specpilot.w12.codec import choose_windows, exponent_histogram
from specpilot.w12.layout import WINDOW, bf16_to_bits, bits_to_bf16, padded_columns

SCALE_BIAS = 112


def STORED_TO_TRUE(Kp, device):
    """[Kp] true column of each stored position: within each 32-column block, stored byte 8c + i
    (group c, output i) holds column 2c + (i % 2) + 8 (i // 2) -- the MMA A fragment of thread c."""
    p = torch.arange(Kp, device=device)
    b, q = p // 32, p % 32
    c, i = q // 8, q % 8
    return 32 * b + 2 * c + (i % 2) + 8 * (i // 2)


def encode_v2(weight: torch.Tensor):
    N, K = weight.shape
    Kp = padded_columns(K)
    bits = bf16_to_bits(weight)
    base = choose_windows(exponent_histogram(bits))
    o = ((bits >> 7) & 0xFF) - base[:, None]
    dense = (o >= 0) & (o < WINDOW)
    o = torch.where(dense, o, 0)
    sign = torch.where(dense, (bits >> 15) & 1, 0)
    mant = torch.where(dense, bits & 0x7F, 0)
    low = ((o & 1) << 7) | mant
    nibv = (sign << 3) | (o >> 1)
    low = torch.nn.functional.pad(low, (0, Kp - K))[:, STORED_TO_TRUE(Kp, low.device)].to(torch.uint8)
    nibv = torch.nn.functional.pad(nibv, (0, Kp - K))[:, STORED_TO_TRUE(Kp, low.device)].view(N, Kp // 8, 2, 4)
    nib = (nibv[:, :, 0, :] | (nibv[:, :, 1, :] << 4)).reshape(N, Kp // 2).to(torch.uint8)
    return {"low": low.contiguous(), "nib": nib.contiguous(), "base": base.to(torch.uint8), "shape": (N, K)}


def decode_dense_v2(p) -> torch.Tensor:
    """True BF16 of the dense codes (escape slots decode to the placeholder), [N, K]."""
    N, K = p["shape"]
    Kp = p["low"].shape[1]
    low = p["low"].to(torch.int32)
    nb = p["nib"].to(torch.int32).view(N, Kp // 8, 1, 4)
    nibv = torch.cat([nb & 0xF, nb >> 4], dim=2).reshape(N, Kp)
    o = ((nibv & 7) << 1) | (low >> 7)
    e = p["base"].to(torch.int32)[:, None] + o
    bits = ((nibv >> 3) << 15) | (e << 7) | (low & 0x7F)
    true = torch.empty_like(bits)
    true[:, STORED_TO_TRUE(Kp, bits.device)] = bits
    return bits_to_bf16(true[:, :K].contiguous())


ASM8 = tl.constexpr("""{
.reg .b32 la, lb, t, u, ea, eb;
mov.b64 {la, lb}, $8;
shl.b32 t, $9, 4;
lop3.b32 u, t, $9, 0x80808080, 0xE4;
lop3.b32 ea, u, 0x87878787, 0x38383838, 0xEA;
shr.u32 t, $9, 4;
lop3.b32 u, $9, t, 0x80808080, 0xE4;
lop3.b32 eb, u, 0x87878787, 0x38383838, 0xEA;
prmt.b32 t, la, ea, 0x5140; mov.b32 {$0, $1}, t;
prmt.b32 t, la, ea, 0x7362; mov.b32 {$2, $3}, t;
prmt.b32 t, lb, eb, 0x5140; mov.b32 {$4, $5}, t;
prmt.b32 t, lb, eb, 0x7362; mov.b32 {$6, $7}, t;
}""")


@triton.jit
def decode_mma(low, nib, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BN, G] int64 low words + int32 nibble words -> [BN, BK] bf16 in true column order."""
    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(ASM8, "=h,=h,=h,=h,=h,=h,=h,=h,l,r", [low, nib],
        dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    q = tl.join(tl.join(tl.join(o0, o1), tl.join(o2, o3)), tl.join(tl.join(o4, o5), tl.join(o6, o7)))
    q = tl.permute(q, (0, 1, 4, 3, 2))  # [BN, G, q_hi, q_lo, r]
    q = tl.reshape(q, [BLOCK_N, BLOCK_K // 32, 4, 2, 2, 2])  # [BN, B, c, q_hi, q_lo, r]
    q = tl.permute(q, (0, 1, 3, 4, 2, 5))  # [BN, B, q_hi, q_lo, c, r]
    return tl.reshape(q, [BLOCK_N, BLOCK_K])


@triton.jit
def load_decode(w_ptr, nib_ptr, rows, step, stride_w, stride_nib,
                IS_W12: tl.constexpr, F32: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    G: tl.constexpr = BLOCK_K // 8
    if IS_W12:
        lo64 = w_ptr.to(tl.pointer_type(tl.int64))
        nib32 = nib_ptr.to(tl.pointer_type(tl.int32))
        g = step * G + tl.arange(0, G)
        low = tl.load(lo64 + rows[:, None] * (stride_w // 8) + g[None, :])
        nib = tl.load(nib32 + rows[:, None] * (stride_nib // 4) + g[None, :])
        w = decode_mma(low, nib, BLOCK_N, BLOCK_K)
    else:
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows[:, None] * stride_w + k[None, :])
    return w


@triton.jit
def row_scale(base_ptr, rows):
    return ((tl.load(base_ptr + rows).to(tl.int32) + (127 - 112)) << 23).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["M", "split_k", "steps_per_split"])
def tc_kernel(x_ptr, w_ptr, nib_ptr, base_ptr, y_ptr, ws_ptr, count_ptr, M, N, Kp, split_k, steps_per_split,
              stride_xm, stride_ym, stride_w, stride_nib,
              IS_W12: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              STAGES: tl.constexpr):
    """y^T tile [BN, BM] += W tile [BN, BK] @ x^T tile [BK, BM]: the weights are the MMA's A operand."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    step0 = pid_k * steps_per_split
    step1 = tl.minimum(step0 + steps_per_split, Kp // BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for step in tl.range(step0, step1, num_stages=STAGES):
        w = load_decode(w_ptr, nib_ptr, rows, step, stride_w, stride_nib, IS_W12, False, BLOCK_N, BLOCK_K)
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + m[None, :] * stride_xm + k[:, None], mask=(m < M)[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
    ymask = (m < M)[None, :]
    if split_k > 1:
        is_last, acc = tiles.reduce_split_k(acc, ws_ptr, count_ptr, pid_n, pid_k, split_k,
                                            m[None, :] * N + rows[:, None], ymask, M * N)
    else:
        is_last = True
    if is_last:
        if IS_W12:
            acc = acc * row_scale(base_ptr, rows)[:, None]
        tl.store(y_ptr + m[None, :] * stride_ym + rows[:, None], acc.to(y_ptr.dtype.element_ty), mask=ymask)


def launch(kind, x, p, y, ws, BN, BK, warps, stages, programs):
    """y [M, N] = x [M, K] @ W.T; p: v2 planes dict or a bf16 weight; ws: a SplitKWorkspace;
    `programs`: split K until about this many programs run."""
    w12 = isinstance(p, dict)
    if w12:
        w, nib, base = p["low"], p["nib"], p["base"]
        N, Kp = w.shape
        sw, sn = w.stride(0), nib.stride(0)
    else:
        w = nib = base = p
        N, Kp = p.shape
        sw, sn = p.stride(0), 0
    M = x.shape[0]
    steps = Kp // BK
    tiles_n = N // BN
    split = max(1, min(8, -(-programs // tiles_n), steps // 2))
    per = -(-steps // split)
    split = -(-steps // per)
    fn = tc_kernel
    bm = max(16, triton.next_power_of_2(M))
    fn[(tiles_n, split)](x, w, nib, base, y, ws.partials, ws.counters, M, N, Kp, split, per,
                         x.stride(0), y.stride(0), sw, sn,
                         IS_W12=w12, BLOCK_M=bm, BLOCK_N=BN, BLOCK_K=BK, STAGES=stages,
                         num_warps=warps, num_stages=stages)
    return y
