"""W12 against cuBLAS BF16 at every row count a deployment runs: the fastest W12 path per shape, tuned and cached.

    python scripts/w12_paths.py --deployment fixture-x16 --system scripts/systems/tree.toml --out DIR \
        [--rows 1 8 64 65 129 257] [--budget-s 300] [--install]

For the deployment's projections at the rows the system runs them
(`engine.round_shapes.deployment_shapes`: verification at batch x (tree_budget + 1) rows, drafting
at batch x topk, the prefill buckets up to 257 rows) and the target's projections at each of
--rows, it runs the kernel agent's tuning on the deployment's own weights in W12
(`kernels.shape_tuning.tune`: the package's config search up to `GEMM_MAX_M` rows, and cuBLAS on
the weight decoded at each call or kept decoded, each row count taking the fastest), then times
W12's best and cuBLAS on the plain BF16 weights side by side (CUDA-graph replays over rotating
copies of the weight beyond L2, median per timing; rounds in turns, fastest round per arm). A
shape's ratio is cuBLAS BF16 / W12's best, so timed: >= 1 where W12 is no slower. Writes
OUT/w12_paths.json and .md, and OUT/tuned_<gpu>.json (every shape's best W12 choice, the table the
dispatcher reads); --install merges that table into this machine's user cache
($SPECPILOT_HOME/kernels/<gpu>/).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.engine.round_shapes import deployment_shapes, projection_shapes  # noqa: E402
from specpilot.kernels.configs import Fallback, WeightFormat, device_slug  # noqa: E402
from specpilot.kernels.search import Problem  # noqa: E402
from specpilot.kernels.shape_tuning import ProjectionShape, ShapeTiming, choice_of, table_document, tune  # noqa: E402
from specpilot.kernels.timing import rotated_rounds  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 65, 96, 128, 129, 192, 256, 257)


def shapes_for(target, drafter, system, batch: int, rows: tuple[int, ...]) -> list[ProjectionShape]:
    """The system's own shapes, then the target's projections (and lm_head) at each of `rows`."""
    own = deployment_shapes(target, drafter, system, batch, system.tree_budget + 1, system.depth)
    extra = [ProjectionShape(f"{s.name}@{m}", s.m, s.n, s.k, s.count) for m in rows
             for s in projection_shapes(target, m, True)]
    return own + extra


def measure(shapes: list[ProjectionShape], w12_bench, bf16_bench, budget_s: float) -> tuple[list[dict], list]:
    """(rows of the results file, the W12 `ShapeTiming`s): each shape's W12 choice today and its
    best by the search, then that best and cuBLAS on the plain weights (`bf16_bench`, whose
    fallback path is plain F.linear) timed side by side (`rotated_rounds`: the same number of
    timings each, in turns), whose ratio the shape's row gives: the search's best is the fastest of
    several timings, and would look faster than one timing of cuBLAS on the same work. A row also
    keeps how far cuBLAS's own rounds fall apart (`cublas_spread`), the scale of a tie."""
    timings: list[ShapeTiming] = tune(shapes, w12_bench, budget_s, print)
    rows = []
    for t in timings:
        s = t.shape
        arms = {"cublas_bf16": bf16_bench.calls(Problem(WeightFormat.DENSE, s.n, s.k, s.m), Fallback.UNPACK_CUBLAS),
                "w12": w12_bench.calls(Problem(WeightFormat.W12, s.n, s.k, s.m), choice_of(t.best))}
        try:
            side, runs = rotated_rounds(arms)
        except Exception as err:  # noqa: BLE001 - a shape whose side-by-side fails is reported, not raised
            print(f"{s.name}@{s.m}: side-by-side timing failed: {err}")
            side, runs = {}, {}
        cublas, w12 = side.get("cublas_bf16"), side.get("w12")
        # cuBLAS's own rounds on the same work: how far apart two timings of one arm fall
        spread = max(runs["cublas_bf16"]) / min(runs["cublas_bf16"]) - 1 if runs.get("cublas_bf16") else None
        rows.append({"name": s.name, "M": s.m, "N": s.n, "K": s.k, "w12_today": t.current, "w12_today_us": t.current_us,
                     "w12_best": t.best, "w12_best_us": t.best_us, "w12_side_us": w12, "cublas_bf16_us": cublas,
                     "cublas_spread": spread, "ratio": cublas / w12 if cublas and w12 else None})
    return rows, timings


def render(rows: list[dict], meta: dict) -> str:
    """The results as a markdown table, slowest W12 ratio first."""
    def label(choice: dict) -> str:
        return choice.get("path") if "block_n" not in choice else \
            f"{choice['path']} n{choice['block_n']} k{choice['block_k']} w{choice['num_warps']}"

    lines = [f"# W12 paths against cuBLAS BF16 ({meta.get('gpu')}, {meta.get('deployment')}, {meta.get('system')})",
             "", "| shape | M | N | K | W12 today us | W12 best us (search) | best path | W12 best us (side by side) | "
             "cuBLAS BF16 us (side by side) | cuBLAS / W12 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["ratio"] if r["ratio"] is not None else 0.0):
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        cublas = f"{r['cublas_bf16_us']:.1f}" if r["cublas_bf16_us"] is not None else "-"
        side = f"{r['w12_side_us']:.1f}" if r.get("w12_side_us") is not None else "-"
        lines.append(f"| {r['name']} | {r['M']} | {r['N']} | {r['K']} | {r['w12_today_us']:.1f} | "
                     f"{r['w12_best_us']:.1f} | {label(r['w12_best'])} | {side} | {cublas} | {ratio} |")
    slower = [r for r in rows if r["ratio"] is not None and r["ratio"] < 1.0]
    beyond = [r for r in slower if r.get("cublas_spread") is not None and r["ratio"] < 1.0 - r["cublas_spread"]]
    lines += ["", f"W12 slower than cuBLAS BF16 on {len(slower)} of {len(rows)} shapes; by more than cuBLAS's own "
              f"rounds differ from each other on {len(beyond)}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deployment", default="fixture-x16", help="deployment name or TOML file")
    p.add_argument("--system", default="stock", help="system TOML (its tree sets the verification rows), or stock")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="extra target row counts to time")
    p.add_argument("--budget-s", type=float, default=300.0, help="seconds of config search (later shapes: defaults)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--install", action="store_true", help="merge the table into this machine's user cache")
    args = p.parse_args(argv)

    import torch

    from specpilot.config import load_deployment, load_system
    from specpilot.engine.profile import bandwidth_gbps
    from specpilot.engine.round_shapes import is_drafter_shape, projection_weight
    from specpilot.engine.session import Session
    from specpilot.kernels import user_cache
    from specpilot.kernels.shape_tuning import GpuKernelBench

    dep = load_deployment(args.deployment)
    system = load_system(args.system, dep)
    session = Session.load(dep, "cuda")
    bw = bandwidth_gbps(session.device)
    drafter = session.drafter_model
    weight = partial(projection_weight, [m for m in (session.target, drafter) if m is not None])
    w12 = GpuKernelBench(weight, session.target.device, True, bw, cublas=is_drafter_shape)  # the drafter: cuBLAS
    bf16 = GpuKernelBench(weight, session.target.device, False, bw, cublas=lambda shape: True)
    shapes = shapes_for(session.target.config, drafter.config if drafter is not None else None, system,
                        dep.regime.batch, tuple(args.rows))
    rows, timings = measure(shapes, w12, bf16, args.budget_s)
    meta = {"gpu": w12.device_name, "deployment": dep.name, "system": system.name, "torch": torch.__version__,
            "versions": user_cache.versions(), "budget_s": args.budget_s, "rows": list(args.rows),
            "provenance": capture(session.device, session.target.dtype)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "w12_paths.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (args.out / "w12_paths.md").write_text(render(rows, meta))
    slug = device_slug(w12.device_name)
    table = table_document(w12.device_name, WeightFormat.W12.value, {}, timings, every=True)
    (args.out / f"tuned_{slug}.json").write_text(json.dumps(table, indent=1) + "\n")
    if args.install:
        path = user_cache.write_document(user_cache.candidate_path(slug, "w12_paths"), table)
        print(f"installed into {user_cache.promote(path, slug)}")
    print((args.out / "w12_paths.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
