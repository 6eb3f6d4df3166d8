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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specpilot.errors import ConfigError
from specpilot.w12.layout import K_PAD

GEMV_MAX_M = 8  # the GEMV kernel keeps one [BLOCK_N, BLOCK_K / 8] partial-sum tile per row in registers
GEMM_MAX_M = 64  # beyond this the projection is compute-bound: decode once, then cuBLAS
GEMV_DEFAULT_MAX_M = 0  # heuristic crossover: untuned shapes take the GEMM at every M. The GEMV
# (~4 SASS instructions per W12 weight at M = 1, plus ~1.4 per extra row; the GEMM ~2.6 at M <= 16)
# was the faster on 5 of the 10 Qwen3 projections at M = 1 in the 3f1051f sweep (qkv, 8B o, 32B
# down and lm_head, by 0-9%), 0-5% slower on the others and 8-28% slower on all at M = 2
# (bench/results/w12/w12_kernels_m1_2.json): a tuned-table choice, not a default
MAX_SPLIT_K = 8
REGISTERS_PER_SM = 65536
MIN_PROGRAMS_PER_SM = 2  # the register cap keeps at least this many programs of a config on an SM
SHARED_MEMORY_BUDGET = 220 * 1024  # candidates must fit an sm_90 block (232,448 bytes) with room for the epilogue
TUNED_DIR = Path(__file__).resolve().parent / "tuned"


class KernelPath(enum.Enum):
    GEMV = "gemv"  # FMA dot products in float32, 1..8 rows
    GEMM = "gemm"  # tensor cores (tl.dot), the decoded weights as the A operand, 1..64 rows


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
    num_stages: int = 1  # > 1: the K loop's loads are pipelined through shared memory (cp.async)
    ptx_decode: bool = True  # W12: decode with inline PTX (GPU); False = portable Triton ops
    programs_per_sm: int = 2  # with split_k = 0: split K until about this many programs per SM run
    gather_t: bool = False  # GEMM, W12 escape blocks: gather x from a transposed copy (see gemm.py)
    resident: int = MIN_PROGRAMS_PER_SM  # programs per SM the register cap leaves room for (max_registers)
    fit_wave: bool = False  # with split_k = 0: round the automatic split down, see `auto_split_k`
    tma: bool = False  # GEMM: load the weight tiles by TMA (tensor descriptors, `tma.py`) instead of cp.async
    tma_x: bool = False  # GEMM: load the x tiles by TMA too (a box [BM, BK] of x, transposed in shared memory)

    def __post_init__(self):
        if not _pow2(self.block_n) or not _pow2(self.block_k) or self.block_k < K_PAD:
            raise ValueError(f"block_n must be a power of two and block_k a power of two >= {K_PAD}: {self}")
        if self.path is KernelPath.GEMM and self.block_n < 16:
            raise ValueError(f"tl.dot needs block_n >= 16: {self}")
        if not 0 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"split_k must be in 0..{MAX_SPLIT_K}: {self}")
        if not 1 <= self.programs_per_sm <= 16:
            raise ValueError(f"programs_per_sm must be in 1..16: {self}")
        if not MIN_PROGRAMS_PER_SM <= self.resident <= 4:
            raise ValueError(f"resident must be in {MIN_PROGRAMS_PER_SM}..4: {self}")
        if self.gather_t and self.path is not KernelPath.GEMM:
            raise ValueError(f"gather_t is an option of the GEMM path: {self}")
        if (self.tma or self.tma_x) and self.path is not KernelPath.GEMM:
            raise ValueError(f"tma and tma_x are options of the GEMM path: {self}")
        if self.fit_wave and self.split_k:
            raise ValueError(f"fit_wave rounds the automatic split; this config fixes split_k: {self}")

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
        s += f" p{self.programs_per_sm}" if self.programs_per_sm != 2 else ""
        s += " xT" if self.gather_t else ""
        s += f" r{self.resident}" if self.resident != MIN_PROGRAMS_PER_SM else ""
        s += " fw" if self.fit_wave else ""
        s += " tma" if self.tma else ""
        s += " tmax" if self.tma_x else ""
        return s + ("" if self.ptx_decode else " portable")

    @property
    def max_registers(self) -> int:
        """Registers per thread the compiler may use (Triton's `maxnreg`): few enough that
        `resident` programs (MIN_PROGRAMS_PER_SM unless a config asks for more) fit an SM's
        register file. Without the cap, an 8-warp W12 GEMM with escape blocks took 136 and ran one
        program per SM, +76% on the H200 (a run of bench/w12_escape_cost.py at commit eb43a8e, not
        kept; see that commit's successor a6d82c8); 4-warp configs stay below theirs (248). With
        resident = 3 (168) the n64 k256 tiles at M = 32 compile to 161 registers with no spills
        instead of 210, so three programs fit where shared memory allows (s2: 57 KB); such configs
        were the best on 8 of 16 swept rows at M = 32-64 (bench/results/w12/w12_kernels_resident3.md)."""
        return min(255, REGISTERS_PER_SM // (32 * self.num_warps * self.resident)) // 8 * 8

    def shared_bytes(self, M: int, weight_bytes: float) -> float:
        """Estimated shared memory of the pipelined loop: num_stages buffers of the weight tile
        (`weight_bytes` per weight: 1.5 for W12, 2 for BF16) and, for the GEMM, of the x^T tile."""
        x_tile = self.block_k * block_m(self.path, M) * 2 if self.path is KernelPath.GEMM else 0
        return max(1, self.num_stages) * (self.block_n * self.block_k * weight_bytes + x_tile)


def next_pow2(v: int) -> int:
    return 1 << max(0, v - 1).bit_length()


def block_m(path: KernelPath, M: int) -> int:
    """Token rows per program: the power of two covering M (at least 16 for tensor cores)."""
    return next_pow2(M) if path is KernelPath.GEMV else max(16, next_pow2(M))


def m_bucket(M: int) -> int:
    return next_pow2(M)


# Candidates the benchmark sweeps, chosen from the SASS of sm_90 builds (instructions per weight in
# the K loop: `python -m specpilot.kernels.aot --sass gemm`) and the session-3 prototype timings.
# GEMM: 64-256 weight rows per program (the MMA's M: one or two warpgroups), K tiles of 128-512
# columns, 2-6 pipeline stages; larger row blocks amortize the x^T tile each program stages per K
# step (BK x BM x 2 bytes against BN x BK x 1.5 of W12), which matters from M = 32 on. GEMV: 8-32
# rows per program, 512-2048 columns per step, loads not pipelined (cp.async stages, TMA and a
# register prefetch of the next step were all slower: bench/results/w12/w12_gemv_*.json).
# Candidates whose buffers would not fit an sm_90 block at this M are left out. The benchmark also tries the best ones with other
# `programs_per_sm` (how finely small shapes are split along K) and split_k factors.
_GEMM_TILES = (  # (block_n, block_k, num_warps, num_stages)
    (64, 256, 4, 3), (64, 128, 4, 4), (64, 128, 4, 6), (64, 256, 4, 4), (64, 512, 4, 2), (64, 128, 4, 3),
    (64, 256, 4, 2),
    (128, 128, 4, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 256, 8, 2), (256, 128, 8, 3),
)
_GEMV_TILES = {  # block_m -> (block_n, block_k, num_warps, num_stages): the fastest at M = 1 and 2 in
    # bench/results/w12/w12_gemv_fma*.json, w12_gemv_in_acc.json (n16 k512 the best GEMV on 8B gate_up
    # and lm_head there) and w12_gemv_tiles.json (n8 k2048 on 8B down: 22.49 µs, the next 23.34);
    # at M = 4 the GEMV took 1.7-2.2x the tuned GEMM's time on every projection
    # (w12_gemv_fma_m4.md), so two tiles suffice from there
    1: ((8, 1024, 2, 1), (32, 512, 4, 1), (16, 1024, 4, 1), (8, 512, 2, 1), (16, 512, 4, 1), (8, 2048, 4, 1)),
    2: ((32, 512, 4, 1), (8, 1024, 2, 1), (16, 1024, 4, 1)),
    4: ((32, 512, 4, 1), (16, 512, 4, 1)),
    8: ((16, 512, 4, 1), (8, 512, 2, 1)),
}


def _fits(cfg: LaunchConfig, M: int) -> bool:
    return cfg.shared_bytes(M, 2.0) <= SHARED_MEMORY_BUDGET  # plain BF16 weights: the larger tiles


def gemv_candidates(M: int) -> tuple[LaunchConfig, ...]:
    g = KernelPath.GEMV
    tiles = _GEMV_TILES[block_m(g, min(M, GEMV_MAX_M))]
    return tuple(LaunchConfig(g, block_n=n, block_k=k, num_warps=w, num_stages=s) for n, k, w, s in tiles)


def gemm_candidates(M: int) -> tuple[LaunchConfig, ...]:
    g = KernelPath.GEMM
    configs = (LaunchConfig(g, block_n=n, block_k=k, num_warps=w, num_stages=s) for n, k, w, s in _GEMM_TILES)
    return tuple(c for c in configs if _fits(c, M))


def candidates(M: int) -> tuple[LaunchConfig, ...]:
    return (gemv_candidates(M) if M <= GEMV_MAX_M else ()) + gemm_candidates(M)


TMA_X_MIN_M = 16  # x's tiles by TMA are worth a try from here: 5-18% slower at M = 1 (bench/results/w12/w12_tma_x.md)


def with_tma_forms(configs, M: int) -> tuple[LaunchConfig, ...]:
    """`configs` and, after them, each GEMM config with its weight tiles by TMA and, from
    TMA_X_MIN_M rows with K steps a TMA box of x can hold (<= 256), x's tiles too: what a tuner
    tries besides the tiles themselves (TMA configs were the best on 43 of 70 W12 rows of the
    ae3517f sweep, x by TMA on 17 of 30 at M = 16-64 in a4ee472's)."""
    configs = tuple(configs)
    tma = tuple(replace(c, tma=True) for c in configs if c.path is KernelPath.GEMM)
    tma_x = tuple(replace(c, tma_x=True) for c in tma if M >= TMA_X_MIN_M and c.block_k <= 256)
    return tuple(dict.fromkeys(configs + tma + tma_x))


# The untuned default tile per format, for M up to the bucket's bound: the candidate with the best
# geometric mean over the 10 Qwen3 projections of each M in the H200 sweeps (bench/results/w12/
# w12_kernels.md at 4d037e8 and w12_kernels_more_tiles.md at 83be863, the only one with n64 k128 s3):
# W12 within 6-9% of each row's best at M <= 16 (n64 k256 s3), 6% at 32 (k128 s3), 12-14% at 64
# (n128 w8), where n64 k256 s3 everywhere was 13% (M = 32) and 23-25% (M = 64) off; BF16 within
# 2-4% at M <= 32 and 17% at 64 with n64 k128 s3, against 13-28% for n64 k256 s3. (Each row's
# best is its fastest of four timings, a config's figure one timing, so all are a little high.)
_HEURISTIC_TILES = {  # format -> ((largest M, (block_n, block_k, num_warps, num_stages)), ...)
    WeightFormat.W12: ((16, (64, 256, 4, 3)), (32, (64, 128, 4, 3)), (GEMM_MAX_M, (128, 128, 8, 3))),
    WeightFormat.DENSE: ((GEMM_MAX_M, (64, 128, 4, 3)),),
}


# The heuristic tiles load their weights by TMA (`tma.py`; cp.async wherever TMA cannot, e.g. before
# sm_90). Against the same tile with cp.async, one timing each in the same H200 sweep, TMA was faster
# on 21 of 27 W12 rows (geometric mean 1.027x, worst 0.961x) and 38 of 49 BF16 rows (1.012x, worst
# 0.993x) in the ae3517f sweep, and on 12 of 15 / 19 of 25 rows (1.053x / 1.017x) at M = 16-64 in
# a4ee472's (bench/results/w12/w12_kernels.json, w12_kernels_m16_64.json: the rows where the sweep
# timed both forms). Where the tuned table has a row it decides; this is the default for the rest.
HEURISTIC_TMA = True

# The escape gather reads a transposed copy of x (`gather_t`) by default from this many rows on weights
# of at least this many entries: in the f748401 sweep (bench/results/w12/w12_kernels.md) it won at
# M = 32-64 on the lm_heads (6-8e8 weights) and 32B gate_up (2.6e8), and lost on every projection
# of 1.3e8 weights or fewer but one (8B gate_up at M = 64, by 1.5%).
GATHER_T_MIN_M = 32
GATHER_T_MIN_WEIGHTS = 200_000_000


def heuristic_config(M: int, fmt: WeightFormat = WeightFormat.W12, N: int = 0, K: int = 0) -> LaunchConfig:
    """The untuned default for M rows of `fmt` (an [N, K] weight, when known): a tensor-core tile
    from `_HEURISTIC_TILES`, W12 gathering escapes from x^T on large weights at many rows, the
    8-warp tile with its split rounded down to one wave (`auto_split_k`; the GEMV only below
    GEMV_DEFAULT_MAX_M rows, none today)."""
    if M <= GEMV_DEFAULT_MAX_M:
        return gemv_candidates(M)[0]
    n, k, w, s = next(tile for bound, tile in _HEURISTIC_TILES[fmt] if M <= bound or bound == GEMM_MAX_M)
    gather_t = fmt is WeightFormat.W12 and M >= GATHER_T_MIN_M and N * K >= GATHER_T_MIN_WEIGHTS
    return LaunchConfig(KernelPath.GEMM, block_n=n, block_k=k, num_warps=w, num_stages=s, gather_t=gather_t,
                        fit_wave=w == 8,  # the 8-warp tile's register cap fits exactly two programs per SM
                        tma=HEURISTIC_TMA)


def auto_split_k(n_tiles: int, k_steps: int, sm_count: int, programs_per_sm: int = 2, fit_wave: bool = False) -> int:
    """Splits along K so that about `programs_per_sm` programs per SM stream weights, each over
    >= 2 K steps: rounded up, or with `fit_wave` down, so that they fit one wave of that many per
    SM. Rounding up overshoots the wave by up to a tile's splits, which is free where more programs
    than that fit an SM and costs a second wave where the register cap allows exactly that many
    (the 8-warp tiles at two per SM): W12 n128 k128 w8 s3 at M = 64, 40 row tiles of Qwen3-32B
    down, 7 splits (280 programs for 264 slots) 103.5 µs, 6 splits 79.5; rounded down it was
    faster on 5 of the 8 decoder projections and within 1% on the others
    (bench/results/w12/w12_n128_waves.md)."""
    programs = programs_per_sm * sm_count
    if n_tiles >= programs:
        return 1
    want = programs // n_tiles if fit_wave else -(-programs // n_tiles)
    return max(1, min(MAX_SPLIT_K, want, k_steps // 2))


def device_slug(device_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia_h200' (file name of the device's tuned table)."""
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


@functools.cache
def tuned_table(slug: str) -> dict[tuple[str, int, int, int], LaunchConfig]:
    """{(format, M bucket, N, K): config} from `tuned/<slug>.json`, or {} when there is none.
    A table this version cannot read (written for other kernels) is an error, not ignored."""
    path = TUNED_DIR / f"{slug}.json"
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())["entries"]
        return {(e["format"], e["m"], e["n"], e["k"]): LaunchConfig.from_dict(e["config"]) for e in entries}
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path}: not a tuned-config table of these kernels ({err}); "
                          f"re-run bench/w12_kernels.py or delete it") from None


def choose_config(fmt: WeightFormat, M: int, N: int, K: int, device_name: str = "") -> LaunchConfig:
    """The launch config for an [M, K] x [K, N] projection in `fmt` on the named device."""
    tuned = tuned_table(device_slug(device_name)).get((fmt.value, m_bucket(M), N, K)) if device_name else None
    return tuned or heuristic_config(M, fmt, N, K)
