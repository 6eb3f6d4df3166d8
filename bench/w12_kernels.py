"""GPU benchmark of the W12 and plain-BF16 projection kernels against cuBLAS BF16.

    python bench/w12_kernels.py --out DIR [--quick | --shipped] [--budget-s 330] [--ms M ...]

On one CUDA GPU, for every projection of Qwen3-8B and Qwen3-32B (qkv fused, o, gate_up fused,
down, lm_head) at M = 1, 2, 4, 8, 16, 32, 64 rows it times cuBLAS (`F.linear`), our BF16 kernel and
our W12 kernel. Every kernel config is first checked against the reference (decode, then a float32
matmul) under the error bound of `specpilot.kernels.reference.error_bound`; a config that fails is
reported and never timed. Timing: ≥4 rotating weight sets (together ≥ 3x L2, so L2 never serves
the weights), random normal BF16 weights of std 0.02 (no zeros), calls captured in a CUDA graph
(as the engine runs them) and timed with CUDA events, median over replays; after the sweep of a
row, cuBLAS and each kernel's best config are timed three more rounds side by side (rotated
order) and every arm reports its fastest timing. Reported: µs per call,
achieved TB/s on the bytes a call must move (weights incl. every W12 metadata byte, activations,
output), fraction of the measured copy bandwidth, and speedup over cuBLAS.

Writes, as it goes, into --out: w12_kernels.json (all data), w12_kernels.md (tables, targets) and
tuned_<gpu>.json (best config per format, M bucket, N, K; copy it to specpilot/kernels/tuned/ to
make the dispatcher use it). Each section runs in try/except, so a failure costs only that part.
The config sweep stops (heuristic configs only) once --budget-s has elapsed; projections are
visited twice, first at the target rows M = 1 and 32 for every projection, then at the other M, so
the budget goes to the targets first.

With --shipped there is no sweep: every row times the config the dispatcher picks on this GPU
(`configs.choose_config`: the shipped tuned table's entry, else the heuristic) and the heuristic,
and reports the shipped one's time -- what the engine runs, measured in one run for every row. No
tuned table is written then.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat  # noqa: E402
from specpilot.kernels.dispatch import device_name, run_config  # noqa: E402
from specpilot.kernels.launch import sm_count  # noqa: E402
from specpilot.kernels.reference import error_bound, reference_linear  # noqa: E402
from specpilot.w12 import decode, encode  # noqa: E402
from specpilot.w12.layout import bits_to_bf16, padded_columns  # noqa: E402

M_ORDER = (1, 32, 8, 64, 2, 4, 16)  # the targets first, in case the budget runs out
TARGET_MS = (1, 32)  # swept for every projection before any other M
L2_COVER_BYTES = 200e6  # weight sets of one projection together exceed this (>= 3x a 50-60 MB L2)
WEIGHT_STD = 0.02
DEVICE = "cuda"
# (N, K, M values, sweep every candidate config?): a shape every candidate tiles evenly (so its
# compiled variants are the timing ones) and an odd one for the default configs' masked paths.
CORRECTNESS_CASES = [(1024, 4096, (1, 3, 8, 17, 64), True), (1000, 1000, (1, 5, 33), False)]


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, N, K) of each fused projection."""
        C, I, D = self.hidden, self.intermediate, self.head_dim
        return [
            ("qkv", (self.heads + 2 * self.kv_heads) * D, C),
            ("o", C, self.heads * D),
            ("gate_up", 2 * I, C),
            ("down", C, I),
            ("lm_head", self.vocab, C),
        ]


QWEN3_8B = ModelShape("Qwen3-8B", 4096, 12288, 32, 8, 128, 151936)
QWEN3_32B = ModelShape("Qwen3-32B", 5120, 25600, 64, 8, 128, 151936)
MODELS = [QWEN3_8B, QWEN3_32B]


class Results:
    """Everything measured, rewritten to --out after every section."""

    def __init__(self, out: Path, meta: dict, write_tuned: bool = True):
        self.out = out
        self.write_tuned = write_tuned  # False with --shipped: nothing was tuned
        self.data = {"meta": meta, "copy_bandwidth": None, "correctness": [], "timings": [],
                     "decode_variants": [], "errors": []}
        self.best: dict[tuple, LaunchConfig] = {}

    def error(self, section: str, err: BaseException) -> None:
        line = f"{section}: {type(err).__name__}: {err}".splitlines()[0][:400]
        print("ERROR", line, file=sys.stderr)
        traceback.print_exc()
        self.data["errors"].append(line)
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "w12_kernels.json").write_text(json.dumps(self.data, indent=1) + "\n")
        (self.out / "w12_kernels.md").write_text(render_markdown(self.data))
        if not self.write_tuned:
            return
        entries = [{"format": f, "m": m, "n": n, "k": k, "config": c.to_dict()} for (f, m, n, k), c in sorted(self.best.items())]
        slug = kc.device_slug(self.data["meta"].get("gpu", "gpu"))
        (self.out / f"tuned_{slug}.json").write_text(json.dumps({"device": self.data["meta"].get("gpu"), "entries": entries}, indent=1) + "\n")


def git_commit() -> str:
    if os.environ.get("SPECPILOT_COMMIT"):  # set by bench/run_on_gpu.sh: the copy's .git may be stale
        return os.environ["SPECPILOT_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[1]
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5,
                             check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=5,
                               check=False).stdout.strip()
        return (sha or "unknown") + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - no git on the machine
        return "unknown"


def environment() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_commit": git_commit(),
    }


# -- timing -----------------------------------------------------------------------------------
def graph_time_us(calls: list, passes: int = 2, replays: int = 7) -> float:
    """Median µs per call of `calls` (one per weight set) replayed back to back in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(passes):
            for fn in calls:
                fn()
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / (passes * len(calls)))
    del graph
    return statistics.median(per_call)


def rotated_rounds(arms: dict[str, list], rounds: int = 3) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(fastest µs per arm, every round's µs) of `arms` (name -> calls for `graph_time_us`), each
    timed once per round in an order rotated by one arm per round, after warming the clocks: the
    side-by-side timing of the prototypes in bench/prototypes/."""
    keys = list(arms)
    runs: dict[str, list[float]] = {k: [] for k in keys}
    warm_clocks()
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            runs[k].append(graph_time_us(arms[k]))
    return {k: min(v) for k, v in runs.items()}, runs


def warm_clocks(ms: float = 30.0) -> None:
    """Keep the GPU busy for about `ms` so its clocks are up before a baseline is timed (the first
    timing after host-side work, e.g. encoding weights, was seen ~10% slow)."""
    a = torch.randn(4096, 4096, device=DEVICE, dtype=torch.bfloat16)
    start = time.monotonic()
    while (time.monotonic() - start) * 1e3 < ms:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def copy_bandwidth(results: Results) -> None:
    n = 1 << 29  # 1 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    t = statistics.median(times)
    results.data["copy_bandwidth"] = {"bytes_moved": 2 * n * 2, "seconds": t, "tbps": 2 * n * 2 / t / 1e12}
    print(f"copy bandwidth: {results.data['copy_bandwidth']['tbps']:.3f} TB/s")
    del src, dst


# -- correctness ------------------------------------------------------------------------------
def check_output(y: torch.Tensor, x: torch.Tensor, weight, exact=None, bound=None) -> float:
    """Worst |y - exact| / bound over finite outputs; raises if non-finite outputs differ from the reference."""
    ref = reference_linear(x, weight)
    if not torch.equal(torch.isnan(y), torch.isnan(ref)):
        raise AssertionError("NaN positions differ from the reference")
    inf = torch.isinf(ref)
    if not torch.equal(y[inf], ref[inf]) or not torch.isfinite(y[~inf & ~torch.isnan(ref)]).all():
        raise AssertionError("Inf positions differ from the reference")
    if exact is None:
        exact, bound = error_bound(x, weight, y.dtype)
    fin = torch.isfinite(ref)
    return float(((y.double() - exact).abs() / bound)[fin].max()) if fin.any() else 0.0


def default_configs(M: int) -> list[LaunchConfig]:
    """The untuned choices for M rows: the heuristic of each format, and the first GEMM candidate."""
    return list(dict.fromkeys([kc.heuristic_config(M, f) for f in WeightFormat] + [kc.gemm_candidates(M)[0]]))


def sweep_configs(M: int, sweep: bool) -> list[LaunchConfig]:
    """What a timed row tries: every candidate when sweeping, else the defaults (no repeats)."""
    return list(dict.fromkeys(kc.candidates(M) if sweep else default_configs(M)))


SPLIT_VARIANTS = (1, 4)  # programs_per_sm tried on the best phase-1 configs (phase 1 uses 2)
PHASE2_BEST = 3
EXPLICIT_SPLITS = (2, 3, 4, 6, 8)  # split_k tried on the fastest config when row tiles are few


ONE_WAVE_WITHIN = 1.3  # phase 2 also gives a one-wave split to phase-1 GEMM configs this close to the fastest


def with_split(cfg: LaunchConfig, split_k: int) -> LaunchConfig:
    """`cfg` with a fixed split, which replaces any rounding of the automatic one (`fit_wave`: the
    heuristic 8-warp tile, which phase 1 times too, has it)."""
    return dataclasses.replace(cfg, split_k=split_k, fit_wave=False)


def one_wave_split(cfg: LaunchConfig, N: int, K: int, sm_count: int) -> LaunchConfig | None:
    """`cfg` with the largest split_k whose programs fit one wave of MIN_PROGRAMS_PER_SM per SM
    (the register cap guarantees that many), when its automatic split overshoots that wave; else
    None. The automatic split rounds up: on Qwen3-32B down, 40 row tiles of n128 x 7 splits = 280
    programs for 264 slots (103.5 -> 79.5 µs at M = 64 with 6 splits,
    bench/results/w12/w12_n128_waves.md), and at M = 32 the n64 k256 s3 tile (two programs per SM
    there) 80 x 4 = 320; with 3 splits it was the fastest config of the row, 64.24 -> 60.56 µs
    (bench/results/w12/w12_kernels_m32_64.md)."""
    if cfg.path is not KernelPath.GEMM or cfg.split_k:
        return None
    tiles = -(-N // cfg.block_n)
    k_steps = -(-padded_columns(K) // cfg.block_k)
    auto = kc.auto_split_k(tiles, k_steps, sm_count, cfg.programs_per_sm, cfg.fit_wave)
    fit = max(1, min(kc.MAX_SPLIT_K, kc.MIN_PROGRAMS_PER_SM * sm_count // tiles, k_steps))
    # auto <= MAX_SPLIT_K and <= k_steps, so fit < auto only where tiles * auto overshoots the wave
    return with_split(cfg, fit) if fit < auto else None


def split_variants(tried: list[dict], N: int, K: int, sm_count: int) -> list[LaunchConfig]:
    """Phase 2 of a sweep: the PHASE2_BEST fastest configs of phase 1 with other programs_per_sm
    (how finely small shapes are split along K; no new binaries); when the fastest one has fewer
    row tiles than two per SM, that config with each explicit split_k: the automatic split leaves
    waves uneven (96 row tiles x 3 splits = 2.2 programs per SM of 132, so some SMs run 3); and
    every GEMM config within ONE_WAVE_WITHIN of the fastest with its one-wave split
    (`one_wave_split`)."""
    ranked = sorted((t for t in tried if "us" in t), key=lambda t: t["us"])
    configs = [LaunchConfig.from_dict(t["config"]) for t in ranked[:PHASE2_BEST]]
    out = [dataclasses.replace(c, programs_per_sm=p) for c in configs for p in SPLIT_VARIANTS]
    if configs and -(-N // configs[0].block_n) < 2 * sm_count:
        out += [with_split(configs[0], s) for s in EXPLICIT_SPLITS]
    near = [LaunchConfig.from_dict(t["config"]) for t in ranked if t["us"] <= ONE_WAVE_WITHIN * ranked[0]["us"]]
    out += [v for c in near if (v := one_wave_split(c, N, K, sm_count)) is not None]
    return list(dict.fromkeys(out))


GATHER_T_MIN_M = kc.GATHER_T_MIN_M  # the sweep tries configs gathering from x^T (gemm.py) from the rows
# where the heuristic starts using it; at M = 16 it was never the best in the f748401 and 9ca6a14 sweeps
GATHER_T_BEST = 2


def fastest_gemm(tried: list[dict], keep=lambda c: True) -> list[LaunchConfig]:
    """The GEMM configs of `tried` that were timed and satisfy `keep`, fastest first: what phases
    3-5 vary."""
    timed = sorted((t for t in tried if "us" in t and t["config"]["path"] == "gemm"), key=lambda t: t["us"])
    return [c for c in (LaunchConfig.from_dict(t["config"]) for t in timed) if keep(c)]


def gather_t_variants(tried: list[dict], M: int, fmt: WeightFormat) -> list[LaunchConfig]:
    """Phase 3 (W12, M >= GATHER_T_MIN_M): the GATHER_T_BEST fastest GEMM configs so far with the
    escape gather reading a transposed copy of x; it pays a copy kernel (~2.5 µs) and wins where
    the gather's traffic is large (bench/results/w12/gather_t.md)."""
    if fmt is not WeightFormat.W12 or M < GATHER_T_MIN_M:
        return []
    return [dataclasses.replace(c, gather_t=True) for c in fastest_gemm(tried)[:GATHER_T_BEST]]


RESIDENT_MIN_M = 32  # from here on the sweep also tries 4-warp configs capped for three programs per SM;
# at M = 16 the uncapped 4-warp builds already take <= 168 registers (three per SM where shared memory allows)
CAPPED_TILE = (64, 256, 4, 2)  # the tile that fits three programs per SM at M = 32 when capped (57 KB, 161 registers)


def resident_variants(tried: list[dict], M: int) -> list[LaunchConfig]:
    """Phase 3: from RESIDENT_MIN_M rows the PHASE2_BEST fastest 4-warp GEMM configs so far, and the
    fastest one's splits on the n64 k256 s2 tile, with the register cap of three programs per SM
    (`LaunchConfig.resident`). Uncapped, ptxas gives the M = 32 tiles 210 registers, two programs
    per SM; capped at 168 they take 161 with no spills (sm_90 build)."""
    if M < RESIDENT_MIN_M:
        return []
    configs = fastest_gemm(tried, lambda c: c.num_warps == 4 and c.resident == kc.MIN_PROGRAMS_PER_SM)[:PHASE2_BEST]
    out = [dataclasses.replace(c, resident=3) for c in configs]
    if configs:
        n, k, w, st = CAPPED_TILE
        out.append(dataclasses.replace(configs[0], block_n=n, block_k=k, num_warps=w, num_stages=st, resident=3))
    return list(dict.fromkeys(out))


TMA_BEST = 2
TMA_EVERY_TILE_MIN_M = 16  # from here on phase 4 also gives TMA to every phase-1 GEMM tile


def tma_variants(tried: list[dict], M: int) -> list[LaunchConfig]:
    """Phase 4: the TMA_BEST fastest GEMM configs so far (phases 1-3 included) loading their weight
    tiles by TMA (`LaunchConfig.tma`), for both formats; from TMA_EVERY_TILE_MIN_M rows also every
    GEMM config of phase 1 (the candidate tiles at the automatic split). At the cp.async path's
    tuned configs a prototype was 0.6-5.5% faster at M = 32 and within ±1% at M = 1 on most rows
    (bench/results/w12/w12_tma.md); but TMA also reorders the tiles: on Qwen3-8B gate_up at M = 32
    the n64 k128 s3 tile ranked 13th of 30 with cp.async in the d856760 sweep (55.05 µs) and was
    the fastest with TMA in a later look (42.12 µs against the tuned 46.22,
    bench/results/w12/w12_tma_tiles.md), out of reach of the two fastest."""
    ranked = fastest_gemm(tried, lambda c: not c.tma)
    configs = ranked[:TMA_BEST]
    if M >= TMA_EVERY_TILE_MIN_M:
        tiles = set(kc.gemm_candidates(M))
        configs += [c for c in ranked if c in tiles]
    return list(dict.fromkeys(dataclasses.replace(c, tma=True) for c in configs))


TMA_X_MIN_M = kc.TMA_X_MIN_M  # from here on phase 5 also loads the x tiles by TMA
TMA_X_BEST = 3


def tma_x_variants(tried: list[dict], M: int) -> list[LaunchConfig]:
    """Phase 5 (M >= TMA_X_MIN_M): the TMA_X_BEST fastest GEMM configs so far (phases 1-4
    included) loading their x tiles by TMA too (`LaunchConfig.tma_x`), for both formats; only K
    steps of at most 256 columns, which a TMA box can hold (a wider one would rerun the same
    binary). At the tuned configs a prototype was 0.5-4.5% faster at M = 32 on 8 of 10
    projections and 5-18% slower at M = 1 (bench/results/w12/w12_tma_x.md)."""
    if M < TMA_X_MIN_M:
        return []
    boxable = fastest_gemm(tried, lambda c: not c.tma_x and c.block_k <= 256)
    return [dataclasses.replace(c, tma_x=True) for c in boxable[:TMA_X_BEST]]


def tma_final_variants(tried: list[dict]) -> list[LaunchConfig]:
    """Phase 6: the TMA_BEST fastest GEMM configs after phase 5 that still load their weights by
    cp.async (a phase-5 winner has x by TMA from a config phase 4 did not reach), with weight TMA,
    unless timed already. Shipped configs that had won that way ran 5-10% slower than their TMA
    twins beside them: the Qwen3-32B lm_head at M=64 395.6 against 359.6 µs, the 8B lm_head at
    M=32 243.9 against 231.8 (bench/results/w12/w12_tiled_tma.md)."""
    done = {t["label"] for t in tried}
    twins = (dataclasses.replace(c, tma=True) for c in fastest_gemm(tried, lambda c: not c.tma)[:TMA_BEST])
    return [c for c in twins if c.label() not in done]


def correctness_configs(M: int, every: bool) -> list[LaunchConfig]:
    """What the correctness section checks: every candidate (or the defaults), plus the defaults
    with the portable decoder."""
    defaults = default_configs(M)
    configs = list(kc.candidates(M)) if every else defaults
    return list(dict.fromkeys(configs + [dataclasses.replace(c, ptx_decode=False) for c in defaults]))


def escape_heavy(N: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * WEIGHT_STD
    w[0, [0, 7]] = 0.0
    w[0, 5] = float("inf")
    w[1] = 0.0
    w[2] = torch.randn(K, generator=g) * 2.0**9
    w[2, [1, 70 % K, 200 % K]] = 0.0
    w[3, [2, 3]] = 1e-40
    w[3, [4, 100 % K]] = 3.0e4
    w[4, 9] = float("nan")
    w[5, 11] = -float("inf")
    w[6:, :] *= torch.where(torch.rand(N - 6, K, generator=g) < 0.001, 0.0, 1.0)  # ~1 zero per 1000
    return w.bfloat16().to(DEVICE)


def escape_free_weight(N: int, K: int) -> torch.Tensor:
    """Random BF16 weights whose every row has the exponents 112..127 only: W12 without escapes."""
    exponent = torch.randint(112, 128, (N, K), device=DEVICE)
    bits = (torch.randint(0, 2, (N, K), device=DEVICE) << 15) | (exponent << 7) | torch.randint(0, 128, (N, K), device=DEVICE)
    return bits_to_bf16(bits)


def escape_free_identity() -> list[dict]:
    """The W12 kernel equals our BF16 kernel bit for bit on escape-free weights, config by config
    (the scaled decode is exact): the format changes the bytes moved, not the arithmetic."""
    w = escape_free_weight(4096, 4096)
    enc = encode(w)
    rows = []
    for M in (1, 8, 32):
        x = torch.randn(M, 4096, device=DEVICE, dtype=torch.bfloat16)
        for cfg in kc.candidates(M):
            row = {"case": "W12 == BF16 kernel bit for bit, escape-free 4096x4096", "M": M, "config": cfg.label(),
                   "escapes": enc.num_escapes}
            try:
                row["ok"] = enc.num_escapes == 0 and torch.equal(
                    run_config(x, enc, cfg).view(torch.int16), run_config(x, w, cfg).view(torch.int16))
            except Exception as err:  # noqa: BLE001 - record it and go on with the next part
                row.update(ok=False, error=f"{type(err).__name__}: {err}".splitlines()[0][:300])
            rows.append(row)
    return rows


def correctness(results: Results, quick: bool) -> None:
    """Every candidate config, both formats, escape-heavy weights, against the reference."""
    allb = bits_to_bf16(torch.arange(65536, dtype=torch.int32)).reshape(256, 256).to(DEVICE)
    from specpilot.kernels.w12_unpack import unpack

    ok = torch.equal(unpack(encode(allb)).view(torch.int16), allb.view(torch.int16))
    results.data["correctness"].append({"case": "unpack all 65536 bf16 patterns", "ok": ok})
    identical = escape_free_identity()
    results.data["correctness"].extend(identical)
    for N, K, Ms, all_configs in CORRECTNESS_CASES:
        w = escape_heavy(N, K, seed=N)
        weights = {WeightFormat.W12: encode(w), WeightFormat.DENSE: w}
        for M in Ms:
            g = torch.Generator().manual_seed(M)
            x = torch.randn(M, K, generator=g).bfloat16().to(DEVICE)
            x[0, 5] = 0.0
            configs = correctness_configs(M, all_configs and not quick)
            for fmt, weight in weights.items():
                exact, bound = error_bound(x, weight, x.dtype)
                for cfg in configs:
                    row = {"case": f"escape-heavy {N}x{K}", "M": M, "format": fmt.value, "config": cfg.label()}
                    try:
                        row["worst_error_over_bound"] = check_output(run_config(x, weight, cfg), x, weight, exact, bound)
                        row["ok"] = row["worst_error_over_bound"] <= 1.0
                    except Exception as err:  # noqa: BLE001 - record it and go on with the next part
                        row.update(ok=False, error=f"{type(err).__name__}: {err}".splitlines()[0][:300])
                    results.data["correctness"].append(row)
                    if not row["ok"]:
                        print("CORRECTNESS FAILURE", row, file=sys.stderr)
    results.save()


# -- timing sweep -----------------------------------------------------------------------------
def weight_sets(N: int, K: int, set_bytes: float) -> int:
    return max(4, min(32, math.ceil(L2_COVER_BYTES / set_bytes)))


def random_weight(N: int, K: int) -> torch.Tensor:
    w = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16) * WEIGHT_STD
    return torch.where(w == 0, torch.full_like(w, WEIGHT_STD), w)  # never zeros


def time_config(x, weights, cfg, exact, bound) -> dict:
    """Check `cfg` on the first weight set, then time it over all sets."""
    row = {"config": cfg.to_dict(), "label": cfg.label()}
    try:
        y = run_config(x, weights[0], cfg)
        row["worst_error_over_bound"] = check_output(y, x, weights[0], exact, bound)
        if row["worst_error_over_bound"] > 1.0:
            row["error"] = "exceeds the error bound"
            return row
        row["us"] = graph_time_us([lambda w=w: run_config(x, w, cfg) for w in weights])
    except Exception as err:  # noqa: BLE001 - record it and go on with the next part
        row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return row


FINAL_ROUNDS = 3


def final_rounds(row: dict, x, cublas_runs: list, cublas: list, dense: list, w12: list) -> None:
    """Time cuBLAS and the best config of each kernel FINAL_ROUNDS more times, side by side, each
    round in another order; every arm then reports its fastest timing (cuBLAS over these and its
    runs before and after the sweep, a kernel over these and its sweep timing). A run's first
    timings of a kernel were seen up to 12% slow (bench/results/w12/first_reset.json), so a single
    timing per config would compare a cold kernel with a warm baseline."""
    arms = [("cublas", cublas_runs, cublas)] if cublas_runs else []
    for key, sets in (("bf16_kernel", dense), ("w12", w12)):
        best = (row.get(key) or {}).get("best_config")
        if best:
            cfg = next(LaunchConfig.from_dict(t["config"]) for t in row[key]["tried"] if t["label"] == best)
            runs = row[key].setdefault("best_runs", [row[key]["best_us"]])
            arms.append((key, runs, [lambda w=w, c=cfg: run_config(x, w, c) for w in sets]))
    for r in range(FINAL_ROUNDS if len(arms) > 1 else 0):
        for _, runs, calls in arms[r % len(arms):] + arms[:r % len(arms)]:
            runs.append(graph_time_us(calls))
    for key, runs, _ in arms:
        if key != "cublas":
            row[key]["best_us"] = min(runs)


def shipped_config(fmt: WeightFormat, M: int, N: int, K: int) -> LaunchConfig:
    """What the dispatcher runs for this projection on this GPU: the shipped tuned entry, else the heuristic
    (`dispatch.linear`'s own choice, with its own device-name lookup)."""
    return kc.choose_config(fmt, M, N, K, device_name(torch.device(DEVICE)))


def shipped_table(gpu_name: str) -> str:
    """Which tuned table a --shipped run times on this GPU, for the report."""
    slug = kc.device_slug(gpu_name)
    table = kc.tuned_table(slug)
    return f"specpilot/kernels/tuned/{slug}.json ({len(table)} entries)" if table else \
        f"none for {gpu_name!r}: every row runs the heuristic config"


def sweep_projection(results: Results, model: ModelShape, proj: str, N: int, K: int, quick: bool,
                     deadline: float, ms: tuple[int, ...], shipped: bool = False) -> None:
    dense_sets = weight_sets(N, K, N * K * 2)
    dense = [random_weight(N, K) for _ in range(dense_sets)]
    w12 = [encode(dense[i % dense_sets]) if i < dense_sets else encode(random_weight(N, K))
           for i in range(weight_sets(N, K, N * K * 1.5))]
    w12_bytes = w12[0].nbytes_total
    bits = w12[0].bits_per_weight
    print(f"{model.name} {proj} [{N}, {K}]: {len(dense)} BF16 / {len(w12)} W12 weight sets, {bits:.4f} bits/weight")
    for M in ms:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        moved_io = M * K * 2 + M * N * 2
        row = {"model": model.name, "proj": proj, "N": N, "K": K, "M": M, "bits_per_weight": bits,
               "escapes_per_row": w12[0].num_escapes / N,
               "bytes": {"cublas": N * K * 2 + moved_io, "bf16_kernel": N * K * 2 + moved_io, "w12": w12_bytes + moved_io}}
        cublas = [lambda w=w, x=x: F.linear(x, w) for w in dense]
        runs = []
        try:
            warm_clocks()
            runs.append(graph_time_us(cublas))
        except Exception as err:  # noqa: BLE001 - record it and go on with the next part
            row["cublas_error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        sweep = not quick and not shipped and time.monotonic() < deadline
        for fmt, sets in ((WeightFormat.DENSE, dense), (WeightFormat.W12, w12)):
            exact, bound = error_bound(x, sets[0], x.dtype)
            heuristic = kc.heuristic_config(M, fmt, N, K)
            chosen = shipped_config(fmt, M, N, K) if shipped else None
            configs = [chosen] if shipped else sweep_configs(M, sweep)
            configs = list(dict.fromkeys(configs + [heuristic]))  # its xT form is no candidate
            tried = [time_config(x, sets, cfg, exact, bound) for cfg in configs]
            if sweep:
                tried += [time_config(x, sets, cfg, exact, bound) for cfg in split_variants(tried, N, K, sm_count(x.device))]
                tried += [time_config(x, sets, cfg, exact, bound) for cfg in resident_variants(tried, M)]
                tried += [time_config(x, sets, cfg, exact, bound) for cfg in gather_t_variants(tried, M, fmt)]
                tried += [time_config(x, sets, cfg, exact, bound) for cfg in tma_variants(tried, M)]
                tried += [time_config(x, sets, cfg, exact, bound) for cfg in tma_x_variants(tried, M)]
                tried += [time_config(x, sets, cfg, exact, bound) for cfg in tma_final_variants(tried)]
            timed = [t for t in tried if "us" in t and (not shipped or t["label"] == chosen.label())]
            best = min(timed, key=lambda t: t["us"]) if timed else None  # shipped: the dispatcher's config, however it did
            key = "w12" if fmt is WeightFormat.W12 else "bf16_kernel"
            row[key] = {
                "tried": tried,
                "heuristic_us": next((t.get("us") for t in tried if t["label"] == heuristic.label()), None),
                "best_us": best["us"] if best else None,
                "best_config": best["label"] if best else None,
                "swept": sweep,
                **({"shipped_config": chosen.label()} if shipped else {}),
            }
            if best:
                results.best[(fmt.value, kc.m_bucket(M), N, K)] = LaunchConfig.from_dict(best["config"])
            del exact, bound
        if runs:  # cuBLAS again after our kernels: the baseline gets its better run, never a cold one
            runs.append(graph_time_us(cublas))
        final_rounds(row, x, runs, cublas, dense, w12)
        if runs:
            row["cublas_us_runs"] = runs
            row["cublas_us"] = min(runs)
        for key in ("cublas", "bf16_kernel", "w12"):
            us = row.get("cublas_us") if key == "cublas" else (row.get(key) or {}).get("best_us")
            if us:
                row.setdefault("tbps", {})[key] = row["bytes"][key] / (us * 1e-6) / 1e12
        if row.get("cublas_us"):
            for key in ("bf16_kernel", "w12"):
                us = (row.get(key) or {}).get("best_us")
                if us:
                    row.setdefault("speedup_vs_cublas", {})[key] = row["cublas_us"] / us
        results.data["timings"].append(row)
        s = row.get("speedup_vs_cublas", {})
        print(f"  M={M:>2}: cuBLAS {row.get('cublas_us', float('nan')):8.2f} us | BF16 kernel x{s.get('bf16_kernel', float('nan')):.3f}"
              f" | W12 {(row.get('w12') or {}).get('best_us') or float('nan'):8.2f} us x{s.get('w12', float('nan')):.3f}")
        results.save()
    del dense, w12
    torch.cuda.empty_cache()


def decode_variants(results: Results) -> None:
    """Heuristic configs on Qwen3-8B qkv and down: PTX vs portable decode, and ~1 escape per row
    (as in trained checkpoints) vs the few of random weights."""
    for proj, N, K in [p for p in MODELS[0].projections() if p[0] in ("qkv", "down")]:
        clean = [encode(random_weight(N, K)) for _ in range(weight_sets(N, K, N * K * 1.5))]
        dirty = []
        for w in clean:
            dense = decode(w)
            dense[torch.arange(N, device=DEVICE), torch.randint(0, K, (N,), device=DEVICE)] = 0.0
            dirty.append(encode(dense))
        for M in (1, 32):
            x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
            cfg = kc.heuristic_config(M)
            portable = dataclasses.replace(cfg, ptx_decode=False)
            row = {"proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                   "escapes_per_row": {"clean": clean[0].num_escapes / N, "dirty": dirty[0].num_escapes / N},
                   "bits_per_weight": {"clean": clean[0].bits_per_weight, "dirty": dirty[0].bits_per_weight}}
            for name, sets, c in (("ptx", clean, cfg), ("portable", clean, portable), ("ptx_1_escape_per_row", dirty, cfg)):
                exact, bound = error_bound(x, sets[0], x.dtype)
                row[name] = time_config(x, sets, c, exact, bound)
            results.data["decode_variants"].append(row)
            print(f"variants {proj} M={M}: " + ", ".join(f"{k} {row[k].get('us', float('nan')):.2f} us"
                                                          for k in ("ptx", "portable", "ptx_1_escape_per_row")))
        del clean, dirty
        torch.cuda.empty_cache()
    results.save()


# -- parallel precompilation ----------------------------------------------------------------
def compile_problems(quick: bool, models, ms, shipped: bool = False) -> list[tuple[int, int, int, LaunchConfig]]:
    """(N, K, M, config) of every kernel launch the correctness checks and the sweep will make.

    Triton compiles one binary per config, M bucket and tile evenness (N % block_n, K % block_k),
    so launching each of these once, on any weights of the same shape, fills the on-disk cache
    with exactly the binaries the timed sections load.
    """
    out = []
    for N, K, Ms, all_configs in CORRECTNESS_CASES:
        for M in Ms:
            out += [(N, K, M, c) for c in correctness_configs(M, all_configs and not quick)]
    for model in models:
        for _, N, K in model.projections():
            for M in ms:
                if shipped:  # the dispatcher's configs and the heuristics, nothing else
                    configs = [c for f in WeightFormat for c in (shipped_config(f, M, N, K), kc.heuristic_config(M, f, N, K))]
                    out += [(N, K, M, c) for c in configs]
                    continue
                configs = list(sweep_configs(M, not quick))
                if not quick and M >= GATHER_T_MIN_M:  # phase 3's binaries (any of these tiles may be best)
                    configs += [dataclasses.replace(c, gather_t=True) for c in kc.gemm_candidates(M)]
                if not quick and M >= RESIDENT_MIN_M:
                    capped = [dataclasses.replace(c, resident=3) for c in kc.gemm_candidates(M) if c.num_warps == 4]
                    configs += capped + [dataclasses.replace(c, gather_t=True) for c in capped if M >= GATHER_T_MIN_M]
                if not quick:  # phase 4's binaries: any GEMM tile above may be among the fastest
                    configs += [dataclasses.replace(c, tma=True) for c in configs if c.path is KernelPath.GEMM]
                if not quick and M >= TMA_X_MIN_M:  # phase 5's: any of those may be among the fastest
                    configs += [dataclasses.replace(c, tma_x=True) for c in configs
                                if c.path is KernelPath.GEMM and c.block_k <= 256]
                out += [(N, K, M, c) for c in configs]
    return list(dict.fromkeys(out))


def distinct_binaries(problems) -> dict:
    """One representative problem per compiled binary (what Triton specializes on: the config's
    constexprs, the M bucket and whether it is full, tile evenness, and divisibility of sizes by 16)."""
    reps = {}
    for N, K, M, cfg in problems:
        bm = kc.block_m(cfg.path, M)
        key = (cfg, bm, M == bm, N % cfg.block_n == 0, K % cfg.block_k == 0, N % 16 == 0, K % 16 == 0)
        if key not in reps or N * K < reps[key][0] * reps[key][1]:
            reps[key] = (N, K, M, cfg)  # the smallest weights that build this binary
    return reps


def precompile_worker(index: int, jobs: int, quick: bool, models, ms, shipped: bool = False) -> int:
    """Launch this worker's share of the distinct binaries once per format; failures are the timed run's to report."""
    mine = list(distinct_binaries(compile_problems(quick, models, ms, shipped)).values())[index::jobs]
    weights: dict[tuple[int, int], dict] = {}
    for N, K, M, cfg in mine:
        if (N, K) not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            w = random_weight(N, K)
            weights[N, K] = {WeightFormat.DENSE: w, WeightFormat.W12: encode(w)}
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        for weight in weights[N, K].values():
            try:
                run_config(x, weight, cfg)
            except Exception:  # noqa: BLE001 - the timed run records the failure
                pass
    torch.cuda.synchronize()
    return 0


def precompile(jobs: int, quick: bool, timeout_s: float, ms: tuple[int, ...] = M_ORDER, shipped: bool = False) -> dict:
    """Compile every kernel variant in `jobs` processes at once (compiling is CPU-bound and the
    sweep would otherwise spend most of its budget on it); the timed sections then load them."""
    t = time.monotonic()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--out", "/dev/null", "--jobs", str(jobs)] + (
        ["--quick"] if quick else []) + (["--shipped"] if shipped else []) + ["--ms", *map(str, ms)]
    procs = [subprocess.Popen(cmd + ["--precompile-worker", str(i)]) for i in range(jobs)]
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t))))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append("timeout")
    info = {"jobs": jobs, "seconds": round(time.monotonic() - t, 1), "exit_codes": codes}
    print(f"precompile: {info}")
    return info


# -- report -----------------------------------------------------------------------------------
def fmt_num(v, spec=".2f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def render_markdown(data: dict) -> str:
    meta = data["meta"]
    lines = ["# W12 kernel benchmark", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    copy = (data.get("copy_bandwidth") or {}).get("tbps")
    lines += [f"- device copy bandwidth: {fmt_num(copy, '.3f')} TB/s (read + write of 1 GiB)", ""]
    bad = [c for c in data["correctness"] if not c.get("ok")]
    lines += [f"Correctness: {len(data['correctness']) - len(bad)} / {len(data['correctness'])} checks passed "
              "(reference: decode, then float32 matmul; bound: specpilot.kernels.reference.error_bound)."]
    lines += [f"- FAILED: {c}" for c in bad] + [""]
    header = ("| model | proj | N x K | M | cuBLAS µs | BF16 kernel µs | W12 µs | W12 TB/s | W12 % copy "
              "| BF16 kernel / cuBLAS | **W12 / cuBLAS** | W12 config | W12 heuristic µs | bits/w |")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    order = {name: i for i, (name, _, _) in enumerate(QWEN3_8B.projections())}
    for r in sorted(data["timings"], key=lambda r: (r["model"], order.get(r["proj"], 99), r["M"])):
        w12, bk = r.get("w12") or {}, r.get("bf16_kernel") or {}
        s, tb = r.get("speedup_vs_cublas", {}), r.get("tbps", {})
        pct = 100 * tb["w12"] / copy if copy and "w12" in tb else None
        lines.append(
            f"| {r['model']} | {r['proj']} | {r['N']}x{r['K']} | {r['M']} | {fmt_num(r.get('cublas_us'))} "
            f"| {fmt_num(bk.get('best_us'))} | {fmt_num(w12.get('best_us'))} | {fmt_num(tb.get('w12'), '.3f')} "
            f"| {fmt_num(pct, '.1f')} | {fmt_num(s.get('bf16_kernel'), '.3f')} | **{fmt_num(s.get('w12'), '.3f')}** "
            f"| {w12.get('best_config') or '-'} | {fmt_num(w12.get('heuristic_us'))} | {fmt_num(r['bits_per_weight'], '.4f')} |"
        )
    lines += ["", "Targets (issue 3):"]
    for M, target in ((1, 1.25), (32, 1.15)):
        rows = [r for r in data["timings"] if r["M"] == M and "w12" in r.get("speedup_vs_cublas", {})]
        if rows:
            worst = min(rows, key=lambda r: r["speedup_vs_cublas"]["w12"])
            met = sum(r["speedup_vs_cublas"]["w12"] >= target for r in rows)
            lines.append(f"- W12 >= {target}x cuBLAS at M={M}: {'met' if met == len(rows) else 'NOT met'}: reached on {met} of "
                         f"{len(rows)} projections (worst {worst['speedup_vs_cublas']['w12']:.3f}x: {worst['model']} {worst['proj']})")
    big = [r for r in data["timings"] if r["M"] == 1 and r["proj"] in ("gate_up", "down", "lm_head") and "w12" in r.get("tbps", {})]
    if big and copy:
        worst = min(big, key=lambda r: r["tbps"]["w12"])
        met = sum(r["tbps"]["w12"] >= 0.85 * copy for r in big)
        lines.append(f"- W12 >= 85% of copy bandwidth on large matrices (gate_up, down, lm_head) at M=1: reached on {met} of "
                     f"{len(big)} (worst {100 * worst['tbps']['w12'] / copy:.1f}%: {worst['model']} {worst['proj']})")
    if data["decode_variants"]:
        lines += ["", "Decode variants (heuristic config; µs): PTX decode vs portable Triton decode, and with ~1 escape per row",
                  "", "| proj | M | PTX | portable | PTX, ~1 escape/row | escapes/row | bits/w | config |", "|---|---|---|---|---|---|---|---|"]
        for r in data["decode_variants"]:
            us = [fmt_num(r[k].get("us")) for k in ("ptx", "portable", "ptx_1_escape_per_row")]
            lines.append(f"| {r['proj']} {r['N']}x{r['K']} | {r['M']} | {' | '.join(us)} "
                         f"| {r['escapes_per_row']['clean']:.3f} -> {r['escapes_per_row']['dirty']:.3f} "
                         f"| {r['bits_per_weight']['clean']:.4f} -> {r['bits_per_weight']['dirty']:.4f} | {r['config']} |")
    if data["errors"]:
        lines += ["", "Errors:"] + [f"- {e}" for e in data["errors"]]
    return "\n".join(lines) + "\n"


def swept_entries(data: dict) -> dict[tuple[str, int, int, int], tuple[dict, bool]]:
    """{(format, M bucket, N, K): (best config, whether the row was swept)} of one run's results."""
    out = {}
    for r in data["timings"]:
        for key, fmt in (("bf16_kernel", WeightFormat.DENSE), ("w12", WeightFormat.W12)):
            row = r.get(key) or {}
            best = next((t["config"] for t in row.get("tried", []) if t["label"] == row.get("best_config")), None)
            if best:
                out[(fmt.value, kc.m_bucket(r["M"]), r["N"], r["K"])] = (best, bool(row.get("swept")))
    return out


def merge_tuned(new: dict, old: dict) -> dict:
    """A tuned table from a run's results (`new`) and an older run's results or a tuned table
    (`old`, e.g. the shipped one): the newer run's best config where it swept the row, the older
    one's where the newer run did not sweep it (out of budget, or a row count it did not run)."""
    if "entries" in old:  # a tuned table
        merged = {(e["format"], e["m"], e["n"], e["k"]): e["config"] for e in old["entries"]}
        older = old.get("merged_from") or [old.get("device")]
    else:
        merged = {key: cfg for key, (cfg, _) in swept_entries(old).items()}
        older = [old["meta"].get("git_commit")]
    merged.update({key: cfg for key, (cfg, swept) in swept_entries(new).items() if swept or key not in merged})
    return {"device": new["meta"].get("gpu"), "merged_from": [new["meta"].get("git_commit"), *older],
            "entries": [{"format": f, "m": m, "n": n, "k": k, "config": c} for (f, m, n, k), c in sorted(merged.items())]}


def row_counts(wanted: list[int] | None, quick: bool, shipped: bool) -> tuple[int, ...]:
    """The row counts a run times, in order: the targets' first, then --ms's others ascending. A
    sweep takes the buckets' bounds only (the tuned table's keys); --shipped any of 1..GEMM_MAX_M,
    since the dispatcher serves every row count with its bucket's config. ValueError otherwise."""
    ms = (1, 32, 8) if quick else M_ORDER
    if not wanted:
        return ms
    allowed = set(range(1, kc.GEMM_MAX_M + 1)) if shipped else set(M_ORDER)
    if not set(wanted) <= allowed:
        what = f"1-{kc.GEMM_MAX_M} with --shipped" if shipped else f"{sorted(M_ORDER)}"
        raise ValueError(f"--ms takes row counts of {what}, got {sorted(set(wanted) - allowed)}")
    return tuple(M for M in ms if M in wanted) + tuple(sorted(set(wanted) - set(ms)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="directory for w12_kernels.json/.md and the tuned table")
    p.add_argument("--quick", action="store_true", help="Qwen3-8B only, M in {1, 8, 32}, heuristic configs only")
    p.add_argument("--shipped", action="store_true",
                   help="no sweep: time the config the dispatcher picks (shipped tuned table, else heuristic) on every row")
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="seconds (from the start) after which the config sweep stops; later rows time the heuristic only")
    p.add_argument("--jobs", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)),
                   help="processes that compile the kernel variants in parallel first (1: no precompilation)")
    p.add_argument("--ms", type=int, nargs="+", metavar="M",
                   help=f"only these row counts (of {', '.join(map(str, sorted(M_ORDER)))}); the tuned table then covers "
                        "only them: merge it into a complete one with --merge-tuned. With --shipped, any of "
                        f"1-{kc.GEMM_MAX_M}: the dispatcher serves every row count with its bucket's config")
    p.add_argument("--precompile-worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--merge-tuned", nargs=2, type=Path, metavar=("NEW", "OLD"),
                   help="no GPU: write OUT/tuned_<gpu>.json from a run's w12_kernels.json (NEW) and an older run's, or a "
                        "tuned table (OLD): NEW's rows it swept, OLD's others")
    args = p.parse_args(argv)
    if args.merge_tuned:
        new, old = (json.loads(f.read_text()) for f in args.merge_tuned)
        table = merge_tuned(new, old)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"tuned_{kc.device_slug(new['meta'].get('gpu', 'gpu'))}.json"
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{path}: {len(table['entries'])} entries")
        return 0
    if args.quick and args.shipped:
        p.error("--quick and --shipped are different runs: give one")
    models = MODELS[:1] if args.quick else MODELS
    try:
        ms = row_counts(args.ms, args.quick, args.shipped)
    except ValueError as err:
        p.error(str(err))
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.precompile_worker is not None:
        return precompile_worker(args.precompile_worker, args.jobs, args.quick, models, ms, args.shipped)
    start = time.monotonic()
    torch.manual_seed(0)
    results = Results(args.out, {}, write_tuned=not args.shipped)
    try:
        results.data["meta"] = environment()
    except Exception as err:  # noqa: BLE001 - record it and go on with the next part
        results.error("environment", err)
    results.data["meta"]["mode"] = "quick" if args.quick else "shipped" if args.shipped else "full"
    if args.shipped:
        results.data["meta"]["tuned_table"] = shipped_table(device_name(torch.device(DEVICE)))
    results.data["meta"]["ms"] = list(ms)
    print(json.dumps(results.data["meta"]))
    results.data["meta"]["budget_s"] = args.budget_s
    seconds = results.data["meta"]["section_seconds"] = {}
    deadline = start + args.budget_s
    if args.jobs > 1:
        results.data["meta"]["precompile"] = precompile(args.jobs, args.quick, 0.6 * args.budget_s, ms, args.shipped)
    sections = [("copy bandwidth", lambda: copy_bandwidth(results)),
                ("correctness", lambda: correctness(results, args.quick or args.shipped))]
    passes = [tuple(M for M in ms if M in TARGET_MS), tuple(M for M in ms if M not in TARGET_MS)]
    sections += [(f"{model.name} {proj} M{','.join(map(str, group))}",
                  lambda m=model, p=proj, n=N, k=K, g=group: sweep_projection(results, m, p, n, k, args.quick, deadline, g, args.shipped))
                 for group in passes if group for model in models for proj, N, K in model.projections()]
    if not args.quick:
        sections.append(("decode variants", lambda: decode_variants(results)))
    for name, section in sections:
        t = time.monotonic()
        try:
            section()
        except Exception as err:  # noqa: BLE001 - record it and go on with the next part
            results.error(name, err)
            torch.cuda.empty_cache()
        seconds[name] = round(time.monotonic() - t, 1)
    results.data["meta"]["seconds"] = time.monotonic() - start
    results.save()
    print(render_markdown(results.data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
