"""Headline tables: AR, stock, the loop's final system (and baselines such as DDTree) per deployment, on the GPU.

    python scripts/headline.py --dry-run                       # check files, rows and systems; no model loaded
    python scripts/headline.py --max-seconds 540               # measure the rows that fit; repeat to finish
    python scripts/headline.py --per-set --max-seconds 540     # one set per bench run: long rows over calls
    python scripts/headline.py --row fixture-x16@b1 --final fixture-x16=results/loop/fixture-x16 \\
        --baseline ddtree=scripts/systems/ddtree-b64.toml --n-prompts 5 --out /tmp/headline

A row is DEPLOYMENT@REGIME: `b1` = one request at a time (bench's --batch 1), `bN` = static batches of
N prompts, `batched` = the deployment's regime batch if above 1, else 8 (the slots of
fixture-x16-batch). The batched regime is `specpilot bench`'s static batching (--batch N, the
unit of timing being the batch), not its continuous-batching serving regime, whose results have
another shape. Each row is one `specpilot bench` run: AR, the deployment's stock, the final system
and the baselines decode the same prompts interleaved in one process, stock first, so bench's own
gain figures give final / stock; final / baseline comes from bench's `summarise` over the same
measurements with the baseline first (the same statistics, the same bootstrap).

The final system of a row is `--final ROW=PATH` (ROW a deployment name or DEPLOYMENT@REGIME, the
more specific winning; PATH a loop run directory, whose report.json `final_system` knobs are laid
over the deployment's stock, or a system TOML). Defaults: for @b1 results/loop/<deployment>/, for a
batched regime results/loop/<deployment>-batch/, where they exist; a row without one times AR and
stock (and baselines) only. A final with a code patch (`has_patch`) is refused: its knobs alone are
not the system.

Defaults: the issue-57 rows whose deployment files exist (DEFAULT_ROWS), 2048 new tokens with EOS
ignored (--no-ignore-eos stops at EOS; the table header says which), the deployment's prompts per
set at b1 (10) and enough for 5 timed batches per set when batched (40 at batch 8), and a DDTree-64
baseline (scripts/systems/ddtree-b64.toml) on fixture-x32@b1, the article's "1.84x over DDTree at
one request" row.

Resumable over device calls of at most 10 minutes: a row whose OUT/<row>/results.json exists and
was measured with the requested config (deployment, sets, prompts, tokens, batch, EOS, seed,
sampling and every system's fingerprint) is skipped; one measured with another config is refused
unless --overwrite. With --max-seconds, no row is started whose estimate would not fit in what is
left: estimate = LOAD_SECONDS + AR seconds per token x tokens x (1 + 2/3 per system), the AR time
per token read from an earlier results.json of the same deployment and batch in OUT, else guessed
from the target's bytes streamed at GUESS_BANDWIDTH per decode step. A bench run is atomic: a row
that cannot finish within one call (fixture-x32@b1 at 2048 tokens x 10 prompts x 5 sets is ~100k AR
tokens at ~8-11 ms each on an H100, over 15 minutes for AR alone) takes --per-set: one bench run per
set (OUT/<row>/<set>/, loading the model once per set), merged into OUT/<row>/results.* by bench's
`summarise` once every set is in, the numbers a single run over the same measurements would give
(each set is its own stratum of the bootstrap, and the resampling is seeded by the set sizes). Even a
set at 2048 x 10 prompts with three systems is ~7-9 minutes there: --n-prompts 5 (the fewest that
give intervals) halves it.

Writes OUT/<deployment>@b<N>/{results.json,results.md,speedup.png,accept_hist.png} per row, and
OUT/headline.{md,json} after every row and at the end: one line per row (rows not yet measured
marked so), with the article's figures beside the rows it has a counterpart for (ARTICLE).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = ("fixture-x16@b1", "fixture-x16@batched", "fixture-x32@b1", "fixture-x32@batched",
                "fixture-x32-eagle3@b1", "fixture-x32-eagle3@batched")
DEFAULT_BASELINES = ("fixture-x32@b1:ddtree=scripts/systems/ddtree-b64.toml",)
DEFAULT_MAX_NEW_TOKENS = 2048
DEFAULT_BATCHED = 8  # fixture-x16-batch's slots
MIN_BATCHES = 5  # timed batches per set below which bench gives no interval (stats.MIN_UNITS)
FINAL = "final"
LOAD_SECONDS = 90.0  # loading, widening, warm-up and graph capture: a guess
GUESS_BANDWIDTH = 2.5e12  # bytes per second one decode step streams, no earlier run to read: a guess
SYSTEM_SHARE = 2 / 3  # a system's time as a share of AR's, in the estimate

# The article (../shared/seed/000_d598d0812d72f95f.txt, its headline table: geometric means over the
# five sets at 2048 new tokens, greedy) beside the row that plays the same part here.
ARTICLE = {
    ("fixture-x32", 1): "Qwen3.8-27B + DSpark, H100: stock 3.74x, SpecPilot 9.41x",
    ("fixture-x32", 8): "Qwen3.8-27B FP8 + DFlash2, H100 batch: stock 2.02x, SpecPilot 3.90x",
    ("fixture-x32-eagle3", 1): "Gemma-4-12B + EAGLE-3: stock 0.68x, SpecPilot 2.09x",
    ("fixture-x16", 1): "Qwen3.5-4B + DFlash2: stock 1.51x, SpecPilot 3.77x",
    ("fixture-x16-dflash", 1): "Qwen3.5-4B + DFlash2: stock 1.51x, SpecPilot 3.77x",
}
ARTICLE_DDTREE = "SpecPilot 1.84x over DDTree (H100, one request)"


@dataclass(frozen=True)
class Row:
    """One line of the table: a deployment at a batch size, its systems and bench config."""

    deployment: object  # specpilot.config.Deployment
    batch: int
    systems: tuple  # stock, then final (if any), then baselines
    config: object  # BenchConfig
    final_source: str | None
    baselines: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.deployment.name}@b{self.batch}"

    def parts(self, per_set: bool) -> list[tuple[str, object]]:
        """(folder under OUT, BenchConfig) of each bench run the row takes: itself, or one per set."""
        if not per_set:
            return [(self.name, self.config)]
        return [(f"{self.name}/{s}", replace(self.config, sets=(s,))) for s in self.config.sets]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", action="append", dest="rows", metavar="DEPLOYMENT[@REGIME]",
                   help="a row, repeatable; REGIME b1 (default), bN or batched (default: the issue's rows "
                        f"whose files exist: {' '.join(DEFAULT_ROWS)})")
    p.add_argument("--final", action="append", default=[], metavar="ROW=PATH",
                   help="the final system of a row (ROW a deployment or DEPLOYMENT@REGIME): a loop run "
                        "directory (report.json's final_system) or a system TOML; repeatable (default: "
                        "results/loop/<deployment>/ at b1, results/loop/<deployment>-batch/ batched)")
    p.add_argument("--baseline", action="append", metavar="[ROW:]NAME=SYSTEM_TOML",
                   help="a baseline system timed beside the others, on every row or on ROW only, with final / "
                        f"baseline in the table; repeatable (default: {' '.join(DEFAULT_BASELINES)})")
    p.add_argument("--no-baselines", action="store_true", help="no baseline columns (drops the default)")
    p.add_argument("--n-prompts", type=int,
                   help=f"prompts per set (default: the deployment's at b1; batched, {MIN_BATCHES} batches per set)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"new tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="decode exactly --max-new-tokens through any EOS (default on; --no-ignore-eos stops at EOS)")
    p.add_argument("--sets", nargs="+", help="benchmark sets (default: the deployment's five)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--per-set", action="store_true",
                   help="measure each row one set per bench run (OUT/<row>/<set>/), merged into OUT/<row>/ by "
                        "bench's summarise once every set is in: rows too long for one call")
    p.add_argument("--max-seconds", type=float,
                   help="start no bench run (a row, or with --per-set a set) whose estimate does not fit in what is "
                        "left of this many seconds (default: no limit)")
    p.add_argument("--device", default="cuda", help="device (default cuda)")
    p.add_argument("--out", default=str(REPO / "results" / "headline"), help="output folder (default results/headline)")
    p.add_argument("--overwrite", action="store_true", help="re-measure rows measured with another config")
    p.add_argument("--dry-run", action="store_true",
                   help="check deployments, systems, prompts and earlier results, print the plan, load no model")
    return p.parse_args(argv)


def split_row(spec: str) -> tuple[str, str]:
    """'DEPLOYMENT@REGIME' -> (deployment, regime); the regime defaults to b1."""
    dep, at, regime = spec.rpartition("@")
    return (dep, regime) if at else (spec, "b1")


def batch_of(regime: str, deployment) -> int:
    from specpilot.errors import ConfigError

    if regime == "batched":
        return deployment.regime.batch if deployment.regime.batch > 1 else DEFAULT_BATCHED
    if regime.startswith("b") and regime[1:].isdigit() and int(regime[1:]) >= 1:
        return int(regime[1:])
    raise ConfigError(f"row regime {regime!r}: expected b1, bN or batched")


def final_system(path: str, deployment):
    """(System named FINAL, description) from a loop run directory or a system TOML."""
    from specpilot.config import load_system
    from specpilot.errors import ConfigError

    p = Path(path)
    shown = p.resolve().relative_to(REPO) if p.resolve().is_relative_to(REPO) else p
    if p.is_dir():
        report = p / "report.json"
        if not report.is_file():
            raise ConfigError(f"final {path}: a directory without report.json (not a loop run)")
        fs = json.loads(report.read_text())["final_system"]
        if fs.get("has_patch"):
            raise ConfigError(f"final {path}: the final system {fs['name']!r} carries a code patch; its knobs alone "
                              "are not the system")
        system = deployment.stock.with_knobs(fs["knobs"], FINAL)
        deployment.check_format(system, str(report))
        return system, f"{shown} ({fs['name']})"
    if p.is_file():
        return load_system(path, deployment).with_changes(name=FINAL), str(shown)
    raise ConfigError(f"final {path}: neither a loop run directory nor a system file")


def parse_assignments(items, what: str) -> list[tuple[str, str]]:
    from specpilot.errors import ConfigError

    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--{what} {item!r}: expected {'ROW=PATH' if what == 'final' else '[ROW:]NAME=FILE'}")
        out.append((key, value))
    return out


def plan(args) -> list[Row]:
    """The rows, validated (ConfigError on bad input, before any model loads)."""
    from specpilot.bench.runner import BenchConfig, systems_under_test
    from specpilot.config import load_deployment, load_system, shipped_deployments_dir
    from specpilot.errors import ConfigError

    specs = args.rows
    if not specs:  # the rows whose deployment files exist
        specs = [s for s in DEFAULT_ROWS if (shipped_deployments_dir() / f"{split_row(s)[0]}.toml").is_file()]
    parsed = []
    for spec in specs:
        dep_spec, regime = split_row(spec)
        dep = load_deployment(dep_spec)
        parsed.append((dep_spec, regime, dep, batch_of(regime, dep)))
    finals = dict(parse_assignments(args.final, "final"))
    keys = {k for d, r, dep, b in parsed for k in (d, dep.name, f"{d}@{r}", f"{dep.name}@{r}", f"{dep.name}@b{b}")}
    baselines = [] if args.no_baselines else parse_assignments(args.baseline or DEFAULT_BASELINES, "baseline")
    if not args.baseline:  # the default's row may not be planned
        baselines = [(k, v) for k, v in baselines if k.rpartition(":")[0] in keys]
    for key in list(finals) + [k.rpartition(":")[0] for k, _ in baselines if ":" in k]:
        if key not in keys:
            raise ConfigError(f"{key!r} names no row (rows: {', '.join(specs)})")
    rows = []
    for dep_spec, regime, dep, batch in parsed:
        mine = (f"{dep.name}@b{batch}", f"{dep_spec}@{regime}", f"{dep.name}@{regime}", dep_spec, dep.name)
        path = next((finals[k] for k in mine if k in finals), None)
        if path is None:  # the loop run of this deployment and regime, where there is one
            loop = REPO / "results" / "loop" / (dep.name if batch == 1 else f"{dep.name}-batch")
            path = str(loop) if (loop / "report.json").is_file() else None
        final = final_system(path, dep) if path else None
        extra = []
        for key, file in baselines:
            row_key, _, name = key.rpartition(":")
            if row_key and row_key not in mine:
                continue
            file = file if Path(file).is_absolute() or Path(file).exists() else str(REPO / file)
            extra.append(load_system(file, dep).with_changes(name=name))
        systems = (*systems_under_test(["stock"], dep), *([final[0]] if final else []), *extra)
        names = [s.name for s in systems]
        if len(set(names)) != len(names):
            raise ConfigError(f"row {dep.name}@b{batch}: systems need distinct names, got {', '.join(names)}")
        n_prompts = args.n_prompts or (dep.n_prompts if batch == 1 else
                                       max(MIN_BATCHES * batch, -(-dep.n_prompts // batch) * batch))
        config = BenchConfig.for_deployment(dep, n_prompts=n_prompts, max_new_tokens=args.max_new_tokens,
                                            sets=tuple(args.sets) if args.sets else None, batch=batch,
                                            resamples=args.resamples, ignore_eos=args.ignore_eos)
        rows.append(Row(dep, batch, systems, config, final[1] if final else None, tuple(s.name for s in extra)))
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ConfigError(f"rows repeat: {', '.join(names)}")
    return rows


def expected(row: Row, config=None) -> dict:
    """What a results.json must record to count as `row` (or its part of `config`) measured."""
    c = (config or row.config).to_dict()
    return {"deployment": row.deployment.name,
            "config": {k: c[k] for k in ("sets", "n_prompts", "max_new_tokens", "batch", "seed", "ignore_eos",
                                         "sampling")},
            "systems": [[s.name, s.fingerprint()] for s in row.systems]}


def recorded(doc: dict) -> dict:
    c = doc["config"]
    return {"deployment": doc["deployment"]["name"],
            "config": {k: c.get(k) for k in ("sets", "n_prompts", "max_new_tokens", "batch", "seed", "ignore_eos",
                                              "sampling")},
            "systems": [[s["name"], s["fingerprint"]] for s in doc["systems"]]}


def load_results(out: Path, folder: str) -> dict | None:
    path = out / folder / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def status(out: Path, row: Row, folder: str | None = None, config=None) -> str:
    """'done' (measured with this config), 'stale' (with another) or 'todo': the row, or one part of it."""
    doc = load_results(out, folder or row.name)
    if doc is None:
        return "todo"
    return "done" if recorded(doc) == expected(row, config) else "stale"


def todo_parts(out: Path, row: Row, per_set: bool) -> list[tuple[str, object]]:
    """The parts of a row still to measure (none once the row's own results.json is done)."""
    if status(out, row) == "done":
        return []
    return [(f, c) for f, c in row.parts(per_set) if status(out, row, f, c) != "done"]


def ar_seconds_per_token(doc: dict) -> float:
    sets = doc["systems"][0]["sets"]
    return sum(s["ar_seconds"] for s in sets) / sum(s["ar_tokens"] for s in sets)


def estimate_seconds(out: Path, row: Row, config, rows: list[Row]) -> tuple[float, str]:
    """(seconds, where the AR time per token comes from) for one bench run of `row` under `config`."""
    per_token, source = None, None
    for other in rows:
        if other.deployment.name != row.deployment.name or other.batch != row.batch:
            continue
        for folder, _ in [(other.name, None), *other.parts(True)]:
            doc = load_results(out, folder)
            if doc and doc.get("batches"):
                per_token, source = ar_seconds_per_token(doc), f"{folder}/results.json"
                break
        if per_token is not None:
            break
    if per_token is None:
        import torch

        from specpilot.engine.session import resolve_model_dir
        from specpilot.models.config import ModelConfig
        from specpilot.models.expand import ModelSize, expanded_config

        target = ModelConfig.from_dir(resolve_model_dir(row.deployment.target, "target"))
        size = ModelSize.of(expanded_config(target, row.deployment.target_expand))
        per_token = size.decode_bytes(torch.bfloat16) / GUESS_BANDWIDTH / row.batch
        source = f"guess: target bytes at {GUESS_BANDWIDTH / 1e12:.1f} TB/s"
    c = config
    tokens = c.n_prompts * len(c.sets) * c.max_new_tokens
    return LOAD_SECONDS + per_token * tokens * (1 + SYSTEM_SHARE * len(row.systems)), source


def describe_plan(rows: list[Row], out: Path, per_set: bool = False) -> str:
    lines = ["plan (AR timed interleaved with every system, same prompts; stock is the baseline of gains):"]
    for r in rows:
        c = r.config
        final = f"final from {r.final_source}" if r.final_source else "no final system"
        state = status(out, r)
        if state != "done" and per_set:
            state = f"{len(r.parts(True)) - len(todo_parts(out, r, True))}/{len(c.sets)} sets in"
        lines.append(f"  {r.name:<24} [{state}] {c.n_prompts} prompts x {len(c.sets)} sets x "
                     f"{c.max_new_tokens} new tokens{' (EOS ignored)' if c.ignore_eos else ''}, batch {c.batch}; "
                     f"systems: {', '.join(s.name for s in r.systems)}; {final}")
    return "\n".join(lines)


def check_prompts(rows: list[Row]) -> None:
    """Tokenise every row's prompts with the target's tokenizer (no model) and report their lengths."""
    from specpilot.bench.prompts import prompt_ids
    from specpilot.engine.session import resolve_model_dir
    from specpilot.models.tokenizer import Tokenizer

    for r in rows:
        c = r.config
        tokenizer = Tokenizer.from_dir(resolve_model_dir(r.deployment.target, "target"))
        prompts = prompt_ids(r.deployment, tokenizer, c.sets, c.n_prompts, c.seed)
        longest = max(len(p.ids) for p in prompts)
        print(f"  {r.name}: {len(prompts)} prompts, longest {longest} tokens (+ {c.max_new_tokens} new)",
              file=sys.stderr)


def main(argv=None) -> int:
    from specpilot.errors import SpecPilotError

    args = parse_args(argv)
    out = Path(args.out)
    try:
        rows = plan(args)
        print(describe_plan(rows, out, args.per_set), file=sys.stderr)
        stale = [r.name for r in rows if status(out, r) == "stale"]
        if args.per_set:
            stale += [f for r in rows for f, c in todo_parts(out, r, True) if status(out, r, f, c) == "stale"]
        if stale and not args.overwrite:
            raise SpecPilotError(f"{', '.join(stale)} in {out} measured with another config; "
                                 "choose another --out or pass --overwrite to re-measure")
        if args.dry_run:
            check_prompts(rows)
            for r in rows:
                for folder, config in todo_parts(out, r, args.per_set):
                    seconds, source = estimate_seconds(out, r, config, rows)
                    print(f"  {folder}: ~{seconds:.0f} s ({source})", file=sys.stderr)
            print("dry run: everything checks out", file=sys.stderr)
            return 0
        command = ("python", "scripts/headline.py", *(sys.argv[1:] if argv is None else argv))
        return run_all(rows, out, args, command)
    except SpecPilotError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


def run_all(rows: list[Row], out: Path, args, command: tuple[str, ...]) -> int:
    from specpilot.bench.report import prepare_out_dir

    start = time.perf_counter()
    stopped = False
    for r in rows:
        if status(out, r) == "done":
            print(f"{r.name}: measured already ({out / r.name / 'results.json'}), skipped", file=sys.stderr)
            continue
        for folder, config in todo_parts(out, r, args.per_set):
            if args.max_seconds is not None:
                seconds, source = estimate_seconds(out, r, config, rows)
                left = args.max_seconds - (time.perf_counter() - start)
                if seconds > left:
                    print(f"{folder}: estimated {seconds:.0f} s ({source}), {left:.0f} s left of --max-seconds: "
                          "not started; run the same command again", file=sys.stderr)
                    stopped = True
                    break
            # no results.json there, or a stale one (refused above unless --overwrite)
            target = prepare_out_dir(out / folder, r.deployment.name, overwrite=True)
            measure(r, config, target, args.device, command)
        if stopped:
            break
        if args.per_set:
            merge_parts(out, r)
        write_summary(out, rows)
    write_summary(out, rows)
    done = sum(status(out, r) == "done" for r in rows)
    print(f"{done}/{len(rows)} rows measured ({time.perf_counter() - start:.0f} s this call); table in "
          f"{out / 'headline.md'}", file=sys.stderr)
    return 0


def measure(row: Row, config, target: Path, device: str, command: tuple[str, ...]) -> None:
    import torch

    from specpilot.bench.report import render_terminal
    from specpilot.cli.bench import benchmark, write_outputs

    result = benchmark(row.deployment, row.systems, config, device=device, command=command)
    paths = write_outputs(result, target)
    print(render_terminal(result))
    print(f"wrote {', '.join(str(p) for p in paths)} ({result.wall_seconds:.0f} s)", file=sys.stderr)
    del result
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def merge_parts(out: Path, row: Row) -> None:
    """OUT/<row>/results.* from its per-set parts: their measurements summarised by bench's `summarise`
    under the row's config, as one bench run over every set would be (each set its own stratum)."""
    from specpilot.bench.results import BenchResult, summarise
    from specpilot.cli.bench import write_outputs

    docs = [load_results(out, folder) for folder, _ in row.parts(True)]
    measurements = tuple(m for doc in docs for m in measurements_from(doc))
    environment = {**docs[0]["environment"], "parts": [[d["config"]["sets"][0], d["created"],
                                                        d["environment"].get("git_commit")] for d in docs]}
    result = BenchResult(
        deployment=row.deployment, config=row.config, systems=summarise(measurements, row.systems, row.config),
        measurements=measurements, environment=environment, created=docs[-1]["created"],
        command=tuple(docs[-1]["command"]), chat_template=all(d["config"]["chat_template"] for d in docs),
        dropped_prompts=sum(d["config"]["dropped_prompts"] for d in docs),
        wall_seconds=sum(d["wall_seconds"] for d in docs))
    paths = write_outputs(result, out / row.name)
    print(f"{row.name}: merged {len(docs)} sets into {', '.join(str(p) for p in paths)}", file=sys.stderr)


# ---- the table, from the rows' results.json files ----

def measurements_from(doc: dict):
    """results.json's "batches" back into `BatchMeasurement`s (the inverse of their `to_dict`)."""
    from specpilot.bench.runner import BatchMeasurement, EngineRun, Output, PromptInfo

    def run(d):
        outputs = tuple(Output(o["tokens"], o["rounds"], tuple(o["accept_histogram"]), o["identical"],
                               o["first_divergence"]) for o in d["outputs"])
        return EngineRun(d["name"], d["seconds"], d["prefill_seconds"], outputs)

    return tuple(BatchMeasurement(b["set"], b["batch"], tuple(PromptInfo(**p) for p in b["prompts"]),
                                  tuple(b["order"]), run(b["ar"]), tuple(run(s) for s in b["systems"]))
                 for b in doc["batches"])


def gain_over(doc: dict, system: str, baseline: str) -> dict:
    """`system`'s gain over `baseline` as bench's `summarise` gives it with `baseline` first: the same
    per-token ratios, geometric mean and bootstrap as the gains over stock in results.json."""
    from specpilot.bench.results import summarise
    from specpilot.bench.runner import BenchConfig
    from specpilot.bench.stats import IntervalMethod
    from specpilot.config import System

    c = doc["config"]
    config = BenchConfig(sets=tuple(c["sets"]), n_prompts=c["n_prompts"], max_new_tokens=c["max_new_tokens"],
                         batch=c["batch"], resamples=c["resamples"], level=c["level"],
                         interval=IntervalMethod(c["interval"]), bootstrap_seed=c["bootstrap_seed"])
    knobs = {s["name"]: s["knobs"] for s in doc["systems"]}
    systems = tuple(System.from_dict(knobs[n], name=n) for n in (baseline, system))
    return summarise(measurements_from(doc), systems, config)[1].gain.to_dict()


def fmt(interval: dict | None) -> str:
    if not interval or interval.get("estimate") is None:
        return "-"
    est = f"{interval['estimate']:.2f}x"
    if interval.get("low") is None or interval.get("high") is None:
        return f"{est} [n/a]"
    return f"{est} [{interval['low']:.2f}, {interval['high']:.2f}]"


def row_summary(row: Row, doc: dict | None) -> dict:
    """The numbers of one line of the table (None where not yet measured)."""
    c = row.config
    line = {"row": row.name, "deployment": row.deployment.name, "batch": row.batch,
            "max_new_tokens": c.max_new_tokens, "ignore_eos": c.ignore_eos, "sampling": c.sampling.describe(),
            "final_source": row.final_source,
            "baselines": list(row.baselines), "article": ARTICLE.get((row.deployment.name, row.batch)),
            "measured": doc is not None and recorded(doc) == expected(row)}
    if not line["measured"]:
        return line
    systems, env = {s["name"]: s for s in doc["systems"]}, doc["environment"]
    stock, final = systems["stock"], systems.get(FINAL)
    line.update({
        "device": env.get("gpu") or f"CPU ({env.get('cpu') or 'unknown'})",
        "commit": (env.get("git_commit") or "unknown")[:12] + ("+dirty" if env.get("git_dirty") else ""),
        "ar_ms_per_token": 1000 * ar_seconds_per_token(doc),
        "stock_over_ar": stock["geomean_speedup"],
        "final_over_ar": final["geomean_speedup"] if final else None,
        "final_over_stock": final["geomean_gain"] if final else None,
        "final_over_baseline": {b: gain_over(doc, FINAL, b) for b in row.baselines} if final else {},
        "baseline_over_ar": {b: systems[b]["geomean_speedup"] for b in row.baselines},
        "accepted_length": {n: s["mean_accepted_length"] for n, s in systems.items()},
    })
    return line


def render(lines: list[dict]) -> str:
    baselines = sorted({b for line in lines for b in line["baselines"]})
    with_article = any(line["article"] for line in lines)
    tokens = sorted({(line["max_new_tokens"], line["ignore_eos"]) for line in lines})
    length = "; ".join(f"{n} new tokens" + (" (EOS ignored)" if eos else " (stopping at EOS)") for n, eos in tokens)
    sampling = ", ".join(sorted({line["sampling"] for line in lines}))
    header = ["deployment", "regime", "tokens", "AR ms/token", "stock / AR", "final / AR", "final / stock"]
    header += [f"final / {b}" for b in baselines] + ["accepted length (stock, final" +
                                                     "".join(f", {b}" for b in baselines) + ")"]
    header += ["article"] if with_article else []
    table = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for line in lines:
        regime = "batch 1" if line["batch"] == 1 else f"batch {line['batch']} (static)"
        cells = [f"`{line['deployment']}`", regime, str(line["max_new_tokens"])]
        if not line["measured"]:
            cells += ["not yet measured"] + ["-"] * (len(header) - 4 - with_article)
        else:
            acc = line["accepted_length"]
            cells += [f"{line['ar_ms_per_token']:.2f}", fmt(line["stock_over_ar"]), fmt(line["final_over_ar"]),
                      fmt(line["final_over_stock"])]
            cells += [fmt(line["final_over_baseline"].get(b)) if b in line["baselines"] else "-" for b in baselines]
            cells.append(", ".join(f"{acc[n]:.2f}" if n in acc and acc[n] is not None else "-"
                                   for n in ("stock", FINAL, *baselines)))
        if with_article:
            article = line["article"] or "-"
            if any(b.lower().startswith("ddtree") for b in line["baselines"]) and line["batch"] == 1:
                article = f"{article}; {ARTICLE_DDTREE}" if line["article"] else ARTICLE_DDTREE
            cells.append(article)
        table.append("| " + " | ".join(cells) + " |")
    measured = [line for line in lines if line["measured"]]
    where = sorted({f"{line['device']} (commit {line['commit']})" for line in measured})
    notes = [
        "# Headline: speedup over AR, stock and the loop's final system", "",
        f"Geometric means over the sets of the per-set speedups (time per token), {length}, {sampling}; "
        "[95% bootstrap intervals]. Each row is one `specpilot bench` run, or one per set merged by bench's "
        "`summarise` (AR and every system interleaved on the same prompts); final / stock is bench's gain, "
        "final / baseline bench's gain with the baseline first; batch N (static) = bench's --batch N.  ",
        f"Measured on {', '.join(where) if where else 'nothing yet'}; "
        f"{len(measured)}/{len(lines)} rows measured. Details: <row>/results.md.  ",
    ]
    finals = [f"- `{line['row']}`: final = {line['final_source']}" for line in lines if line["final_source"]]
    footer = ["", *finals] if finals else []
    if with_article:
        footer += ["", "Article column: the article's headline table (../shared/seed/000_d598d0812d72f95f.txt), "
                   "the row that plays the same part (27-30B targets on H100 / RTX PRO 6000; not the same models)."]
    footer += ["", "Written by scripts/headline.py from each row's results.json.", ""]
    return "\n".join(notes + ["", *table, *footer])


def write_summary(out: Path, rows: list[Row]) -> None:
    from specpilot.bench.report import finite, write_text_atomic

    lines = [row_summary(r, load_results(out, r.name)) for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "headline.json", json.dumps(finite({"rows": lines}), indent=1, allow_nan=False) + "\n")
    write_text_atomic(out / "headline.md", render(lines))


if __name__ == "__main__":
    raise SystemExit(main())
