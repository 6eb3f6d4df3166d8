"""Re-time tuned configs against one alternative each ("twin"), side by side, and write the
table with the twins that won twice (GPU).

    python scripts/w12_refine.py --out DIR [--twin tma|n128] [--table PATH] [--rounds 5] [--min-gain 0.02]
    python scripts/w12_refine.py --out DIR2 --twin tma --confirm DIR/w12_refine.json   # a fresh re-timing

A sweep (`scripts/w12_kernels.py`) times each candidate about once and keeps the fastest, so its pick
is only as good as one timing, and a config its phases never reached is never timed. This script
checks one alternative per tuned entry with five rounds in alternating order, and a second process
(`--confirm`) times the adopted ones again; the table to ship is the confirming run's. Twins:

- `tma` (every GEMM entry that loads weights by cp.async): the same config with weight TMA. The
  same tile and sums, so the output must be bit-identical. The sweep's last phase
  (`specpilot.kernels.search.tma_final_variants`) gives weight TMA to its fastest configs only.
- `n128` (W12 entries of the 64-row bucket): the bucket's heuristic tile, n128 k128 w8 s3 at its
  one-wave split, with weights and x by TMA (results/w12/w12_refine_n128_confirm.md). Another
  tile: checked against the error bound only.

An entry adopts its twin when the twin's fastest round beats the entry's by `--min-gain` and it won
most paired rounds. Weights: rotating sets of the entry's shape, escapes on; x: the bucket's rows.

Writes OUT/w12_refine.json, OUT/w12_refine.md and OUT/tuned_<gpu>.json (the input table with the
adopted entries replaced).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.w12_kernels import MODELS, environment  # noqa: E402
from specpilot.kernels import configs as kc  # noqa: E402
from specpilot.kernels.configs import KernelPath, LaunchConfig, WeightFormat  # noqa: E402
from specpilot.kernels.dispatch import run_config  # noqa: E402
from specpilot.kernels.reference import error_bound  # noqa: E402
from specpilot.kernels.timing import random_weight, rotated_rounds, weight_sets  # noqa: E402
from specpilot.w12 import encode  # noqa: E402

Key = tuple[str, int, int, int]  # (format, M bucket, N, K), as in the tuned table


def load_table(path: Path) -> dict:
    """A tuned table's JSON ({"device", "entries": [...]}); a clear error if it is none."""
    try:
        table = json.loads(path.read_text())
        for e in table["entries"]:
            LaunchConfig.from_dict(e["config"])
        return table
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"error: {path}: not a tuned-config table ({type(err).__name__}: {err})") from None


N128 = LaunchConfig(KernelPath.GEMM, 128, 128, num_warps=8, num_stages=3, fit_wave=True, tma=True, tma_x=True)


def twin_of(kind: str, key: Key, cfg: LaunchConfig) -> LaunchConfig | None:
    """The alternative `kind` offers for the entry `key` -> `cfg`, or None where it has none."""
    if kind == "tma":
        return dataclasses.replace(cfg, tma=True) if cfg.path is KernelPath.GEMM and not cfg.tma else None
    if kind == "n128":
        return N128 if key[0] == WeightFormat.W12.value and key[1] == kc.RULE_MAX_M and cfg != N128 else None
    raise ValueError(f"no twin kind {kind!r}: one of {TWINS}")


TWINS = ("tma", "n128")
SAME_SUMS = {"tma": True, "n128": False}  # the twin sums the same products in the same order: bit-identical


def candidates(table: dict, kind: str, only: set[Key] | None = None) -> list[tuple[Key, LaunchConfig, LaunchConfig]]:
    """(key, config, twin) of the entries to re-time: those `kind` has a twin for (of `only`, if given)."""
    out = []
    for e in table["entries"]:
        key = (e["format"], e["m"], e["n"], e["k"])
        cfg = LaunchConfig.from_dict(e["config"])
        twin = twin_of(kind, key, cfg)
        if twin is not None and (only is None or key in only):
            out.append((key, cfg, twin))
    return out


def decide(runs: dict[str, list[float]], min_gain: float) -> bool:
    """Adopt the twin: its fastest round at least `min_gain` faster than the entry's fastest,
    and faster in more than half of the paired rounds."""
    tuned, twin = runs["tuned"], runs["twin"]
    wins = sum(b < a for a, b in zip(tuned, twin))
    return min(twin) <= (1.0 - min_gain) * min(tuned) and 2 * wins > len(tuned)


def replaced(table: dict, adopted: dict[Key, LaunchConfig], note: str) -> dict:
    """`table` with the adopted entries' configs replaced."""
    entries = []
    for e in table["entries"]:
        key = (e["format"], e["m"], e["n"], e["k"])
        entries.append({**e, "config": adopted[key].to_dict()} if key in adopted else e)
    return {**table, "entries": entries, "merged_from": [note, *(table.get("merged_from") or [table.get("device")])]}


def time_entry(key: Key, cfg: LaunchConfig, twin: LaunchConfig, sets: list, rounds: int) -> dict:
    fmt, M, N, K = key
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    exact, bound = error_bound(x, sets[0], torch.bfloat16)
    row = {"format": fmt, "m": M, "n": N, "k": K, "tuned": cfg.label(), "twin": twin.label()}
    try:
        a, b = run_config(x, sets[0], cfg), run_config(x, sets[0], twin)
        row["bit_identical"] = torch.equal(a.view(torch.int16), b.view(torch.int16))  # required where SAME_SUMS
        row["error_over_bound"] = float(((b.double() - exact).abs() / bound).max())
        arms = {"tuned": [lambda w=w: run_config(x, w, cfg) for w in sets],
                "twin": [lambda w=w: run_config(x, w, twin) for w in sets]}
        row["us"], row["runs"] = rotated_rounds(arms, rounds)
    except Exception as err:  # noqa: BLE001 - report and go on
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--twin", choices=TWINS, default="tma", help="the alternative each entry is timed against")
    p.add_argument("--table", type=Path, help="tuned table to refine (default: the shipped one of this GPU)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-gain", type=float, default=0.02)
    p.add_argument("--confirm", type=Path, metavar="JSON", help="re-time only the entries this earlier run adopted")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    path = args.table or kc.TUNED_DIR / f"{kc.device_slug(gpu)}.json"
    table = load_table(path)
    only = None
    if args.confirm:
        try:
            earlier = json.loads(args.confirm.read_text())
            earlier["adopted"], earlier["meta"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            p.error(f"{args.confirm}: not a w12_refine.py result ({type(err).__name__}: {err})")
        if earlier["meta"].get("twin", "tma") != args.twin:
            p.error(f"{args.confirm} timed --twin {earlier['meta'].get('twin', 'tma')}, not {args.twin}")
        only = {tuple(k) for k in earlier["adopted"]}
    todo = candidates(table, args.twin, only)
    names = {(N, K): f"{shape.name} {proj}" for shape in MODELS for proj, N, K in shape.projections()}
    data = {"meta": {**environment(), "table": str(path), "twin": args.twin, "rounds": args.rounds, "min_gain": args.min_gain,
                     "confirm": str(args.confirm) if args.confirm else None}, "rows": [], "adopted": []}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    adopted: dict[Key, LaunchConfig] = {}
    for fmt, N, K in dict.fromkeys((k[0], k[2], k[3]) for k, _, _ in todo):
        dense = fmt == WeightFormat.DENSE.value
        sets = [random_weight(N, K) if dense else encode(random_weight(N, K))
                for _ in range(weight_sets(N, K, N * K * (2 if dense else 1.5)))]
        for key, cfg, twin in ((k, c, t) for k, c, t in todo if (k[0], k[2], k[3]) == (fmt, N, K)):
            row = {"name": names.get((N, K), f"{N}x{K}"), **time_entry(key, cfg, twin, sets, args.rounds)}
            row["adopt"] = ("runs" in row and (row["bit_identical"] or not SAME_SUMS[args.twin])
                            and row["error_over_bound"] <= 1.0 and decide(row["runs"], args.min_gain))
            if row["adopt"]:
                adopted[key] = twin
                data["adopted"].append(list(key))
            data["rows"].append(row)
            print(row["name"], key, {k: round(v, 2) for k, v in row.get("us", {}).items()}, row.get("adopt"),
                  row.get("error", ""), flush=True)
            write(args.out, data, table, adopted, gpu)
        del sets
        torch.cuda.empty_cache()
    write(args.out, data, table, adopted, gpu)
    return 0


def write(out: Path, data: dict, table: dict, adopted: dict, gpu: str) -> None:
    (out / "w12_refine.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "w12_refine.md").write_text(render(data))
    note = f"w12_refine --twin {data['meta']['twin']} {data['meta'].get('git_commit')}"
    (out / f"tuned_{kc.device_slug(gpu)}.json").write_text(json.dumps(replaced(table, adopted, note), indent=1) + "\n")


def render(data: dict) -> str:
    m = data["meta"]
    lines = [f"# Tuned configs against their `{m['twin']}` twins (scripts/w12_refine.py --twin {m['twin']})", "",
             f"- {m['date']}, {m['gpu']}, commit {m['git_commit']}; table {m['table']}"
             + (f"; confirming {m['confirm']}" if m.get("confirm") else ""),
             f"- µs: fastest of {m['rounds']} rounds in alternating order over rotating weight sets, escapes on; "
             f"adopt: the twin at least {m['min_gain']:.0%} faster and faster in most paired rounds, within the error "
             "bound" + (", bit-identical (same: the twin's output equals the entry's)" if SAME_SUMS[m["twin"]] else ""), "",
             "| projection | format | M | tuned config | tuned µs | twin | twin µs | tuned / twin | twin won rounds | same | adopt |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "us" not in r:
            lines.append(f"| {r['name']} | {r['format']} | {r['m']} | {r['tuned']} | - | {r['twin']} | - | - | - | - | "
                         f"error: {r.get('error')} |")
            continue
        u, runs = r["us"], r["runs"]
        wins = sum(b < a for a, b in zip(runs["tuned"], runs["twin"]))
        lines.append(f"| {r['name']} | {r['format']} | {r['m']} | {r['tuned']} | {u['tuned']:.2f} | {r['twin']} | "
                     f"{u['twin']:.2f} | {u['tuned'] / u['twin']:.3f} | {wins}/{len(runs['twin'])} | {r['bit_identical']} | "
                     f"{'**yes**' if r['adopt'] else 'no'} |")
    lines += ["", f"adopted: {len(data['adopted'])} of {len(data['rows'])}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
