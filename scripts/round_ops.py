"""(CPU) The tensor operations one decoding round launches, by the engine function that issues them:
serve a few requests by continuous batching, then count the non-view ATen operations of one more
round (each a kernel on a GPU, where the model's elementwise pieces are fused: `[model]` rows count
them unfused). Glue = everything outside the model forwards.

Usage: python scripts/round_ops.py --system scripts/systems/eagle3-d6k4n16-segment-7.toml \
           [--deployment fixture-x16-batch] [--concurrency 8] [--expand 1] [--top 30] [--detail best_first]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specpilot  # noqa: E402
from specpilot.bench.prompts import prompt_ids  # noqa: E402
from specpilot.bench.serving import request_pool  # noqa: E402
from specpilot.config import load_deployment, load_system  # noqa: E402
from specpilot.engine.serving import Request, ServingEngine  # noqa: E402
from specpilot.engine.session import Session  # noqa: E402

PACKAGE = Path(specpilot.__file__).resolve().parent  # the imported package's directory

VIEWS = {"view", "as_strided", "reshape", "slice", "transpose", "unsqueeze", "permute", "expand", "_reshape_alias",
         "t", "select", "squeeze", "split", "split_with_sizes", "chunk", "_unsafe_view", "alias", "detach", "unbind",
         "empty", "empty_strided", "empty_like", "lift_fresh", "narrow", "resolve_conj", "resolve_neg"}


@functools.lru_cache(maxsize=None)
def package_file(filename: str) -> str | None:
    """`filename` relative to the imported package's directory ('engine/steps.py'), or None outside
    it. Matched on the resolved directory, not on a folder name: a checkout (or a venv) in a folder
    named `specpilot` holds torch's and this script's files too."""
    try:
        rel = Path(os.path.realpath(filename)).relative_to(PACKAGE)
    except ValueError:
        return None
    return rel.as_posix()


class Counter(TorchDispatchMode):
    """Counts each non-view operation under (innermost engine frame, whether inside a model forward)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            frames = [(rel, f.name) for f in traceback.extract_stack() if (rel := package_file(f.filename))]
            outside = [(rel, fn) for rel, fn in frames if not rel.startswith("models/")]
            rel, fn = (outside or frames)[-1]
            model = len(outside) < len(frames)
            self.counts[(f"{rel}:{fn}" + (" [model]" if model else ""), name)] += 1
        return func(*args, **(kwargs or {}))


def count_round(deployment: str, system_spec: str, concurrency: int, expand: int = 1):
    """((function, op) -> count) of one round after a short serving run; the system's and deployment's names."""
    dep = dataclasses.replace(load_deployment(deployment), target_expand=expand, drafter_expand=expand)
    session = Session.load(dep, "cpu")
    system = load_system(system_spec, dep)
    gen = session.generator(system)
    pool = request_pool(prompt_ids(dep, session.tokenizer))
    ServingEngine(gen, concurrency).run([Request(tuple(p.ids), 24) for p in pool[:concurrency]])
    ws = next(reversed(gen.workspaces.values()))
    counter = Counter()
    with torch.inference_mode(), counter:
        gen.rounds.step(ws, gen.rounds.tiers[0])
    return counter.counts, system.name, dep.name


def by_function(counts) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for (where, _), n in counts.items():
        out[where] += n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="fixture-x16-batch")
    ap.add_argument("--system", default="stock")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--expand", type=int, default=1, help="target/drafter width factor on CPU (default 1: narrow)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--detail", default="", help="also list the operations of functions whose name contains this")
    a = ap.parse_args(argv)
    counts, name, dep_name = count_round(a.deployment, a.system, a.concurrency, a.expand)
    by_fn = by_function(counts)
    total = sum(by_fn.values())
    glue = sum(n for w, n in by_fn.items() if not w.endswith("[model]"))
    print(f"{name} on {dep_name} (x{a.expand}, CPU), concurrency {a.concurrency}: {total} operations in one "
          f"round, {glue} outside the model forwards")
    for where, n in by_fn.most_common(a.top):
        print(f"{n:6d}  {where}")
    if a.detail:
        for (where, op), n in sorted(counts.items(), key=lambda x: -x[1]):
            if a.detail in where:
                print(f"{n:6d}  {where}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
