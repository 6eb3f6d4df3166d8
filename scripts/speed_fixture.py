"""Speedup over AR on the fixture deployments, stock and a hand-set tree, on the GPU.

    python scripts/speed_fixture.py --dry-run          # check files and prompts, no model loaded
    python scripts/speed_fixture.py                    # the defaults below, sized for ~6 min on one H200
    python scripts/speed_fixture.py --n-prompts 20 --max-new-tokens 2048 --out results/speed-2048

Runs the `specpilot bench` procedure once per deployment; each run times AR, stock and
scripts/systems/tree.toml interleaved on the same prompts (the two systems share the AR runs, which
saves a third of the device time of running them separately). Defaults:

    deployment    prompts/set  sets  new tokens  why
    fixture       10           5     2048        the paper's setting; a 16M target decodes fast
    fixture-x16   10           5      512        a 3.3B target at >= 1.4 ms/token: 2048 would cost 4x

Device-time estimate for the defaults on one H200 (not yet measured; the first run replaces it):
fixture-x16 AR ~50 prompts x 512 tokens x ~2 ms = ~50 s, stock and the tree ~15-25 s each, loading
and widening ~30-60 s; fixture AR ~50 x 2048 x ~0.3 ms = ~30 s, systems ~10-20 s each; plus warm-up
and CUDA-graph capture for each new KV-cache size (outside the timed region). About 4-6 minutes.

Writes OUT/<deployment>/{results.json,results.md,speedup.png,accept_hist.png} and OUT/summary.md
(every deployment's headline table), OUT defaulting to results/speed. An OUT/<deployment>
that already holds files is refused unless --overwrite. The plan is printed before anything runs.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DEPLOYMENTS = ("fixture", "fixture-x16")
DEFAULT_SYSTEMS = ("stock", str(REPO / "scripts" / "systems" / "tree.toml"))
DEFAULT_N_PROMPTS = 10
DEFAULT_MAX_NEW_TOKENS = {"fixture": 2048, "fixture-x16": 512}  # others: the deployment's own


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployments", nargs="+", default=list(DEFAULT_DEPLOYMENTS),
                   help="deployment files or shipped names (default: fixture fixture-x16)")
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS),
                   help="systems under test, the first being the baseline of gains (default: stock and "
                        "scripts/systems/tree.toml)")
    p.add_argument("--n-prompts", type=int, default=DEFAULT_N_PROMPTS, help="prompts per set (default 10)")
    p.add_argument("--max-new-tokens", type=int,
                   help="new tokens for every deployment (default: fixture 2048, fixture-x16 512)")
    p.add_argument("--sets", nargs="+", help="benchmark sets (default: the deployment's five)")
    p.add_argument("--batch", type=int, help="batch size (default: the deployment's regime)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--device", default="cuda", help="device (default cuda)")
    p.add_argument("--out", default=str(REPO / "results" / "speed"), help="output folder")
    p.add_argument("--overwrite", action="store_true", help="replace earlier results in OUT/<deployment>")
    p.add_argument("--dry-run", action="store_true",
                   help="check deployments, systems, prompts and output folders, print the plan, load no model")
    return p.parse_args(argv)


def plan(args):
    """[(deployment, systems, config)] for every deployment, validated (ConfigError on bad input)."""
    from specpilot.bench.runner import BenchConfig, systems_under_test
    from specpilot.config import load_deployment

    runs = []
    for name in args.deployments:
        dep = load_deployment(name)
        max_new = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS.get(dep.name)
        config = BenchConfig.for_deployment(dep, n_prompts=args.n_prompts, max_new_tokens=max_new,
                                            sets=tuple(args.sets) if args.sets else None, batch=args.batch,
                                            resamples=args.resamples)
        runs.append((dep, systems_under_test(args.systems, dep), config))
    return runs


def describe_plan(runs) -> str:
    lines = ["plan (AR timed interleaved with every system, same prompts):"]
    for dep, systems, c in runs:
        lines.append(f"  {dep.name:<14} {c.n_prompts} prompts x {len(c.sets)} sets x {c.max_new_tokens} new tokens, "
                     f"batch {c.batch}; systems: {', '.join(s.name for s in systems)}")
    return "\n".join(lines)


def check_prompts(runs) -> None:
    """Tokenise every run's prompts with the target's tokenizer (no model) and report their lengths."""
    from specpilot.bench.prompts import prompt_ids
    from specpilot.engine.session import resolve_model_dir
    from specpilot.models.tokenizer import Tokenizer

    for dep, _, c in runs:
        tokenizer = Tokenizer.from_dir(resolve_model_dir(dep.target, "target"))
        prompts = prompt_ids(dep, tokenizer, c.sets, c.n_prompts, c.seed)
        longest = max(len(p.ids) for p in prompts)
        print(f"  {dep.name}: {len(prompts)} prompts, longest {longest} tokens (+ {c.max_new_tokens} new)",
              file=sys.stderr)


def main(argv=None) -> int:
    from specpilot.bench.report import prepare_out_dir
    from specpilot.errors import SpecPilotError

    args = parse_args(argv)
    out = Path(args.out)
    try:
        runs = plan(args)
        print(describe_plan(runs), file=sys.stderr)
        taken = [out / "summary.md"] if (out / "summary.md").exists() else []
        taken += [out / d.name for d, _, _ in runs if (out / d.name).is_dir() and any((out / d.name).iterdir())]
        if taken and not args.overwrite:
            raise SpecPilotError(f"{', '.join(map(str, taken))} already exist(s); "
                                 "choose another --out or pass --overwrite")
        if args.dry_run:
            check_prompts(runs)
            print("dry run: everything checks out", file=sys.stderr)
            return 0
        dirs = [prepare_out_dir(out / dep.name, dep.name, args.overwrite) for dep, _, _ in runs]
        command = ("python", "scripts/speed_fixture.py", *(sys.argv[1:] if argv is None else argv))
        return run_all(runs, dirs, out, args.device, command)
    except SpecPilotError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


def run_all(runs, dirs, out: Path, device: str, command: tuple[str, ...]) -> int:
    import torch

    from specpilot.cli.bench import benchmark, write_outputs
    from specpilot.bench.report import headline_markdown, render_terminal, write_text_atomic

    start = time.perf_counter()
    sections = []
    for (dep, systems, config), target in zip(runs, dirs):
        result = benchmark(dep, systems, config, device=device, command=command)
        paths = write_outputs(result, target)
        print(render_terminal(result))
        print(f"wrote {', '.join(str(p) for p in paths)} ({result.wall_seconds:.0f} s)", file=sys.stderr)
        sections += [f"## {dep.name}", "", headline_markdown(result), "",
                     f"Details: [{dep.name}/results.md]({dep.name}/results.md); "
                     f"the run took {result.wall_seconds:.0f} s.", ""]
        del result
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        summary = ["# Speed benchmark: fixture deployments", "",
                   "Written by scripts/speed_fixture.py; the numbers are in each deployment's results.json.", "",
                   *sections]
        write_text_atomic(out / "summary.md", "\n".join(summary))  # after every deployment: partial runs keep theirs
    print(f"all done in {time.perf_counter() - start:.0f} s; summary in {out / 'summary.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
