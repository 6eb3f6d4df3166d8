"""Launch configurations of the projection kernels and how one is chosen for a problem size.

Owns: `LaunchConfig` (path, tile, split-K, warps, stages), the candidate lists the benchmark
sweeps, the default heuristic, the automatic split-K factor, and reading tuned tables written by
`bench/w12_kernels.py`. Pure Python: importing it needs neither Triton nor a GPU. Does not own
launching (`gemv.py`, `gemm.py`) or choosing between kernels and cuBLAS (`dispatch.py`).

Choice order for (format, M, N, K) on a device: an entry of the tuned table for the device (keyed
by the M bucket, N, K), else the heuristic below. Both are deterministic, so a given deployment
always runs the same reduction order.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from specpilot.w12.layout import GROUP

GEMV_MAX_M = 8  # the GEMV kernel keeps one [BLOCK_N, BLOCK_K/2] partial-product tile per row in registers
GEMM_MAX_M = 64  # beyond this the projection is compute-bound: decode once, then cuBLAS
GEMV_DEFAULT_MAX_M = 1  # heuristic crossover: the GEMV spends ~6.5 instructions per weight at M = 1,
# ~9 at M = 2 and ~13 at M = 4 (decode + M FMAs + M conversions of x); the GEMM ~6-8 at any M <= 64
MAX_SPLIT_K = 8
TUNED_DIR = Path(__file__).resolve().parent / "tuned"


class KernelPath(enum.Enum):
    GEMV = "gemv"  # FMA dot products in float32, 1..8 rows
    GEMM = "gemm"  # tensor cores (tl.dot), the decoded weights as the B operand, 1..64 rows


class WeightFormat(enum.Enum):
    W12 = "w12"
    DENSE = "dense"  # plain weights (BF16 in production)


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


@dataclass(frozen=True)
class LaunchConfig:
    path: KernelPath
    block_n: int  # weight rows per program
    block_k: int  # columns per loop step (a power-of-two multiple of 128)
    split_k: int = 0  # programs sharing one row block along K; 0 = choose from the grid size
    num_warps: int = 4
    num_stages: int = 1
    ptx_decode: bool = True  # W12: decode with inline PTX (GPU); False = portable Triton ops
    prefetch: bool = False  # load the raw tiles of K step i + 1 before decoding step i (register double buffer)
    bf16_decode: bool = False  # GEMM, W12 with PTX: decode straight to packed BF16 (no float32 -> BF16 step)

    def __post_init__(self):
        if not _pow2(self.block_n) or not _pow2(self.block_k) or self.block_k < GROUP:
            raise ValueError(f"block_n must be a power of two and block_k a power of two >= {GROUP}: {self}")
        if self.path is KernelPath.GEMM and self.block_n < 16:
            raise ValueError(f"tl.dot needs block_n >= 16: {self}")
        if self.bf16_decode and self.path is not KernelPath.GEMM:
            raise ValueError(f"bf16_decode is a GEMM option: {self}")
        if not 0 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"split_k must be in 0..{MAX_SPLIT_K}: {self}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = self.path.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LaunchConfig:
        return cls(**{**d, "path": KernelPath(d["path"])})

    def label(self) -> str:
        s = f"{self.path.value} n{self.block_n} k{self.block_k} w{self.num_warps} s{self.num_stages}"
        s += f" sk{self.split_k}" if self.split_k else ""
        s += " pf" if self.prefetch else ""
        s += " bf16d" if self.bf16_decode else ""
        return s + ("" if self.ptx_decode else " portable")


def next_pow2(v: int) -> int:
    return 1 << max(0, v - 1).bit_length()


def block_m(path: KernelPath, M: int) -> int:
    """Token rows per program: the power of two covering M (at least 16 for tensor cores)."""
    return next_pow2(M) if path is KernelPath.GEMV else max(16, next_pow2(M))


def m_bucket(M: int) -> int:
    return next_pow2(M)


# Candidates the benchmark sweeps, chosen from the SASS of sm_90 builds (instructions per weight in
# the main loop, registers). GEMV: ~32 weights per thread per step (three 16-byte W12 loads), one or
# two weight rows per thread (a second row reuses the converted x), shrinking tiles as BLOCK_M grows
# so the per-row accumulators fit registers. A kernel-level num_stages does not pipeline these loads
# (they feed no tl.dot), but the GEMV's K loop is a `tl.range(num_stages=...)`, and from 2 stages on
# Triton streams every plane through shared memory with cp.async (LDGSTS in the SASS: `python -m
# specpilot.kernels.aot --sass "gemv n4 k1024 w4 s3"`); with 1 stage only occupancy hides DRAM
# latency; `prefetch` instead carries the raw tiles of the next K step in registers (two steps in
# flight per program; its loop is never pipelined). Explicit split_k 2 doubles the
# programs of small-N shapes at the cost of a workspace reduction. GEMM: the decoded tile is the
# MMA's B operand (written to shared memory once); 64- to 256-row tiles, pipelining of the planes
# (num_stages 2-4) or register prefetch, and the direct-to-BF16 decoder. The first entry of each
# list is the untuned heuristic: keep it stable, since tuned tables and reports refer to labels.
def gemv_candidates(M: int) -> tuple[LaunchConfig, ...]:
    g = KernelPath.GEMV
    if block_m(g, M) <= 2:
        return (
            LaunchConfig(g, block_n=4, block_k=1024, num_warps=4),  # 1 row/thread, ~56 registers
            LaunchConfig(g, block_n=4, block_k=1024, num_warps=4, prefetch=True),
            LaunchConfig(g, block_n=8, block_k=1024, num_warps=4),  # 2 rows/thread, ~93 registers
            LaunchConfig(g, block_n=8, block_k=1024, num_warps=4, prefetch=True),
            LaunchConfig(g, block_n=4, block_k=2048, num_warps=4),  # 64 weights/thread/step
            LaunchConfig(g, block_n=2, block_k=1024, num_warps=2, prefetch=True),
            LaunchConfig(g, block_n=16, block_k=512, num_warps=8, prefetch=True),
            LaunchConfig(g, block_n=4, block_k=1024, num_warps=4, split_k=2, prefetch=True),
            # cp.async-pipelined K loops (3-4 steps in flight per program)
            LaunchConfig(g, block_n=4, block_k=1024, num_warps=4, num_stages=3),
            LaunchConfig(g, block_n=8, block_k=1024, num_warps=4, num_stages=3),
            LaunchConfig(g, block_n=4, block_k=512, num_warps=4, num_stages=4),
            LaunchConfig(g, block_n=4, block_k=1024, num_warps=4, num_stages=3, split_k=2),
        )
    return (
        LaunchConfig(g, block_n=4, block_k=512, num_warps=4),
        LaunchConfig(g, block_n=4, block_k=512, num_warps=4, prefetch=True),
        LaunchConfig(g, block_n=8, block_k=256, num_warps=4),
        LaunchConfig(g, block_n=2, block_k=512, num_warps=2),
        LaunchConfig(g, block_n=4, block_k=512, num_warps=4, num_stages=3),
    )


def gemm_candidates(M: int) -> tuple[LaunchConfig, ...]:
    g = KernelPath.GEMM
    return (
        LaunchConfig(g, block_n=64, block_k=128, num_warps=4, num_stages=3),
        LaunchConfig(g, block_n=64, block_k=256, num_warps=4, num_stages=2),
        LaunchConfig(g, block_n=128, block_k=256, num_warps=8, num_stages=2),
        LaunchConfig(g, block_n=128, block_k=128, num_warps=8, num_stages=2),
        LaunchConfig(g, block_n=64, block_k=128, num_warps=4, num_stages=3, bf16_decode=True),
        LaunchConfig(g, block_n=128, block_k=128, num_warps=4, num_stages=4, bf16_decode=True),
        LaunchConfig(g, block_n=128, block_k=128, num_warps=8, num_stages=3, bf16_decode=True),
        LaunchConfig(g, block_n=256, block_k=128, num_warps=8, num_stages=2, bf16_decode=True),
        LaunchConfig(g, block_n=64, block_k=256, num_warps=4, num_stages=1, prefetch=True, bf16_decode=True),
        LaunchConfig(g, block_n=128, block_k=128, num_warps=8, num_stages=1, prefetch=True, bf16_decode=True),
    )


def candidates(M: int) -> tuple[LaunchConfig, ...]:
    return (gemv_candidates(M) if M <= GEMV_MAX_M else ()) + gemm_candidates(M)


def heuristic_config(M: int) -> LaunchConfig:
    """The untuned default: GEMV for a few rows, tensor cores above."""
    return gemv_candidates(M)[0] if M <= GEMV_DEFAULT_MAX_M else gemm_candidates(M)[0]


def auto_split_k(n_tiles: int, k_steps: int, sm_count: int) -> int:
    """Splits along K so that about two programs per SM stream weights, each over >= 2 K steps."""
    if n_tiles >= 2 * sm_count:
        return 1
    want = -(-2 * sm_count // n_tiles)
    return max(1, min(MAX_SPLIT_K, want, k_steps // 2))


def device_slug(device_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia_h200' (file name of the device's tuned table)."""
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


@functools.cache
def tuned_table(slug: str) -> dict[tuple[str, int, int, int], LaunchConfig]:
    """{(format, M bucket, N, K): config} from `tuned/<slug>.json`, or {} when there is none."""
    path = TUNED_DIR / f"{slug}.json"
    if not path.is_file():
        return {}
    entries = json.loads(path.read_text())["entries"]
    return {(e["format"], e["m"], e["n"], e["k"]): LaunchConfig.from_dict(e["config"]) for e in entries}


def choose_config(fmt: WeightFormat, M: int, N: int, K: int, device_name: str = "") -> LaunchConfig:
    """The launch config for an [M, K] x [K, N] projection in `fmt` on the named device."""
    tuned = tuned_table(device_slug(device_name)).get((fmt.value, m_bucket(M), N, K)) if device_name else None
    return tuned or heuristic_config(M)
