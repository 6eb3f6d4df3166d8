"""`specpilot memory list|show|deployments|export|import`: read the memory database, and merge
another machine's export into it (`import`: a run continued elsewhere, a teammate's results).

`deployments --like NAME` ranks the other stored deployments by their similarity to one of them
(`DeploymentFingerprint.similarity`, with the differences in words): the ones a run of NAME seeds
from (`specpilot.loop.seeds`: at least `MIN_SIMILARITY`, versions lower the score, never block).
With no other deployment stored it says so in one line (exit 0). Tables are as wide as their
content: no name is cut.

Owns: flags and output formats. Does not own queries (`store.py`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpilot.errors import ConfigError

HELP = "list, show, export or import the memory of evaluated candidates"


def register(sub: argparse._SubParsersAction) -> None:
    from specpilot.control.rule import Outcome

    p = sub.add_parser("memory", help=HELP,
                       description="Read the SQLite memory of every evaluated candidate.")
    msub = p.add_subparsers(dest="memory_command", metavar="ACTION", required=True)

    def common(q):
        q.add_argument("--memory", help="memory database (default: $SPECPILOT_MEMORY or $SPECPILOT_HOME/memory.sqlite)")

    q = msub.add_parser("list", help="evaluations, newest first")
    common(q)
    q.add_argument("--deployment", help="deployment fingerprint (prefix) or name")
    q.add_argument("--verdict", choices=[v.value for v in Outcome], help="only this verdict")
    q.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50; 0 = all)")
    q.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    q.set_defaults(func=run_list)

    q = msub.add_parser("show", help="one evaluation with all its numbers")
    common(q)
    q.add_argument("id", type=int, help="entry id (see `memory list`)")
    q.add_argument("--json", action="store_true", help="print the entry as JSON")
    q.set_defaults(func=run_show)

    q = msub.add_parser("deployments", help="stored deployments; with --like, ranked by similarity to one")
    common(q)
    q.add_argument("--like", help="a stored deployment (fingerprint prefix or name): rank the others by similarity "
                                  "to it, as a run of it seeds from them")
    q.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    q.set_defaults(func=run_deployments)

    q = msub.add_parser("export", help="every table as one JSON document")
    common(q)
    q.add_argument("--out", help="write to this file instead of stdout")
    q.set_defaults(func=run_export)

    q = msub.add_parser("import", help="merge an export (`memory export`, a run's memory.json) into the memory")
    common(q)
    q.add_argument("file", help="the export's JSON file")
    q.set_defaults(func=run_import)


def _path(args) -> Path:
    """The memory database `--memory` names, else the default one."""
    from specpilot import env

    return Path(args.memory) if args.memory else env.memory_path()


def _open(args):
    from specpilot.memory.store import Memory

    path = _path(args)
    if not path.is_file():
        raise ConfigError(f"no memory database at {path}")
    return Memory(path)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.2f}%"


def run_list(args) -> int:
    from specpilot.control.rule import Outcome

    if args.limit < 0:
        raise ConfigError("--limit must be >= 0")
    with _open(args) as memory:
        records = memory.entries(args.deployment, Outcome(args.verdict) if args.verdict else None, args.limit or None)
    if args.json:
        print(json.dumps([_summary(r) for r in records], indent=2))
        return 0
    rows = [[str(r.id), r.created_at[:19], r.deployment_name, r.candidate.name, r.verdict.value, _pct(r.gain),
             f"[{_pct(r.gain_lower)}, {_pct(r.gain_upper)}]" if r.gain is not None else "", r.round]
            for r in records]
    print("\n".join(table([(">", "id"), ("<", "created (UTC)"), ("<", "deployment"), ("<", "candidate"),
                            ("<", "verdict"), (">", "gain"), (">", "95% interval"), ("<", "round")], rows)))
    return 0


def table(columns: list[tuple[str, str]], rows: list[list[str]]) -> list[str]:
    """The lines of a text table, header first: `columns` are (alignment '<' or '>', header); each
    column is as wide as its widest cell, header included, so no cell is ever cut; trailing blanks
    are dropped."""
    widths = [max([len(head), *(len(row[i]) for row in rows)]) for i, (_, head) in enumerate(columns)]

    def line(cells) -> str:
        return "  ".join(f"{cell:{align}{width}}" for cell, (align, _), width in zip(cells, columns, widths)).rstrip()

    return [line([head for _, head in columns])] + [line(row) for row in rows]


def _summary(r) -> dict:
    return {"id": r.id, "created_at": r.created_at, "deployment": r.deployment, "deployment_name": r.deployment_name,
            "candidate": r.candidate.name, "candidate_hash": r.candidate.hash, "incumbent_hash": r.incumbent,
            "round": r.round, "stage": r.stage.value, "verdict": r.verdict.value,
            "reasons": [x.value for x in r.reasons], "gain": r.gain, "gain_lower": r.gain_lower,
            "gain_upper": r.gain_upper, "threshold": r.threshold, "noise": r.noise, "blocks": r.blocks,
            "guard_passed": r.guard_passed}


def run_show(args) -> int:
    with _open(args) as memory:
        r = memory.get(args.id)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    from specpilot.cli.evaluate import format_evaluation

    print(f"entry {r.id}  ({r.created_at}, round {r.round or '-'}, commit {r.detail.get('commit') or '?'})")
    print(f"  deployment  {r.deployment_name} [{r.deployment}]")
    print(f"  candidate   {r.candidate.name} [{r.candidate.hash}] parent {r.candidate.parent or '-'}")
    print(f"  diff        {json.dumps(r.candidate.diff)}" + ("  (+ patch)" if r.candidate.patch else ""))
    print(format_evaluation(r.evaluation(), r.deployment_name))
    return 0


def run_deployments(args) -> int:
    from specpilot.loop.seeds import MIN_SIMILARITY

    with _open(args) as memory:
        stored = memory.deployments()
    rows = [{"fingerprint": d, "name": fp.name, "gpu": fp.gpu, "max_new_tokens": fp.max_new_tokens,
             "specpilot": fp.versions.get("specpilot"), "torch": fp.versions.get("torch"), "evaluations": n,
             "promotions": p} for d, fp, n, p in stored]
    if args.like:
        like = [(d, fp) for d, fp, _, _ in stored if d.startswith(args.like) or fp.name == args.like]
        if len(like) != 1:
            raise ConfigError(f"--like {args.like!r} matches {len(like)} stored deployments (need one; see "
                              "`specpilot memory deployments`)")
        digest, here = like[0]
        by_digest = {d: fp for d, fp, _, _ in stored}
        rows = [dict(r, similarity=here.similarity(by_digest[r["fingerprint"]]),
                     differences=here.differences(by_digest[r["fingerprint"]]),
                     seeds=here.similarity(by_digest[r["fingerprint"]]) >= MIN_SIMILARITY)
                for r in rows if r["fingerprint"] != digest]
        rows.sort(key=lambda r: (-r["similarity"], r["fingerprint"]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.like and not rows:
        print(f"no other deployment in {_path(args)} to compare {here.name!r} with: run or import one first "
              "(`specpilot run --deployment ...`, `specpilot memory import FILE`)")
        return 0
    columns = [("<", "fingerprint"), ("<", "name"), ("<", "gpu"), (">", "tokens"), ("<", "specpilot"),
               (">", "entries"), (">", "promoted")] + ([(">", "similarity"), ("<", "differences")] if args.like else [])
    cells = [[r["fingerprint"], r["name"], r["gpu"], str(r["max_new_tokens"]), str(r["specpilot"]),
              str(r["evaluations"]), str(r["promotions"])]
             + ([f"{r['similarity']:.2f}", r["differences"] + ("" if r["seeds"] else " (below the seeding bar)")]
                if args.like else [])
             for r in rows]
    print("\n".join(table(columns, cells)))
    return 0


def run_export(args) -> int:
    with _open(args) as memory:
        data = memory.export()
    text = json.dumps(data, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


def run_import(args) -> int:
    from specpilot import env
    from specpilot.memory.store import Memory

    try:
        data = json.loads(Path(args.file).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read {args.file}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{args.file} is not JSON ({err})") from None
    path = _path(args)
    with Memory(path) as memory:
        added = memory.import_export(data)
    print(f"imported into {path}: " + ", ".join(f"{added[t]} {t.replace('_', ' ')}" for t in
                                                  ("evaluations", "noise_floors", "systems", "deployments"))
          + f" ({added['held']} already held); {added['kernel_tables']} kernel table file(s) written under "
          f"{env.home() / 'kernels'}")
    return 0

