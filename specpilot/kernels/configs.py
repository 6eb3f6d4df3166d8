"""Launch configurations of the projection kernels and how one is chosen for a problem size.

Owns: `LaunchConfig` (path, tile, split-K, warps, stages), the candidate tiles the config search
starts from, the default heuristic, the automatic split-K factor, and reading tuned tables (written
by `search.tuned_document`: scripts/w12_kernels.py, the loop's kernel agent). Pure Python:
importing it needs neither Triton nor a GPU. Does not own launching (`gemv.py`, `gemm.py`), the
search (`search.py`), or choosing between kernels and cuBLAS (`dispatch.py`).

Choice order for (format, M, N, K) on a device (`choose`): an entry of the tuned table for the
device (keyed by the M bucket, N, K: a launch config, or a `Fallback` where decoding then cuBLAS
was measured faster), else the fallback rule (the heuristic config up to RULE_MAX_M rows; above
them cuBLAS, on W12's kept decoded copy; a tuned config takes the kernels up to GEMM_MAX_M rows). The
tuned table is the shipped one with the user's cache over it
(`user_cache.py`: tables tuned on this machine, for these software versions) and, for a loop
candidate, its own table over both. All are deterministic, so a given deployment always runs the
same reduction order.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specpilot.errors import ConfigError
from specpilot.kernels import user_cache
from specpilot.w12.layout import K_PAD

GEMV_MAX_M = 8  # the GEMV kernel keeps one [BLOCK_N, BLOCK_K / 8] partial-sum tile per row in registers
GEMM_MAX_M = 128  # the tensor-core kernel's row limit: a tuned table may choose it up to here
RULE_MAX_M = 64  # the fallback rule's: untuned shapes above it run cuBLAS on the decoded weight (a verify
# tree of 65-128 rows is compute-heavy; there the kernels run only where the kernel search timed them faster)
GEMV_DEFAULT_MAX_M = 0  # heuristic crossover: untuned shapes take the GEMM at every M. The GEMV
# (~4 SASS instructions per W12 weight at M = 1, plus ~1.4 per extra row; the GEMM ~2.6 at M <= 16)
# wins on some projections at M = 1 and loses on all from M = 2: a tuned-table choice, not a default
MAX_SPLIT_K = 8
REGISTERS_PER_SM = 65536
MIN_PROGRAMS_PER_SM = 2  # the register cap keeps at least this many programs of a config on an SM
SHARED_MEMORY_BUDGET = 220 * 1024  # candidates must fit an sm_90 block (232,448 bytes) with room for the epilogue
TUNED_DIR = Path(__file__).resolve().parent / "tuned"


class KernelPath(enum.Enum):
    GEMV = "gemv"  # FMA dot products in float32, 1..8 rows
    GEMM = "gemm"  # tensor cores (tl.dot), the decoded weights as the A operand, 1..64 rows


class Fallback(enum.Enum):
    """A path that is no launch config of our kernels: cuBLAS (F.linear) on the decoded weight."""

    UNPACK_CUBLAS = "unpack_cublas"  # W12: decode into a shared BF16 buffer at each call, then cuBLAS
    DECODED_CUBLAS = "decoded_cublas"  # W12: decode once and keep the BF16 copy beside the planes (BF16's
    # speed for BF16's memory, on top of W12's), then cuBLAS; the rule above RULE_MAX_M rows, and a
    # table's choice where measured faster (`dispatch.decoded` decodes at each call where no copy fits)


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
        register file. Uncapped, an 8-warp W12 GEMM with escape blocks takes enough registers for
        one program per SM only, and the n64 k256 tiles at M = 32 enough for two; with resident = 3
        (168) those compile without spills, so three programs fit where shared memory allows."""
        return min(255, REGISTERS_PER_SM // (32 * self.num_warps * self.resident)) // 8 * 8

    def shared_bytes(self, M: int, weight_bytes: float) -> float:
        """Estimated shared memory of the pipelined loop: num_stages buffers of the weight tile
        (`weight_bytes` per weight: 1.5 for W12, 2 for BF16) and, for the GEMM, of the x^T tile."""
        x_tile = self.block_k * block_m(self.path, M) * 2 if self.path is KernelPath.GEMM else 0
        return max(1, self.num_stages) * (self.block_n * self.block_k * weight_bytes + x_tile)


Choice = LaunchConfig | Fallback  # what a tuned entry or the fallback rule picks for a projection


def next_pow2(v: int) -> int:
    return 1 << max(0, v - 1).bit_length()


def block_m(path: KernelPath, M: int) -> int:
    """Token rows per program: the power of two covering M (at least 16 for tensor cores)."""
    return next_pow2(M) if path is KernelPath.GEMV else max(16, next_pow2(M))


def m_bucket(M: int) -> int:
    return next_pow2(M)


# The tiles the config search (`search.py`) starts from, chosen from the SASS of sm_90 builds
# (instructions per weight in the K loop: `python -m specpilot.kernels.aot --sass gemm`) and timings.
# GEMM: 64-256 weight rows per program (the MMA's M: one or two warpgroups), K tiles of 128-512
# columns, 2-6 pipeline stages; larger row blocks amortize the x^T tile each program stages per K
# step (BK x BM x 2 bytes against BN x BK x 1.5 of W12), which matters from M = 32 on. GEMV: 8-32
# rows per program, 512-2048 columns per step, loads not pipelined (cp.async stages, TMA and a
# register prefetch of the next step were all slower). Candidates whose buffers would not fit an
# sm_90 block at this M are left out. The search's later phases vary the fastest of them.
_GEMM_TILES = (  # (block_n, block_k, num_warps, num_stages)
    (64, 256, 4, 3), (64, 128, 4, 4), (64, 128, 4, 6), (64, 256, 4, 4), (64, 512, 4, 2), (64, 128, 4, 3),
    (64, 256, 4, 2),
    (128, 128, 4, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 256, 8, 2), (256, 128, 8, 3),
)
_GEMV_TILES = {  # block_m -> (block_n, block_k, num_warps, num_stages): the fastest GEMV tiles of
    # the Qwen3 projections at M = 1 and 2; from M = 4 the GEMV takes about twice the tuned GEMM's
    # time, so two tiles suffice there
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


TMA_X_MIN_M = 16  # x's tiles by TMA are worth a try from here (at M = 1 they are slower than plain loads)


# The untuned default tile per format, for M up to the bucket's bound: the candidate with the best
# geometric mean of its time over the 10 Qwen3 projections at each M (`scripts/w12_kernels.py`).
_HEURISTIC_TILES = {  # format -> ((largest M, (block_n, block_k, num_warps, num_stages)), ...)
    WeightFormat.W12: ((16, (64, 256, 4, 3)), (32, (64, 128, 4, 3)), (GEMM_MAX_M, (128, 128, 8, 3))),
    WeightFormat.DENSE: ((GEMM_MAX_M, (64, 128, 4, 3)),),
}


# The heuristic tiles load their weights by TMA (`tma.py`; cp.async wherever TMA cannot, e.g. before
# sm_90): against the same tile with cp.async, TMA is faster on most rows in both formats (a few
# percent in geometric mean) and rarely more than a few percent slower (`scripts/w12_refine.py
# --twin tma` times the two). Where the tuned table has a row it decides; this is the default for the rest.
HEURISTIC_TMA = True

# The escape gather reads a transposed copy of x (`gather_t`) by default from this many rows on weights
# of at least this many entries: there the gather's traffic outweighs the copy's cost (it wins on
# the Qwen3 lm_heads and 32B gate_up at M = 32-64, and loses on nearly all smaller weights).
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
    (the 8-warp tiles at two per SM): e.g. 40 row tiles split 7 ways are 280 programs for the 264
    slots of 132 SMs, a second wave of 16; split 6 ways they fit one."""
    programs = programs_per_sm * sm_count
    if n_tiles >= programs:
        return 1
    want = programs // n_tiles if fit_wave else -(-programs // n_tiles)
    return max(1, min(MAX_SPLIT_K, want, k_steps // 2))


@functools.cache
def device_slug(device_name: str) -> str:
    """'NVIDIA Name 80GB' -> 'nvidia_name_80gb' (file name of the device's tuned table)."""
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


def entry_choice(entry: dict) -> Choice:
    """A table entry's choice: {"path": <a Fallback>} or {"config": <a LaunchConfig dict>}."""
    if "config" not in entry:
        return Fallback(entry["path"])
    return LaunchConfig.from_dict(entry["config"])


def entry_of(key: tuple[str, int, int, int], choice: Choice | dict) -> dict:
    """A table entry {"format", "m", "n", "k", and "config" or "path"} of a key and its choice."""
    f, m, n, k = key
    if isinstance(choice, Fallback):
        return {"format": f, "m": m, "n": n, "k": k, "path": choice.value}
    return {"format": f, "m": m, "n": n, "k": k, "config": choice if isinstance(choice, dict) else choice.to_dict()}


def _entries(path: Path, entries: list) -> dict[tuple[str, int, int, int], Choice]:
    try:
        return {(e["format"], e["m"], e["n"], e["k"]): entry_choice(e) for e in entries}
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path}: not a tuned-config table of these kernels ({err}); "
                          f"re-run scripts/w12_kernels.py or delete it") from None


@functools.cache
def shipped_table(slug: str) -> dict[tuple[str, int, int, int], Choice]:
    """{(format, M bucket, N, K): choice} from the package's `tuned/<slug>.json`, or {} when there
    is none. A shipped table this version cannot read (written for other kernels) is an error."""
    path = TUNED_DIR / f"{slug}.json"
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())["entries"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path}: not a tuned-config table of these kernels ({err}); "
                          f"re-run scripts/w12_kernels.py or delete it") from None
    return _entries(path, entries)


@functools.cache
def _cached_layer(path: Path, stamp: tuple[int, int] | None, slug: str) -> dict[tuple[str, int, int, int], Choice]:
    """The entries of a user-cache or candidate file (memoised by its stamp: rewritten, re-read);
    {} where it is absent, was written for other versions (`user_cache.read_document`) or for
    another GPU than `slug` (a table another machine's loop proposed)."""
    doc = user_cache.read_document(path) if stamp is not None else None
    if not doc or device_slug(doc.get("device") or "") != slug:
        return {}
    return _entries(path, doc.get("entries", []))


@functools.cache
def _layered(slug: str, layers: tuple[tuple[Path, tuple[int, int] | None], ...]) -> dict:
    out = dict(shipped_table(slug))
    for path, stamp in layers:
        out.update(_cached_layer(path, stamp, slug))
    return out


RECHECK_S = 1.0  # how long `tuned_table` trusts its memo before it looks at the cache files again
_recent: dict[tuple[str, str], tuple[float, dict]] = {}  # (slug, table) -> (when checked, the table)


def tuned_table(slug: str, table: str = "") -> dict[tuple[str, int, int, int], Choice]:
    """{(format, M bucket, N, K): choice} of GPU `slug`: the shipped table, the user cache of this
    process's versions over it (`user_cache.cache_path`; its entries win), and `table` (a
    candidate's file, the system's `kernel_table` knob) over both. Memoised: the files are looked
    at again (a stat each) once RECHECK_S has passed, and one that changed (mtime or size) is read
    again; every projection call asks, so a lookup within RECHECK_S is a dict access only."""
    now = time.monotonic()
    hit = _recent.get((slug, table))
    if hit is not None and now - hit[0] < RECHECK_S:
        return hit[1]
    paths = [user_cache.cache_path(slug)] + ([user_cache.resolve(table, slug)] if table else [])
    out = _layered(slug, tuple((p, user_cache.stamp(p)) for p in paths))
    _recent[slug, table] = (now, out)
    return out


def _clear_tables() -> None:
    for fn in (shipped_table, _cached_layer, _layered):
        fn.cache_clear()
    _recent.clear()
    _choices.clear()


tuned_table.cache_clear = _clear_tables  # tests that point TUNED_DIR elsewhere clear the memo


def fallback_rule(fmt: WeightFormat, M: int, N: int, K: int) -> Choice:
    """The choice where nothing was measured: our kernels up to RULE_MAX_M rows (the heuristic
    config); above them cuBLAS, for W12 on its kept decoded copy (BF16's speed: decoding at each
    call moves about 44 bits per weight through memory against cuBLAS's 16), for plain weights on
    the weight itself."""
    if M <= RULE_MAX_M:
        return heuristic_config(M, fmt, N, K)
    return Fallback.DECODED_CUBLAS if fmt is WeightFormat.W12 else Fallback.UNPACK_CUBLAS


CHOICES_KEPT = 4096  # `choose`'s memo is emptied past this many (device, table, format, M, N, K)
_choices: dict[tuple, tuple[dict | None, Choice]] = {}


def choose(fmt: WeightFormat, M: int, N: int, K: int, device_name: str = "", table: str = "") -> Choice:
    """What runs an [M, K] x [K, N] projection in `fmt` on the named device: the tuned table's
    entry (a launch config, or a `Fallback` where that was measured faster), else `fallback_rule`.
    A launch config for more rows than the kernels take is not taken. Every projection call asks:
    the answer is memoised against the table it was read from (`tuned_table`'s, the same object
    until a file changes), so a repeated call costs two dict lookups."""
    tuned = tuned_table(device_slug(device_name), table) if device_name else None
    key = (device_name, table, fmt, M, N, K)
    hit = _choices.get(key)
    if hit is not None and hit[0] is tuned:
        return hit[1]
    entry = tuned.get((fmt.value, m_bucket(M), N, K)) if tuned is not None else None
    choice = entry if entry is not None and (isinstance(entry, Fallback) or M <= GEMM_MAX_M) else \
        fallback_rule(fmt, M, N, K)
    if len(_choices) >= CHOICES_KEPT:
        _choices.clear()
    _choices[key] = (tuned, choice)
    return choice


def choose_config(fmt: WeightFormat, M: int, N: int, K: int, device_name: str = "", table: str = "") -> LaunchConfig:
    """The kernel launch config for an [M, K] x [K, N] projection in `fmt` on the named device
    (the tuned entry where it is a config, else the heuristic), whichever path `choose` takes."""
    tuned = tuned_table(device_slug(device_name), table).get((fmt.value, m_bucket(M), N, K)) if device_name else None
    return tuned if isinstance(tuned, LaunchConfig) else heuristic_config(M, fmt, N, K)
