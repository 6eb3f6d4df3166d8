"""The launch-config search: which configs to try for a projection, in which phases, and which wins.

A problem is one projection size in one format, (format, N, K, M). Its search times, through an
injected `Timer` (on the GPU: `timing.GraphTimer`, which checks each config against the reference
under `reference.error_bound` before timing it):

1. the candidate tiles of M rows (`configs.candidates`; without a sweep, the defaults only) and the
   heuristic config;
2. the fastest ones with other `programs_per_sm`, explicit and one-wave splits (`split_variants`);
3. register-capped and x^T-gathering forms of the fastest GEMM configs (`resident_variants`,
   `gather_t_variants`);
4. weight tiles by TMA (`tma_variants`), 5. x tiles by TMA (`tma_x_variants`), 6. weight TMA for
   the fastest configs still without it (`tma_final_variants`).

Each phase varies the configs timed so far, so a later phase builds on the earlier ones' winners.
The fastest config that passed the check is the problem's best. `tune` runs a list of problems
within a time budget; `tuned_document` and `merge_tuned` write the results as the tuned table that
`configs.tuned_table` reads (shipped: specpilot/kernels/tuned/<device>.json; tuned on this
machine: the user cache, `user_cache.py`). The search run over the Qwen3 projections is
`scripts/w12_kernels.py`; the loop's kernel agent runs it on its deployment's shapes.

Does not own timing (`timing.py`), the configs' meaning or the candidate tiles (`configs.py`).
Pure Python: importing it needs neither Triton nor a GPU.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from specpilot.kernels import configs as kc
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat
from specpilot.w12.layout import padded_columns

TableKey = tuple[str, int, int, int]  # (format, M bucket, N, K): a tuned table's key


@dataclass(frozen=True)
class Problem:
    """One projection y [M, N] = x [M, K] @ W [N, K].T with W in `fmt`."""

    fmt: WeightFormat
    n: int
    k: int
    m: int

    @property
    def table_key(self) -> TableKey:
        return (self.fmt.value, kc.m_bucket(self.m), self.n, self.k)


@dataclass(frozen=True)
class Trial:
    """One config run on one problem: its µs per call, or why it was not timed."""

    config: LaunchConfig
    us: float | None = None  # None: not timed (`error` says why)
    worst_error_over_bound: float | None = None  # worst |y - exact| / bound; the config passes at <= 1
    error: str | None = None

    def to_dict(self) -> dict:
        d = {"config": self.config.to_dict(), "label": self.config.label(),
             "worst_error_over_bound": self.worst_error_over_bound, "us": self.us, "error": self.error}
        return {k: v for k, v in d.items() if v is not None}


class Timer(Protocol):
    """Checks `config` on `problem` against the reference and, if it passes, times it."""

    def __call__(self, problem: Problem, config: LaunchConfig) -> Trial: ...


@dataclass(frozen=True)
class SearchResult:
    problem: Problem
    tried: tuple[Trial, ...]  # in the order timed (known trials first)
    swept: bool  # False: the default configs only
    heuristic: LaunchConfig
    best: Trial | None  # the fastest timed trial; None when none passed

    @property
    def heuristic_us(self) -> float | None:
        return next((t.us for t in self.tried if t.config == self.heuristic), None)

    def to_dict(self) -> dict:
        """The result as a run document's row holds it (`swept_entries` reads it back)."""
        return {"tried": [t.to_dict() for t in self.tried], "heuristic_us": self.heuristic_us,
                "best_us": self.best.us if self.best else None,
                "best_config": self.best.config.label() if self.best else None, "swept": self.swept}


# -- phase 1: the candidates ---------------------------------------------------------------------
def default_configs(M: int) -> list[LaunchConfig]:
    """The untuned choices for M rows: the heuristic of each format and the first GEMM candidate."""
    return list(dict.fromkeys([kc.heuristic_config(M, f) for f in WeightFormat] + [kc.gemm_candidates(M)[0]]))


def sweep_configs(M: int, sweep: bool) -> list[LaunchConfig]:
    """Phase 1: every candidate of M rows when sweeping, else the defaults (no repeats)."""
    return list(dict.fromkeys(kc.candidates(M) if sweep else default_configs(M)))


def correctness_configs(M: int, every: bool) -> list[LaunchConfig]:
    """What a correctness check of M rows covers: every candidate (or the defaults), and the
    defaults with the portable decoder."""
    defaults = default_configs(M)
    configs = list(kc.candidates(M)) if every else defaults
    return list(dict.fromkeys(configs + [dataclasses.replace(c, ptx_decode=False) for c in defaults]))


# -- phase 2: splits -----------------------------------------------------------------------------
SPLIT_VARIANTS = (1, 4)  # programs_per_sm tried on the fastest phase-1 configs (phase 1 uses 2)
PHASE2_BEST = 3
EXPLICIT_SPLITS = (2, 3, 4, 6, 8)  # split_k tried on the fastest config when row tiles are few
ONE_WAVE_WITHIN = 1.3  # GEMM configs this close to the fastest also get their one-wave split


def timed(tried: Iterable[Trial]) -> list[Trial]:
    """The trials of `tried` that were timed, fastest first."""
    return sorted((t for t in tried if t.us is not None), key=lambda t: t.us)


def with_split(cfg: LaunchConfig, split_k: int) -> LaunchConfig:
    """`cfg` with a fixed split, which replaces any rounding of the automatic one (`fit_wave`)."""
    return dataclasses.replace(cfg, split_k=split_k, fit_wave=False)


def one_wave_split(cfg: LaunchConfig, N: int, K: int, sm_count: int) -> LaunchConfig | None:
    """`cfg` with the largest split_k whose programs fit one wave of MIN_PROGRAMS_PER_SM per SM
    (as many as the register cap guarantees) where its automatic split, which rounds up,
    overshoots that wave; else None. A second, nearly empty wave costs about as much as the first."""
    if cfg.path is not KernelPath.GEMM or cfg.split_k:
        return None
    tiles = -(-N // cfg.block_n)
    k_steps = -(-padded_columns(K) // cfg.block_k)
    auto = kc.auto_split_k(tiles, k_steps, sm_count, cfg.programs_per_sm, cfg.fit_wave)
    fit = max(1, min(kc.MAX_SPLIT_K, kc.MIN_PROGRAMS_PER_SM * sm_count // tiles, k_steps))
    # auto <= MAX_SPLIT_K and <= k_steps, so fit < auto only where tiles * auto overshoots the wave
    return with_split(cfg, fit) if fit < auto else None


def split_variants(tried: Sequence[Trial], p: Problem, sm_count: int) -> list[LaunchConfig]:
    """Phase 2: the PHASE2_BEST fastest configs with each other programs_per_sm (how finely small
    shapes split K; no new binaries); when the fastest has fewer row tiles than two per SM, it with
    each explicit split_k (the automatic split can leave some SMs a program more than others); and
    every GEMM config within ONE_WAVE_WITHIN of the fastest with its `one_wave_split`."""
    ranked = timed(tried)
    configs = [t.config for t in ranked[:PHASE2_BEST]]
    out = [dataclasses.replace(c, programs_per_sm=s) for c in configs for s in SPLIT_VARIANTS]
    if configs and -(-p.n // configs[0].block_n) < 2 * sm_count:
        out += [with_split(configs[0], s) for s in EXPLICIT_SPLITS]
    near = [t.config for t in ranked if t.us <= ONE_WAVE_WITHIN * ranked[0].us]
    out += [v for c in near if (v := one_wave_split(c, p.n, p.k, sm_count)) is not None]
    return list(dict.fromkeys(out))


# -- phase 3: register cap, x^T gather -----------------------------------------------------------
GATHER_T_MIN_M = kc.GATHER_T_MIN_M  # the rows from which the heuristic gathers from x^T too
GATHER_T_BEST = 2
RESIDENT_MIN_M = 32  # below, the uncapped 4-warp builds already fit three programs per SM
CAPPED_TILE = (64, 256, 4, 2)  # (block_n, block_k, warps, stages): fits three programs per SM at M = 32 when capped


def fastest_gemm(tried: Sequence[Trial], keep: Callable[[LaunchConfig], bool] = lambda c: True) -> list[LaunchConfig]:
    """The timed GEMM configs of `tried` that satisfy `keep`, fastest first: what phases 3-6 vary."""
    return [t.config for t in timed(tried) if t.config.path is KernelPath.GEMM and keep(t.config)]


def resident_variants(tried: Sequence[Trial], p: Problem, sm_count: int = 0) -> list[LaunchConfig]:
    """From RESIDENT_MIN_M rows: the PHASE2_BEST fastest 4-warp GEMM configs, and the fastest one's
    split on CAPPED_TILE, with the register cap of three programs per SM (`LaunchConfig.resident`):
    uncapped, the compiler gives these tiles registers for two."""
    if p.m < RESIDENT_MIN_M:
        return []
    configs = fastest_gemm(tried, lambda c: c.num_warps == 4 and c.resident == kc.MIN_PROGRAMS_PER_SM)[:PHASE2_BEST]
    out = [dataclasses.replace(c, resident=3) for c in configs]
    if configs:
        n, k, w, st = CAPPED_TILE
        out.append(dataclasses.replace(configs[0], block_n=n, block_k=k, num_warps=w, num_stages=st, resident=3))
    return list(dict.fromkeys(out))


def gather_t_variants(tried: Sequence[Trial], p: Problem, sm_count: int = 0) -> list[LaunchConfig]:
    """W12 from GATHER_T_MIN_M rows: the GATHER_T_BEST fastest GEMM configs with the escape gather
    reading a transposed copy of x; the copy costs a kernel, which pays where the gather's traffic
    is large (many rows, large weights). Plain weights have no escapes."""
    if p.fmt is not WeightFormat.W12 or p.m < GATHER_T_MIN_M:
        return []
    return [dataclasses.replace(c, gather_t=True) for c in fastest_gemm(tried)[:GATHER_T_BEST]]


# -- phases 4-6: TMA -----------------------------------------------------------------------------
TMA_BEST = 2
TMA_EVERY_TILE_MIN_M = 16  # from here on phase 4 gives TMA to every phase-1 GEMM tile too
TMA_X_MIN_M = kc.TMA_X_MIN_M  # below, x's tiles by TMA are slower than plain loads
TMA_X_BEST = 3
TMA_X_MAX_BLOCK_K = 256  # a TMA box holds at most 256 elements per dimension (`tma.MAX_BOX`)


def tma_variants(tried: Sequence[Trial], p: Problem, sm_count: int = 0) -> list[LaunchConfig]:
    """Phase 4: the TMA_BEST fastest GEMM configs so far loading their weight tiles by TMA
    (`LaunchConfig.tma`); from TMA_EVERY_TILE_MIN_M rows also every phase-1 tile, because TMA
    reorders the tiles: the best tile with TMA need not be among the fastest with cp.async."""
    ranked = fastest_gemm(tried, lambda c: not c.tma)
    configs = ranked[:TMA_BEST]
    if p.m >= TMA_EVERY_TILE_MIN_M:
        tiles = set(kc.gemm_candidates(p.m))
        configs += [c for c in ranked if c in tiles]
    return list(dict.fromkeys(dataclasses.replace(c, tma=True) for c in configs))


def tma_x_variants(tried: Sequence[Trial], p: Problem, sm_count: int = 0) -> list[LaunchConfig]:
    """Phase 5, from TMA_X_MIN_M rows: the TMA_X_BEST fastest GEMM configs so far loading their x
    tiles by TMA too (`LaunchConfig.tma_x`), of those whose K step a TMA box holds (a wider one
    falls back to plain loads: the same binary again)."""
    if p.m < TMA_X_MIN_M:
        return []
    boxable = fastest_gemm(tried, lambda c: not c.tma_x and c.block_k <= TMA_X_MAX_BLOCK_K)
    return [dataclasses.replace(c, tma_x=True) for c in boxable[:TMA_X_BEST]]


def tma_final_variants(tried: Sequence[Trial], p: Problem | None = None, sm_count: int = 0) -> list[LaunchConfig]:
    """Phase 6: the TMA_BEST fastest GEMM configs that still load their weights by cp.async (a
    phase-5 winner can come from a config phase 4 did not reach), with weight TMA, unless timed
    already: a TMA twin beside such a winner is usually the faster."""
    done = {t.config for t in tried}
    twins = (dataclasses.replace(c, tma=True) for c in fastest_gemm(tried, lambda c: not c.tma)[:TMA_BEST])
    return [c for c in twins if c not in done]


PHASES = (split_variants, resident_variants, gather_t_variants, tma_variants, tma_x_variants, tma_final_variants)


def sweep_binaries(M: int) -> list[LaunchConfig]:
    """Configs that build every binary a sweep of M rows can launch (a phase varies the tiles of
    these, and split_k / programs_per_sm are no compile-time constants): what a precompilation
    launches once."""
    configs = sweep_configs(M, True)
    if M >= GATHER_T_MIN_M:
        configs += [dataclasses.replace(c, gather_t=True) for c in kc.gemm_candidates(M)]
    if M >= RESIDENT_MIN_M:
        capped = [dataclasses.replace(c, resident=3) for c in kc.gemm_candidates(M) if c.num_warps == 4]
        configs += capped + [dataclasses.replace(c, gather_t=True) for c in capped if M >= GATHER_T_MIN_M]
    configs += [dataclasses.replace(c, tma=True) for c in configs if c.path is KernelPath.GEMM]
    if M >= TMA_X_MIN_M:
        configs += [dataclasses.replace(c, tma_x=True) for c in configs
                    if c.path is KernelPath.GEMM and c.block_k <= TMA_X_MAX_BLOCK_K]
    return configs


# -- the search ------------------------------------------------------------------------------------
def search_problem(p: Problem, timer: Timer, *, sweep: bool, sm_count: int,
                   first: Sequence[LaunchConfig] | None = None, known: Sequence[Trial] = ()) -> SearchResult:
    """Phase 1 (`first`, default `sweep_configs`, plus the heuristic) and, when sweeping, phases
    2-6. A config is timed once: `known` trials (e.g. today's config, timed by the caller) count
    as timed and rank with the rest."""
    heuristic = kc.heuristic_config(p.m, p.fmt, p.n, p.k)
    tried = list(known)

    def run(configs: Iterable[LaunchConfig]) -> None:
        done = {t.config for t in tried}
        tried.extend(timer(p, c) for c in dict.fromkeys(configs) if c not in done)

    run([*(sweep_configs(p.m, sweep) if first is None else first), heuristic])
    for phase in PHASES if sweep else ():
        run(phase(tried, p, sm_count))
    return result_of(p, tried, sweep, heuristic)


def result_of(p: Problem, tried: Sequence[Trial], swept: bool, heuristic: LaunchConfig) -> SearchResult:
    """The result of `tried`: its fastest timed trial is the best."""
    ranked = timed(tried)
    return SearchResult(p, tuple(tried), swept, heuristic, ranked[0] if ranked else None)


class OutOfBudget(enum.Enum):
    """What `tune` does with a problem it reaches after the budget."""

    DEFAULTS = "defaults"  # time the default configs (a benchmark reports every problem)
    SKIP = "skip"  # time nothing (a tuner keeps what it has)


@dataclass(frozen=True)
class SearchSettings:
    budget_s: float = math.inf  # problems reached within this many seconds are swept
    sweep: bool = True  # False: the default configs only, whatever the budget
    sm_count: int = 132  # the GPU's SMs (callers pass the device's), for the split phases
    out_of_budget: OutOfBudget = OutOfBudget.DEFAULTS


def tune(problems: Sequence[Problem], timer: Timer, settings: SearchSettings, *,
         known: Mapping[Problem, Sequence[Trial]] | None = None, started: float | None = None,
         clock: Callable[[], float] = time.monotonic) -> list[SearchResult]:
    """Search each problem, in order, sweeping those reached within `settings.budget_s` of
    `started` (default: now); one result per problem, in the same order."""
    known = known or {}
    started = clock() if started is None else started
    out = []
    for p in problems:
        in_budget = clock() - started < settings.budget_s
        if not in_budget and settings.out_of_budget is OutOfBudget.SKIP:
            out.append(result_of(p, known.get(p, ()), False, kc.heuristic_config(p.m, p.fmt, p.n, p.k)))
            continue
        out.append(search_problem(p, timer, sweep=settings.sweep and in_budget, sm_count=settings.sm_count,
                                  known=known.get(p, ())))
    return out


# -- the tuned table -----------------------------------------------------------------------------
RUN_KEYS = {WeightFormat.DENSE: "bf16_kernel", WeightFormat.W12: "w12"}  # a run document row's key per format


def best_configs(results: Iterable[SearchResult]) -> dict[TableKey, LaunchConfig]:
    """The best config of each result that has one, by table key (a later result of a key wins)."""
    return {r.problem.table_key: r.best.config for r in results if r.best is not None}


def tuned_document(device: str | None, configs: Mapping[TableKey, kc.Choice | dict], **fields) -> dict:
    """The tuned-table JSON that `configs.tuned_table` reads: {"device", **fields, "entries"}, one
    entry {"format", "m", "n", "k", "config"} per key, sorted ({..., "path": "unpack_cublas"} where
    decoding then cuBLAS won)."""
    entries = [kc.entry_of(key, c) for key, c in sorted(configs.items())]
    return {"device": device, **fields, "entries": entries}


def swept_entries(run: dict) -> dict[TableKey, tuple[dict, bool]]:
    """{table key: (best config, whether it was swept)} of a run document: {"meta": {"gpu",
    "git_commit"}, "timings": [{"N", "K", "M", RUN_KEYS[format]: SearchResult.to_dict()}]}."""
    out = {}
    for r in run["timings"]:
        for fmt, key in RUN_KEYS.items():
            row = r.get(key) or {}
            best = next((t["config"] for t in row.get("tried", []) if t["label"] == row.get("best_config")), None)
            if best:
                out[(fmt.value, kc.m_bucket(r["M"]), r["N"], r["K"])] = (best, bool(row.get("swept")))
    return out


def merge_tuned(new: dict, old: dict) -> dict:
    """A tuned table from a run document (`new`) and an older run document or tuned table (`old`):
    the newer run's best config where it swept the row, the older one's where it did not (out of
    budget, or a row count it did not run)."""
    if "entries" in old:  # a tuned table
        merged = {(e["format"], e["m"], e["n"], e["k"]): e["config"] for e in old["entries"]}
        older = old.get("merged_from") or [old.get("device")]
    else:
        merged = {key: cfg for key, (cfg, _) in swept_entries(old).items()}
        older = [old["meta"].get("git_commit")]
    merged.update({key: cfg for key, (cfg, swept) in swept_entries(new).items() if swept or key not in merged})
    return tuned_document(new["meta"].get("gpu"), merged, merged_from=[new["meta"].get("git_commit"), *older])
