"""GPU benchmark of the W12 and plain-BF16 projection kernels against cuBLAS BF16, and the sweep
that writes the tuned table.

    python scripts/w12_kernels.py --out DIR [--quick | --shipped] [--budget-s 330] [--ms M ...]

On one CUDA GPU, for every projection of Qwen3-8B and Qwen3-32B (qkv fused, o, gate_up fused,
down, lm_head) at M = 1, 2, 4, 8, 16, 32, 64 rows it times cuBLAS (`F.linear`), our BF16 kernel and
our W12 kernel, each kernel over the configs of the package's search (`specpilot.kernels.search`:
the candidates, then its phases). Every config is first checked against the reference (decode,
then a float32 matmul) under the error bound of `specpilot.kernels.reference.error_bound`; a
config that fails is reported and never timed. Timing (`specpilot.kernels.timing`): >= 4 rotating
weight sets (together >= 3x L2), random normal BF16 weights of std 0.02 (no zeros), calls captured
in a CUDA graph and timed with CUDA events, median over replays; after the sweep of a row, cuBLAS
and each kernel's best config are timed three more rounds side by side (rotated order) and every
arm reports its fastest timing. Reported: µs per call, achieved TB/s on the bytes a call must move
(weights incl. every W12 metadata byte, activations, output), fraction of the measured copy
bandwidth, and speedup over cuBLAS.

Writes, as it goes, into --out: w12_kernels.json (all data), w12_kernels.md (tables, targets) and
tuned_<gpu>.json (best config per format, M bucket, N, K; copy it to specpilot/kernels/tuned/ to
make the dispatcher use it). Each section runs in try/except, so a failure costs only that part.
The config sweep stops (default configs only) once --budget-s has elapsed; projections are
visited twice, first at the target rows M = 1 and 32 for every projection, then at the other M, so
the budget goes to the targets first.

With --shipped there is no sweep: every row times the config the dispatcher picks on this GPU
(`configs.choose_config`: the shipped tuned table's entry, else the heuristic) and the heuristic,
and reports the shipped one's time -- what the engine runs, measured in one run for every row
(results/w12/w12_kernels_shipped_4.md). No tuned table is written then.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
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
from specpilot.kernels.configs import LaunchConfig, WeightFormat  # noqa: E402
from specpilot.kernels.dispatch import device_name, run_config  # noqa: E402
from specpilot.kernels.launch import sm_count  # noqa: E402
from specpilot.kernels import user_cache  # noqa: E402
from specpilot.kernels.search import (  # noqa: E402
    RUN_KEYS,
    Problem,
    SearchSettings,
    correctness_configs,
    merge_tuned,
    search_problem,
    sweep_binaries,
    sweep_configs,
    tune,
    tuned_document,
)
from specpilot.kernels.timing import (  # noqa: E402
    WEIGHT_STD,
    GraphTimer,
    failure,
    graph_time_us,
    random_weight,
    rotated_rounds,
    warm_clocks,
    weight_sets,
)
from specpilot.w12 import decode, encode  # noqa: E402
from specpilot.w12.layout import bits_to_bf16  # noqa: E402

M_ORDER = (1, 32, 8, 64, 2, 4, 16, 128)  # the targets first, in case the budget runs out; 128: verify trees
TARGET_MS = (1, 32)  # swept for every projection before any other M
DEVICE = "cuda"
# (N, K, M values, check every candidate config?): a shape every candidate tiles evenly (so its
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
        self.best: dict[tuple, LaunchConfig] = {}  # table key -> the fastest config of the row

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
        slug = kc.device_slug(self.data["meta"].get("gpu", "gpu"))
        table = tuned_document(self.data["meta"].get("gpu"), self.best)
        (self.out / f"tuned_{slug}.json").write_text(json.dumps(table, indent=1) + "\n")


def git_commit() -> str:
    if os.environ.get("SPECPILOT_COMMIT"):  # set it when the copy's .git may be stale
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
                row.update(ok=False, error=failure(err))
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
            checker = GraphTimer(lambda p: [weights[p.fmt]], lambda p, x=x: x)
            for fmt in weights:
                for cfg in correctness_configs(M, all_configs and not quick):
                    trial = checker.check(Problem(fmt, N, K, M), cfg)
                    row = {"case": f"escape-heavy {N}x{K}", "M": M, "format": fmt.value, "config": cfg.label()}
                    worst = trial.worst_error_over_bound
                    if worst is None:  # it raised
                        row.update(ok=False, error=trial.error)
                    else:
                        row.update(worst_error_over_bound=worst, ok=worst <= 1.0)
                    results.data["correctness"].append(row)
                    if not row["ok"]:
                        print("CORRECTNESS FAILURE", row, file=sys.stderr)
    results.save()


# -- timing sweep -----------------------------------------------------------------------------
FINAL_ROUNDS = 3


def final_rounds(row: dict, x, cublas_runs: list, cublas: list, dense: list, w12: list) -> None:
    """Time cuBLAS and the best config of each kernel FINAL_ROUNDS more times, side by side, each
    round in another order; every arm then reports its fastest timing (cuBLAS over these and its
    runs before and after the sweep, a kernel over these and its sweep timing): a run's first
    timings of a kernel can be slow, so one timing per config would compare a cold kernel with a
    warm baseline."""
    arms = {"cublas": (cublas_runs, cublas)} if cublas_runs else {}
    for key, sets in (("bf16_kernel", dense), ("w12", w12)):
        best = (row.get(key) or {}).get("best_config")
        if best:
            cfg = next(LaunchConfig.from_dict(t["config"]) for t in row[key]["tried"] if t["label"] == best)
            runs = row[key].setdefault("best_runs", [row[key]["best_us"]])
            arms[key] = (runs, [lambda w=w, c=cfg: run_config(x, w, c) for w in sets])
    if len(arms) > 1:
        _, rounds = rotated_rounds({key: calls for key, (_, calls) in arms.items()}, FINAL_ROUNDS)
        for key, (runs, _) in arms.items():
            runs += rounds[key]
    for key, (runs, _) in arms.items():
        if key != "cublas":
            row[key]["best_us"] = min(runs)


def shipped_config(fmt: WeightFormat, M: int, N: int, K: int) -> LaunchConfig:
    """What the dispatcher runs for this projection on this GPU: the shipped tuned entry, else the heuristic
    (`dispatch.linear`'s own choice, with its own device-name lookup)."""
    return kc.choose_config(fmt, M, N, K, device_name(torch.device(DEVICE)))


def shipped_table(gpu_name: str) -> str:
    """Which tuned table a --shipped run times on this GPU, for the report."""
    slug = kc.device_slug(gpu_name)
    shipped, cached = kc.shipped_table(slug), user_cache.read_document(user_cache.cache_path(slug))
    over = (f", under {len(cached['entries'])} entries of the user cache {user_cache.cache_path(slug)}"
            if cached else "")
    if not shipped and not cached:
        return f"none for {gpu_name!r}: every row runs the heuristic config"
    return f"specpilot/kernels/tuned/{slug}.json ({len(shipped)} entries){over}"


def search_row(N: int, K: int, M: int, timer: GraphTimer, quick: bool, started: float, budget_s: float,
               shipped: bool) -> dict[str, dict]:
    """{RUN_KEYS[format]: result} of both formats at M rows: the package's search within the
    budget, or with --shipped the dispatcher's config and the heuristic, the former reported."""
    problems = [Problem(f, N, K, M) for f in (WeightFormat.DENSE, WeightFormat.W12)]
    sms = sm_count(torch.device(DEVICE))
    if not shipped:
        found = tune(problems, timer, SearchSettings(budget_s=budget_s, sweep=not quick, sm_count=sms), started=started)
        return {RUN_KEYS[r.problem.fmt]: r for r in found}
    out = {}
    for p in problems:
        chosen = shipped_config(p.fmt, M, N, K)
        r = search_problem(p, timer, sweep=False, sm_count=sms, first=[chosen])
        mine = next((t for t in r.tried if t.config == chosen and t.us is not None), None)
        out[RUN_KEYS[p.fmt]] = dataclasses.replace(r, best=mine)  # the dispatcher's config, however it did
    return out


def sweep_projection(results: Results, model: ModelShape, proj: str, N: int, K: int, quick: bool,
                     started: float, budget_s: float, ms: tuple[int, ...], shipped: bool = False) -> None:
    dense_sets = weight_sets(N, K, N * K * 2)
    dense = [random_weight(N, K) for _ in range(dense_sets)]
    w12 = [encode(dense[i % dense_sets]) if i < dense_sets else encode(random_weight(N, K))
           for i in range(weight_sets(N, K, N * K * 1.5))]
    sets = {WeightFormat.DENSE: dense, WeightFormat.W12: w12}
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
            row["cublas_error"] = failure(err)
        timer = GraphTimer(lambda p: sets[p.fmt], lambda p, x=x: x)
        for key, found in search_row(N, K, M, timer, quick, started, budget_s, shipped).items():
            row[key] = found.to_dict()
            if shipped:
                row[key]["shipped_config"] = shipped_config(found.problem.fmt, M, N, K).label()
            if found.best:
                results.best[found.problem.table_key] = found.best.config
        del timer  # its error bounds
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
            problem = Problem(WeightFormat.W12, N, K, M)
            timers = {"clean": GraphTimer(lambda p: clean, lambda p: x), "dirty": GraphTimer(lambda p: dirty, lambda p: x)}
            cfg = kc.heuristic_config(M)
            portable = dataclasses.replace(cfg, ptx_decode=False)
            row = {"proj": proj, "N": N, "K": K, "M": M, "config": cfg.label(),
                   "escapes_per_row": {"clean": clean[0].num_escapes / N, "dirty": dirty[0].num_escapes / N},
                   "bits_per_weight": {"clean": clean[0].bits_per_weight, "dirty": dirty[0].bits_per_weight}}
            for name, sets, c in (("ptx", "clean", cfg), ("portable", "clean", portable), ("ptx_1_escape_per_row", "dirty", cfg)):
                row[name] = timers[sets](problem, c).to_dict()
            results.data["decode_variants"].append(row)
            print(f"variants {proj} M={M}: " + ", ".join(f"{k} {row[k].get('us', float('nan')):.2f} us"
                                                          for k in ("ptx", "portable", "ptx_1_escape_per_row")))
            del timers
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
                else:
                    configs = sweep_configs(M, False) if quick else sweep_binaries(M)
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
    if args.jobs > 1:
        results.data["meta"]["precompile"] = precompile(args.jobs, args.quick, 0.6 * args.budget_s, ms, args.shipped)
    sections = [("copy bandwidth", lambda: copy_bandwidth(results)),
                ("correctness", lambda: correctness(results, args.quick or args.shipped))]
    passes = [tuple(M for M in ms if M in TARGET_MS), tuple(M for M in ms if M not in TARGET_MS)]
    sections += [(f"{model.name} {proj} M{','.join(map(str, group))}",
                  lambda m=model, p=proj, n=N, k=K, g=group:
                  sweep_projection(results, m, p, n, k, args.quick, start, args.budget_s, g, args.shipped))
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
