"""The inline-PTX decoders, executed by a tiny PTX emulator on CPU (the interpreter cannot run PTX).

The emulator reads the kernels' actual asm strings, so a wrong selector, shift or LUT fails here;
the GPU benchmark then checks the compiled kernels against the reference on every BF16 pattern.
"""

import re

import numpy as np
import pytest

from specpilot.w12.layout import MAX_BASE, MIN_BASE

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
    """Execute the subset of PTX the decoders use on uint64 numpy arrays holding 32-bit values."""
    regs = dict(operands)

    def val(tok):
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return U32(int(tok, 16) if tok.lower().startswith("0x") else int(tok))

    for stmt in asm.replace("{", ";").replace("}", ";").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, args = stmt.split(None, 1)
        args = [a.strip() for a in args.split(",")]
        d, srcs = args[0], [val(a) for a in args[1:]]
        if op == "mov.b32":
            r = srcs[0] + np.zeros(1, dtype=U32)
        elif op == "and.b32":
            r = srcs[0] & srcs[1]
        elif op == "add.u32":
            r = srcs[0] + srcs[1]
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


def expected_bits(byte, offset, base):
    """float32 bits of sign|mantissa byte `byte` with exponent base + offset (layout.dense_bits << 16)."""
    return (((byte & 0x80) << 8) | ((base + offset) << 7) | (byte & 0x7F)) << 16


@pytest.fixture(scope="module")
def tiles():
    """Imported at test time, after conftest switched Triton to the interpreter."""
    import specpilot.kernels.tiles as tiles

    return tiles


@pytest.mark.parametrize("high", [False, True])
@pytest.mark.parametrize("base", [MIN_BASE, 127, MAX_BASE])
def test_w12_decoder_matches_the_layout_for_every_byte_and_nibble(tiles, high, base):
    asm = (tiles.ASM_DECODE_HIGH if high else tiles.ASM_DECODE_LOW).value
    rng = np.random.default_rng(base)
    b = np.arange(256, dtype=U32)[:, None]  # mant byte under test
    n = np.arange(256, dtype=U32)[None, :]  # nibble byte under test
    for j in range(4):
        other_m = rng.integers(0, 256, (256, 256, 4)).astype(U32)
        other_n = rng.integers(0, 256, (256, 256, 4)).astype(U32)
        other_m[..., j], other_n[..., j] = b, n  # byte j is the one checked; the others are noise
        mant = sum(other_m[..., i] << U32(8 * i) for i in range(4))
        nib = sum(other_n[..., i] << U32(8 * i) for i in range(4))
        regs = run_ptx(asm, {"$4": mant, "$5": nib, "$6": U32(base * 0x01010101)})
        offset = (n >> U32(4)) if high else (n & U32(0xF))
        assert np.array_equal(regs[f"${j}"], np.broadcast_to(expected_bits(b, offset, U32(base)), (256, 256)))


def test_bf16_widening_asm(tiles):
    with open(tiles.__file__) as f:
        src = re.search(r'inline_asm_elementwise\("([^"]+)"', f.read()).group(1)
    asm = src.encode().decode("unicode_escape")
    pair = np.array([0x3F80_BF80, 0x7FC1_0001], dtype=U32)  # element 0 in the low half
    regs = run_ptx(asm, {"$2": pair})
    assert regs["$0"].tolist() == [0xBF80_0000, 0x0001_0000]
    assert regs["$1"].tolist() == [0x3F80_0000, 0x7FC1_0000]


@pytest.mark.parametrize("high", [False, True])
@pytest.mark.parametrize("base", [MIN_BASE, 127, MAX_BASE])
def test_w12_bf16_decoder_matches_the_layout_for_every_byte_and_nibble(tiles, high, base):
    """$0 packs BF16 weights (0, 1), $1 (2, 3), element 0 in the low half (Triton's pack=4 order)."""
    asm = (tiles.ASM_DECODE_BF16_HIGH if high else tiles.ASM_DECODE_BF16_LOW).value
    rng = np.random.default_rng(base + 1)
    b = np.arange(256, dtype=U32)[:, None]
    n = np.arange(256, dtype=U32)[None, :]
    for j in range(4):
        other_m = rng.integers(0, 256, (256, 256, 4)).astype(U32)
        other_n = rng.integers(0, 256, (256, 256, 4)).astype(U32)
        other_m[..., j], other_n[..., j] = b, n
        mant = sum(other_m[..., i] << U32(8 * i) for i in range(4))
        nib = sum(other_n[..., i] << U32(8 * i) for i in range(4))
        regs = run_ptx(asm, {"$2": mant, "$3": nib, "$4": U32(base * 0x01010101)})
        offset = (n >> U32(4)) if high else (n & U32(0xF))
        half = (regs[f"${j // 2}"] >> U32(16 * (j % 2))) & U32(0xFFFF)
        assert np.array_equal(half, np.broadcast_to(expected_bits(b, offset, U32(base)) >> U32(16), (256, 256)))
