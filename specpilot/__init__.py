"""SpecPilot: lossless speculative-decoding speedups, found and validated per deployment.

The package imports without a GPU and without Triton; GPU kernels build lazily on first use.
"""

__version__ = "0.1.0"
