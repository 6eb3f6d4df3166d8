"""The inline-PTX decoders, executed by a tiny PTX emulator on CPU (the interpreter cannot run PTX).

The emulator reads the kernels' actual asm strings, so a wrong selector, shift or LUT fails here;
the GPU benchmark then checks the compiled kernels against the reference on every BF16 pattern.
"""

import re

import numpy as np
import pytest

import torch

from specpilot.w12.layout import SCALE_BIAS, dense_bits

U32 = np.uint64  # compute in 64 bits, wrap to 32


def prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        byte = src[s & 7]
        if s & 8:
            byte = np.where(byte & 0x80, 0xFF, 0).astype(a.dtype)
        out |= byte << (8 * i)
    return out


def lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def run_ptx(asm: str, operands: dict) -> dict:
    """Execute the subset of PTX the decoders use on uint64 numpy arrays holding 32-bit values
    (64-bit operands hold 64-bit values); `mov.b32 {$a, $b}, r` splits r into 16-bit halves."""
    regs = dict(operands)

    def val(tok):
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return U32(int(tok, 16) if tok.lower().startswith("0x") else int(tok))

    for stmt in asm.replace("{\n", ";").replace("\n}", ";").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, args = stmt.split(None, 1)
        if op in ("mov.b64", "mov.b32") and args.startswith("{"):
            m = re.fullmatch(r"\{(\S+), (\S+)\}, (\S+)", args)
            assert m, stmt
            src, bits = val(m.group(3)), 32 if op == "mov.b64" else 16
            regs[m.group(1)] = src & U32((1 << bits) - 1)
            regs[m.group(2)] = (src >> U32(bits)) & U32((1 << bits) - 1)
            continue
        args = [a.strip() for a in args.split(",")]
        d, srcs = args[0], [val(a) for a in args[1:]]
        if op == "and.b32":
            r = srcs[0] & srcs[1]
        elif op == "shl.b32":
            r = srcs[0] << srcs[1]
        elif op == "shr.u32":
            r = srcs[0] >> srcs[1]
        elif op == "prmt.b32":
            r = prmt(srcs[0] + np.zeros(1, dtype=U32), srcs[1] + np.zeros(1, dtype=U32), int(srcs[2]))
        elif op == "lop3.b32":
            r = lop3(*(s + np.zeros(1, dtype=U32) for s in srcs[:3]), int(srcs[3]))
        else:
            raise AssertionError(f"emulator does not know {op}")
        regs[d] = r & U32(0xFFFFFFFF)
    return regs


@pytest.fixture(scope="module")
def tiles():
    """Imported at test time, after conftest switched Triton to the interpreter."""
    import specpilot.kernels.tiles as tiles

    return tiles


def group_words(code: int, low, nibble, rng):
    """(lo int64, hi int32) words of a group whose code `code` is (low, nibble) and whose other
    seven codes are random; low/nibble broadcast."""
    lows = [rng.integers(0, 256, size=low.shape, dtype=U32) for _ in range(8)]
    nibs = [rng.integers(0, 16, size=low.shape, dtype=U32) for _ in range(8)]
    lows[code], nibs[code] = low, nibble
    lo = sum(lows[i] << U32(8 * i) for i in range(8))
    hi = sum(nibs[i] << U32(8 * (i % 4) + 4 * (i // 4)) for i in range(8))
    return lo, hi


@pytest.mark.parametrize("f32", [False, True])
@pytest.mark.parametrize("code", range(8))
def test_group_decoder_matches_the_layout_for_every_code(tiles, f32, code):
    """Every (lo byte, nibble) pair at every code position of a group: output `code` holds the
    BF16 bits that `layout.dense_bits` gives a row of window base 112 (the scaled weight), as
    the low half of a BF16 pair or as float32; the other lanes are random and must not leak in."""
    rng = np.random.default_rng(code)
    low = np.repeat(np.arange(256, dtype=U32), 16)
    nibble = np.tile(np.arange(16, dtype=U32), 256)
    lo, hi = group_words(code, low, nibble, rng)
    asm = tiles.ASM_DECODE_F32.value if f32 else tiles.ASM_DECODE_BF16.value
    regs = run_ptx(asm, {"$8": lo, "$9": hi})
    got = regs[f"${code}"]
    expected = dense_bits(torch.from_numpy(low.astype(np.int32))[None, :],
                          torch.from_numpy(nibble.astype(np.int32))[None, :],
                          torch.tensor([SCALE_BIAS]))[0].numpy().astype(U32)
    assert np.array_equal(got, expected << U32(16) if f32 else expected)
