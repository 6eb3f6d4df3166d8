"""Index the committed benchmark results: write results/README.md and README.md's results table from the files."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
RUN_FILES = ("results.json", "report.json")  # a folder holding one of these is one run: one row

# (pattern on the row's path under results/, what it measures, the script that writes it: in scripts/
# unless a folder is named); first match wins
SOURCES = (
    ("controller/controller_noise_one_gpu_both.*", "noise, isolated workers", "controller_noise.py"),
    ("controller/timing_probe.*", "timing probe; noise floor and candidate cost", "timing_probe.py"),
    ("engine/engine_ar_kernels.*", "AR decode: cuBLAS, Triton BF16, W12", "engine_ar.py --skip hf curve"),
    ("engine/steps/*", "AR decode by step configuration: projections, attention, compiled, PDL, vs byte floor",
     "engine_ar.py --skip hf curve kernels attention --steps cublas+sdpa cublas+split_kv+compiled "
     "cublas+split_kv+compiled+pdl triton_bf16+split_kv+compiled+pdl w12+split_kv+compiled+pdl (under timeout 200)"),
    ("engine/round_compile/*", "rounds eager vs draft_compile, and with verify_compile",
     "round_compile.py --system scripts/systems/d6k8n64.toml --prompts 3"),
    ("engine/round_kernels/*", "a round's kernels by family: draft proposal, verify forward; stock with and without "
     "rope_store (H100)",
     "families_fp8_tlv.sh e333039 round: round_kernels.py --tokens 128 --reps 10 --system stock "
     "scripts/systems/stock-rope-store.toml"),
    ("hybrid/ar_h100/*", "hybrid GDN target: AR vs byte floor by step configuration, profiled (H100)",
     "families_fp8_tlv.sh 3b3b9d8 hybrid_ar (HYBRID_STEPS='cublas+sdpa cublas+sdpa+compiled "
     "triton_bf16+split_kv+compiled+pdl+sync4'): hybrid_checks.py --skip ulp kernels --profile"),
    ("fixture/*", "fixture: loss, acceptance, decode", "tools/fixture_report.py"),
    ("drafters/*", "acceptance: DFlash, EAGLE-3, draft model (x1)", "train_drafters.sh"),
    ("serving/*", "continuous batching: throughput, latency", "specpilot bench --regime serving"),
    ("guard/*", "token-forcing guard", "guard_report.py"),
    ("loop/fixture-x16-batch/*", "the optimization loop, continuous regime",
     "loop_fixture.py --agents integration knob"),
    ("loop/fixture-x16-batch-c32/*", "the optimization loop, continuous regime at concurrency 32",
     "loop_fixture.py --max-candidates 2 --controller blocks=6 --controller noise_blocks=8"),
    ("loop/fixture-x16/*", "the optimization loop, batch 1, 4 rounds over two calls",
     "loop_fixture.py --agents integration knob --budget-minutes 8.8, then --resume --rounds 8 --budget-minutes 7.5"),
    ("loop/acceptance_check.*", "acceptance model: predicted vs measured tokens per round by tree shape (CPU)",
     "acceptance_check.py --n-prompts 2 --tokens 96"),
    ("loop/fixture-hybrid-x16/*", "the optimization loop on the hybrid GDN fixture, batch 1, H100, one call "
     "(source commit 3fac1ec; the report's own commit line reads the device copy's stale git, 0ad6634+dirty)",
     "families_fp8_tlv.sh 3fac1ec loop_hybrid: loop_fixture.py --deployment fixture-hybrid-x16 --budget-minutes 9.0"),
    ("families/h100/*", "Gemma/MoE decoders (random weights): AR vs byte floor, verify curve, experts read, top kernels (H100)",
     "families_checks.py --kernels"),
    ("families_fp8_tlv/*", "FP8 kernels vs byte floor, _scaled_mm, BF16 and FP8 vs BF16 AR; TLV on fixture-x16; "
     "sampled vs greedy EAGLE-3 speed (the current figures: part 4/); stock vs stock + rope_store over AR (4/) (H100)",
     "families_fp8_tlv.sh COMMIT sampling (first call); families_fp8_tlv.sh COMMIT gpu_tests fp8 hybrid_final "
     "tlv_b1 families (second call); families_fp8_tlv.sh e333039 sampling round (4/): the parts' logs"),
    ("hybrid/checks_h100/*", "hybrid GDN target: AR vs byte floor by step configuration, BF16 tree vs path (H100; "
     "the current AR figures are hybrid/ar_h100's)",
     "hybrid_checks.py (its kernels section failed there: hybrid/kernels_h100 is that run)"),
    ("hybrid/kernels_h100/*", "GDN conv + recurrence kernels vs the PyTorch reference and the byte floor (H100)",
     "gdn_kernels.py"),
    ("loop/*", "the optimization loop", "loop_fixture.py"),
    ("headline/headline.*", "headline table: AR, stock, final, DDTree per deployment", "headline.py"),
    ("headline/*", "speedup over AR: stock, the loop's final, baselines", "headline.py"),
    ("speed/summary*", "speed headline table", "headline.py (then speed_fixture.py)"),
    ("speed/fixture-x16-eagle3/*", "speedup over AR", "specpilot bench"),
    ("speed/*", "speedup over AR", "headline.py (then speed_fixture.py)"),
    ("w12/w12_kernels_shipped*", "W12 GEMM vs cuBLAS, shipped configs", "w12_kernels.py --shipped"),
    ("w12/w12_escape_cost.*", "cost of W12 escapes", "w12_escape_cost.py"),
    ("w12/w12_refine*", "tuned table vs n128 twins", "w12_refine.py --confirm"),
    ("w12/tree128/*", "W12 vs cuBLAS, 128-node tree, fixture-x16", "specpilot bench"),
    ("w12/paths/*", "W12's fastest path per shape beside cuBLAS BF16, the 128-node tree's shapes, installed",
     "w12_paths.py --system scripts/systems/tree-d7k8n128.toml --rows 1 129 --budget-s 40 --install"),
)

# provenance a file records wrongly, from the run logs: (path, commit it records, note); shown
# under the index while the file still records that commit, so a re-run drops its note
ERRATA = (
    ("engine/steps/engine_ar.{json,md}", "ed8baef", "ran on the working tree of f918326 (the device copy's base "
     "was the session's first commit); .md rendered from the .json by engine_ar.render (the call's timeout cut "
     "the run in its fifth configuration, before the script writes the .md)"),
    ("w12/w12_escape_cost.{json,md}", "b0c0d4e", "ran at 70e2a89 (b0c0d4e was a typo of the run command)"),
    ("w12/paths/w12_paths.{json,md}", "f6ef1ba", "ran on the working tree of 5953504 on an H100 (the device "
     "copy's base was the session's first commit)"),
    ("w12/tree128/", "b0f18c4", "ran on the working tree of a877aff after w12_paths.py --install (W12 and kernel "
     "code as at b0f18c4)"),
    ("loop/fixture-x16/", "defea74", "rounds 1-3 ran on the working tree of a877aff (the journal and memory "
     "resumed from it); round 4 and the final measurement at defea74, before aa294ef: its compiled rounds broke "
     "the traced graph at every forward"),
    ("engine/round_compile/round_compile.{json,md}", "defea74", "ran on the working tree of aa294ef (the "
     "device copy's base was the session's first commit)"),
    ("engine/round_kernels/round_kernels.{json,md}", "7acc78d+dirty", "ran on the working tree of e333039 (the "
     "device copy's base was an earlier session commit)"),
    ("loop/fixture-x16/", "b0f18c4+dirty", "rounds 1-3 ran on the working tree of a877aff before its "
     "verify_compile/Triton exclusion and its timed-outputs words; rounds 4-5 (--resume) before the exclusion, "
     "where the W12 candidate failed to compile"),
    ("engine/round_compile/round_compile.{json,md}", "b0f18c4", "ran on an earlier working tree of a877aff: the "
     "script was draft_compile.py, and profile.py timed every system's verify forward eager (the verify ms column)"),
    ("serving/fixture-x16-batch-c32/", "684c516", "ran on the working tree of 4ddf19c"),
    ("speed/fixture-x16-eagle3/", "684c516", "ran on the working tree of 4ddf19c"),
    ("loop/fixture-x16-batch/", "b358578+dirty", "round 1 ran on the working tree of 043281f, rounds 2-3 (--resume) "
     "on that of 909cec4 (the device copy's base was the session's first commit)"),
    ("loop/fixture-x16-batch-c32/", "b358578+dirty", "ran on the working tree of 043281f (the device copy's base "
     "was the session's first commit)"),
    ("families_fp8_tlv/*", "-", "sampling part at dc6a599; fp8 and tlv_b1 parts on the working tree of 4f05ddb "
     "(bench records dc6a599 (dirty): the device copy's base was the session's first commit); part 4/ on the "
     "working tree of e333039 (its round_bench records 7acc78d (dirty), the device copy's stale git)"),
    ("hybrid/kernels_h100/gdn_kernels.{json,md}", "b72f1c6+dirty", "ran on the working tree of 4fa8cf1 (the "
     "device copy's base was the session's first commit)"),
)

W12_TARGETS = ((1, 1.25), (32, 1.15))  # issue 3: W12 over cuBLAS at M=1 and M=32 (scripts/w12_kernels.py)


@dataclass(frozen=True)
class Entry:
    """One row of the index: a result (a JSON and its renderings) or a run folder, under results/."""

    path: str  # e.g. "w12/w12_kernels_shipped_4.{json,md}" or "speed/fixture/"
    data: Path | None  # the JSON file its provenance is read from


def entries(results: Path) -> list[Entry]:
    """Every result under `results`, files grouped by name stem, run folders as one row."""
    out: list[Entry] = []

    def walk(folder: Path) -> None:
        run = next((folder / n for n in RUN_FILES if (folder / n).is_file()), None)
        if run is not None and folder != results:
            out.append(Entry(f"{folder.relative_to(results).as_posix()}/", run))
            return
        stems: dict[str, list[Path]] = {}
        for p in sorted(folder.iterdir()):
            if p.is_dir():
                walk(p)
            elif p != results / "README.md":
                stems.setdefault(p.name.split(".")[0], []).append(p)
        for stem, files in sorted(stems.items()):
            base = (folder / stem).relative_to(results).as_posix()
            exts = [f.name[len(stem) + 1:] for f in files]
            path = f"{base}.{exts[0]}" if len(exts) == 1 else f"{base}.{{{','.join(exts)}}}"
            out.append(Entry(path, next((f for f in files if f.suffix == ".json"), None)))

    walk(results)
    return sorted(out, key=lambda e: e.path.rstrip("/"))


def source(path: str) -> tuple[str, str]:
    for pattern, what, script in SOURCES:
        if fnmatch.fnmatch(path, pattern):
            return what, script
    return "-", "-"


def provenance(data: dict) -> tuple[str, str, str]:
    """(date, commit, GPU) as the file records them, looking at its top level, then its
    provenance/environment/meta/deployment blocks and a provenance block inside one of them; '-'
    where it records none."""
    nested = ("provenance", "environment", "meta", "deployment")
    blocks = [data] + [data[k] for k in nested if isinstance(data.get(k), dict)]
    blocks += [b["provenance"] for b in blocks[1:] if isinstance(b.get("provenance"), dict)]  # e.g. meta.provenance

    def first(*keys):
        for block in blocks:
            for key in keys:
                value = block.get(key)
                if value and not (key == "device" and str(value).startswith(("cuda", "cpu"))):
                    return value
        return None

    date = first("date", "created", "created_at")
    commit = first("commit", "git_commit")
    gpu = first("gpus", "gpu", "device_name", "device")
    if commit:
        commit = str(commit).split("+")[0][:7] + ("+dirty" if "dirty" in str(commit) else "")
    if isinstance(gpu, list):
        gpu = gpu[0] if len(gpu) == 1 else f"{len(gpu)}x {gpu[0]}" if len(set(gpu)) == 1 else ", ".join(gpu)
    return (str(date)[:10] if date else "-"), commit or "-", gpu or "-"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def render_index(results: Path) -> str:
    lines = [
        "# Results",
        "",
        "Generated by `python scripts/results_index.py` from the files below; do not edit by hand.",
        "Date, commit and GPU are read from inside each JSON file (`-`: the file records none).",
        "Scripts are in `scripts/` unless a folder is named.",
        "Only the current result of each benchmark is kept, without plots its tables repeat; earlier runs,",
        "and one-off studies whose rule the code now states (naming the script that measures it), are in",
        "git history (under `bench/results/` before the move to `results/`).",
        "",
        "| path | benchmark | script | date | commit | GPU |",
        "|---|---|---|---|---|---|",
    ]
    errata = []
    for e in entries(results):
        what, script = source(e.path)
        date, commit, gpu = provenance(load(e.data)) if e.data else ("-", "-", "-")
        lines.append(f"| `{e.path}` | {what} | `{script}` | {date} | {commit} | {gpu} |")
        errata += [(pattern, note) for pattern, recorded, note in ERRATA
                   if fnmatch.fnmatch(e.path, pattern) and commit == recorded and (pattern, note) not in errata]
    if errata:
        lines += ["", "Provenance recorded wrongly (from the run logs):", ""]
        lines += [f"- `{pattern}` {note}" for pattern, note in errata]
    return "\n".join(lines) + "\n"


# --- the headline table: each function reads one file and returns its rows (label, value)

def ci(d: dict) -> str:
    if d.get("low") is None:  # too few units for an interval
        return f"{d['estimate']:.2f}x (n/a: {d.get('no_interval', 'no interval')})"
    return f"{d['estimate']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]"


def speed_rows(data: dict) -> list[tuple[str, str]]:
    c = data["config"]
    label = f"`{data['deployment']['name']}` speedup over AR (geomean, {c['level']:.0%} CI)"
    return [(label, ", ".join(f"{s['name']} {ci(s['geomean_speedup'])}" for s in data["systems"]))]


def acceptance_rows(data: dict) -> list[tuple[str, str]]:
    label = f"`{data['deployment']['name']}` mean accepted length per round (tokens per target forward)"
    return [(label, ", ".join(f"{s['name']} {s['mean_accepted_length']:.2f}" for s in data["systems"]))]


def serving_rows(data: dict) -> list[tuple[str, str]]:
    name = data["deployment"]["name"]
    rows = []
    for level in data["levels"]:
        by = {e["name"]: e for e in level["engines"]}
        scaling = by["ar"]["scaling"]
        parts = [f"AR {by['ar']['tokens_per_second']['estimate']:,.0f} tok/s"
                 + (f" ({ci(scaling)} of AR at the lowest concurrency)" if scaling else "")]
        parts += [f"{e['name']} {ci(e['speedup'])} over AR" for e in level["engines"] if e["name"] != "ar"]
        rows.append((f"`{name}` serving, concurrency {level['concurrency']}", "; ".join(parts)))
    return rows


def step_rows(data: dict) -> list[tuple[str, str]]:
    """The first step configuration (the baseline) and the fastest, against the BF16 byte floor."""
    floor, steps = data["floor_ms"]["all_parameters"], data["steps"]
    base = next(iter(steps))
    best = min(steps, key=lambda k: steps[k]["ms_per_step"])
    parts = [f"{k} {steps[k]['ms_per_step']:.2f} ms ({floor / steps[k]['ms_per_step']:.1%})"
             for k in dict.fromkeys((base, best))]
    return [("AR decode by step configuration, Qwen3-8B shapes, batch 1 (% of the BF16 byte floor)", "; ".join(parts))]


def compile_rows(data: dict) -> list[tuple[str, str]]:
    parts = []
    for pair in data["pairs"]:
        twin = pair["twins"][f"{pair['system']}+draft+verify"]
        parts.append(f"{pair['system']} {twin['speedup_ms_per_token']['mean']:.2f}x, draft proposal "
                     f"{twin['speedup_draft']['mean']:.2f}x (same outputs {twin['same_outputs']}/{pair['prompts']})")
    return [(f"`{data['deployment']}` ms/token, eager over draft_compile + verify_compile (batch 1)", ", ".join(parts))]


def paired_rows(data: dict) -> list[tuple[str, str]]:
    """Each system measured against another system in the same bench run (not AR)."""
    return [(f"`{data['deployment']['name']}` {s['name']} over {s['baseline']} (geomean, 95% CI)", ci(s["geomean_gain"]))
            for s in data["systems"] if s.get("baseline")]


def engine_kernel_rows(data: dict) -> list[tuple[str, str]]:
    k = data["kernels"]
    ratios = " / ".join(f"{k[b]['cublas']['ms_per_step'] / k[b]['w12_lm_head']['ms_per_step']:.2f}x" for b in k)
    return [(f"AR decode, W12 + lm_head over cuBLAS, batch {' / '.join(k)}", ratios)]


def controller_rows(data: dict) -> list[tuple[str, str]]:
    modes = data["modes"]
    keys = [k for k in ("variant", "placement") if len({m[k] for m in modes}) > 1] or ["placement"]
    value = ", ".join(f"{' '.join(m[k] for k in keys)} {m['noise']['value']:.2%}" for m in modes)
    gpus = len({d for m in modes for d in m["devices"]})
    return [(f"controller noise, isolated workers (code patches), {gpus} GPU{'s' if gpus > 1 else ''}", value)]


def probe_rows(data: dict) -> list[tuple[str, str]]:
    c = data["controller"]
    n = c["noise"]
    return [(f"controller noise, stock vs stock, default procedure (`{data['deployment']}`, shared worker)",
             f"{n['value']:.3%} over {n['blocks']} blocks (per-block spread {n['block_std']:.3%})"),
            ("knob candidate cost, guard included (median)",
             f"{c['candidate_wall_s_median']:.1f} s over {len(c['candidates'])} candidates")]


def guard_rows(data: dict) -> list[tuple[str, str]]:
    def rate(s):
        verdict = "" if s["verdict"] is None else " pass" if s["verdict"]["passed"] else " REJECT"
        return f"{s['name']} {s['forcing']['rate']:.3%}{verdict}"

    clean = [s for s in data["systems"] if not s["fault"]]
    faults = [s for s in data["systems"] if s["fault"]]
    return [("guard: token mismatch rate", ", ".join(map(rate, clean))),
            ("guard: injected faults, mismatch rate", ", ".join(map(rate, faults)))]


def w12_target_rows(data: dict) -> list[tuple[str, str]]:
    parts = []
    for m, target in W12_TARGETS:
        rows = [r for r in data["timings"] if r["M"] == m and "w12" in r.get("speedup_vs_cublas", {})]
        met = sum(r["speedup_vs_cublas"]["w12"] >= target for r in rows)
        parts.append(f"M={m} >= {target}x: {met} of {len(rows)}")
    return [("W12 GEMM over cuBLAS, projections meeting the target", "; ".join(parts))]


def hybrid_ar_rows(data: dict) -> list[tuple[str, str]]:
    ar = data.get("ar", {})
    steps = "; ".join(f"{k} {v['ms_per_step']:.2f} ms ({100 * v['fraction_of_floor']:.1f}%)"
                      for k, v in ar.items() if "ms_per_step" in v)
    return [(f"`{data['deployment']}` AR decode, batch 1 (% of its byte floor)", steps)] if steps else []


def hybrid_ulp_rows(data: dict) -> list[tuple[str, str]]:
    ulp = data.get("ulp", {})
    trees = ", ".join(f"N={n}: {v['max_ulps']} ulp" + (", states bit-equal" if v["states_bit_equal"] else "")
                      for n, v in ulp.items() if "max_ulps" in v)
    return [(f"`{data['deployment']}` BF16 tree verification vs the exact path computation (GDN layers)", trees)] if trees else []


def round_kernel_rows(data: dict) -> list[tuple[str, str]]:
    """A round's pieces per system, graph-replayed: draft proposal and verify forward, kernels launched."""
    parts = [f"{s['system']} {s['proposal']['graph_wall_us'] / 1e3:.2f} + {s['verify']['graph_wall_us'] / 1e3:.2f} ms "
             f"({s['proposal']['graph']['kernels_per_call']:.0f} kernels in the proposal)"
             for s in data["systems"]]
    return [(f"`{data['deployment']}` round pieces, draft proposal + verify forward (CUDA graphs)", "; ".join(parts))]


def loop_rows(data: dict) -> list[tuple[str, str]]:
    f = data["final"]
    if not f:  # the run skipped its final measurement: only the promotions' own gains, compounded
        return [(f"loop on `{data['deployment']['name']}`: final system over stock",
                 f"no final measurement; promotions' gains compounded +{100 * data['compounded_gain']:.1f}% "
                 f"({len(data['promotions'])} promoted, each with its own interval in the report)")]
    return [(f"loop on `{data['deployment']['name']}`: final system over stock",
             f"{ci(f['final_gain'])} (over AR: final {f['final_speedup']['estimate']:.2f}x,"
             f" stock {f['stock_speedup']['estimate']:.2f}x)")]


HEADLINES = (  # (file under results/, rows from it); a missing file is skipped
    ("speed/fixture/results.json", speed_rows),
    ("speed/fixture-x16/results.json", speed_rows),
    ("speed/fixture-x16-eagle3/results.json", speed_rows),
    ("drafters/fixture-x1/results.json", acceptance_rows),
    ("serving/fixture-x16-batch/results.json", serving_rows),
    ("serving/fixture-x16-batch-c32/results.json", serving_rows),
    ("loop/fixture-x16/report.json", loop_rows),
    ("loop/fixture-x16-batch/report.json", loop_rows),
    ("loop/fixture-x16-batch-c32/report.json", loop_rows),
    ("loop/fixture-hybrid-x16/report.json", loop_rows),
    ("hybrid/ar_h100/hybrid_checks.json", hybrid_ar_rows),
    ("hybrid/checks_h100/hybrid_checks.json", hybrid_ulp_rows),
    ("engine/steps/engine_ar.json", step_rows),
    ("engine/engine_ar_kernels.json", engine_kernel_rows),
    ("engine/round_compile/round_compile.json", compile_rows),
    ("engine/round_kernels/round_kernels.json", round_kernel_rows),
    ("w12/w12_kernels_shipped_4.json", w12_target_rows),
    ("w12/tree128/results.json", paired_rows),
    ("controller/timing_probe.json", probe_rows),
    ("controller/controller_noise_one_gpu_both.json", controller_rows),
    ("guard/guard_report.json", guard_rows),
)


def render_headlines(results: Path) -> str:
    lines = ["| result | measured | file |", "|---|---|---|"]
    for name, rows in HEADLINES:
        path = results / name
        if path.is_file():
            where = f"{results.name}/{name}"
            lines += [f"| {label} | {value} | `{where}` |" for label, value in rows(load(path))]
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str | None:
    """`text` with everything between the results markers replaced by `block`; None if the markers are absent."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[: start + len(BEGIN)] + "\n" + block + text[end:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if either file is stale")
    p.add_argument("--results", type=Path, default=REPO / "results", help="the results folder to index")
    p.add_argument("--readme", type=Path, default=REPO / "README.md", help="the README holding the results markers")
    a = p.parse_args(argv)
    index_path = a.results / "README.md"
    index = render_index(a.results)
    readme = a.readme.read_text()
    new_readme = replace_block(readme, render_headlines(a.results))
    if new_readme is None:
        print(f"{a.readme}: no {BEGIN} ... {END} markers; its results table is left untouched", file=sys.stderr)
    stale = [path for path, new, old in ((index_path, index, index_path.read_text() if index_path.is_file() else None),
                                         (a.readme, new_readme, readme)) if new is not None and new != old]
    if a.check:
        for path in stale:
            print(f"{path} is stale: run python scripts/results_index.py", file=sys.stderr)
        return 1 if stale or new_readme is None else 0
    index_path.write_text(index)
    if new_readme is not None and new_readme != readme:
        a.readme.write_text(new_readme)
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
