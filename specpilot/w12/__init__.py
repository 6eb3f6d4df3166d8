"""W12: a lossless 12-bit storage format for BF16 weights.

Per output row, the 16 consecutive binary exponents covering the most weights form a window; an
in-window weight is stored as a 12-bit code (sign, 4-bit exponent offset, 7 mantissa bits) split
into a byte plane `lo` and a nibble plane `hi`, both in the MMA-fragment column order, and every
other weight (zeros, subnormals, Inf, NaN, rare exponents) as an exact escape (format version 2).
`layout.py` documents the bytes, `codec.py` is the reference encoder/decoder, `weight.py` the
container, `checkpoint.py` the files. This package is the format only: the kernels live in
`specpilot.kernels`, the module the engine runs (`W12Linear`) and checkpoint conversion in
`specpilot.models`, the `specpilot w12` commands in `specpilot.cli.w12`.

Importing this package needs neither Triton nor a GPU.
"""

from specpilot.w12.codec import decode, encode
from specpilot.w12.weight import W12Weight

__all__ = ["W12Weight", "decode", "encode"]
