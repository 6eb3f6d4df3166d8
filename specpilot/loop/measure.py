"""Measuring the incumbent for the cost model: a profile of its rounds, pooled over a few batches.

`engine.profile.profile` times the pieces of a round on one batch (draft, verify over the tree,
the verify-cost curve, bandwidth and matmul rate). Acceptance from one batch of one prompt is thin,
so `measure` profiles the first batch and then decodes the others, pooling their tokens per round,
per-depth acceptance and round time into the profile before the cost model reads it.

Where the code runs matters: a knob-only incumbent is measured in this process on the loop's
loaded session; an incumbent carrying a patch is measured in a subprocess that imports its
worktree first (`python -c ...`, the same way the controller's workers do), so the profile is of
the patched code. The tree shape the cost model reads is the one the running drafter builds
(`shape_run`), not the one the knobs name: a patch may change what a knob means. On CPU both run torch single-threaded, like the loop's workers (`runner.py`).

Plain AR decoding of the same batches is timed too (what drafting has to beat; the knob agent's
estimate for switching drafting off), and so is the system with each other drafter the session
loads switched in (`DRAFTER_SWITCHES`: the draft model, EAGLE-3, DFlash), so the knob agent ranks
a drafter switch by its measured time rather than exploring it blind.

On a GPU it also measures how often the target's 8-bit view agrees with it (`view_agreement`),
which prices two-level verification.

Owns: `measure`, `measure_in_worktree`, `shape_run`, pooling, `ar_ms_per_token`,
`switch_measurements`, `view_agreement`. Does not own profiling (engine) or the cost model's arithmetic (`cost_model.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from specpilot.config import DrafterKind, System
from specpilot.errors import SpecPilotError
from specpilot.loop.acceptance import TreeShape
from specpilot.loop.cost_model import CostTable, analyze
from specpilot.loop.systems import switched


def shape_run(gen, system: System) -> TreeShape | None:
    """The tree shape the generator's drafter builds: its depth, children per node and draft nodes as
    the code that runs sets them (a patch may build other trees than the knobs say); the knobs'
    shape for what a drafter does not say (topk of a DFlash drafter); None for AR."""
    drafter = next(iter(getattr(gen, "drafters", {}).values()), None)
    if drafter is None or not system.speculative:
        return None
    knobs = TreeShape.of(system)
    depth = getattr(drafter, "depth", None) or knobs.depth
    topk = getattr(drafter, "topk", None) or knobs.topk
    nodes = getattr(drafter, "num_nodes", None)
    return TreeShape(depth, topk, nodes - 1 if nodes and nodes > 1 else knobs.budget)


def measure(session, system: System, batches: list[list[list[int]]], max_new_tokens: int) -> CostTable:
    """Profile `system` on the first batch, pool acceptance and round time over all; its cost table."""
    import torch

    from specpilot.engine.profile import kv_bytes_per_token, profile

    gen = session.generator(system)
    p = profile(gen, batches[0], max_new_tokens)
    depth = len(p.accept_at_depth)
    stats = [(p.round_ms, p.tokens_per_round, p.accept_at_depth)]
    later = [gen.generate(batch, max_new_tokens) for batch in batches[1:]]
    stats += [_round_stats(r, depth) for r in later]
    round_ms, tau, curve = _pooled(stats, depth)
    p = replace(p, tokens_per_round=tau, round_ms=round_ms, accept_at_depth=curve)
    drafter = session.drafter_model if system.drafter.value == "model" else None
    kv = kv_bytes_per_token(drafter) if drafter is not None else 0
    ar_ms = ar_ms_per_token(session, system, batches, max_new_tokens) if system.speculative else p.ms_per_token
    switches = switch_measurements(session, system, batches, max_new_tokens) if system.speculative else {}
    text = ((batches[1], later[0].outputs) if later  # the system's own text (lossless: the target's)
            else (batches[0], None))
    agreement = view_agreement(session, system, gen, *text, max_new_tokens)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return analyze(p, shape_run(gen, system), system.name, kv, ar_ms_per_token=ar_ms,
                   switch_ms_per_token={k: m["ms_per_token"] for k, m in switches.items()},
                   drafter=system.drafter.value, switch_rounds=switches, view_agreement=agreement)


def view_agreement(session, system: System, gen, prompts: list[list[int]], outputs: list[list[int]] | None,
                   max_new_tokens: int) -> float | None:
    """On a GPU, for a system two-level verification applies to (`config.TLV_DRAFTERS`) and a
    target that has an 8-bit view (`models.view`: not recurrent, not FP8): the share of positions
    of the system's own text (prompts and their outputs) where the view's greedy token is the
    target's (`outputs` of `prompts` already decoded, else decoded here). None elsewhere (a CPU runs
    the view's reference path, slower than the target)."""
    import torch

    from specpilot.config import TLV_DRAFTERS
    from specpilot.errors import ConfigError
    from specpilot.models.view import agreement

    if gen.target.device.type != "cuda" or system.drafter not in TLV_DRAFTERS or system.adaptive_depth:
        return None
    try:
        view = session.view_for(system)
    except ConfigError:  # a recurrent or an FP8 target: no view
        return None
    if outputs is None:
        outputs = gen.generate(prompts, max_new_tokens).outputs
    rows = [p + o for p, o in zip(prompts, outputs)]
    T = min(len(r) for r in rows)
    return agreement(view, session.target, torch.tensor([r[:T] for r in rows], device=gen.target.device))


def ar_ms_per_token(session, system: System, batches: list[list[list[int]]], max_new_tokens: int) -> float:
    """Plain AR decoding (`System.plain_ar`) on the same batches: ms per token."""
    gen = session.generator(system.plain_ar())
    per_token = [_round_stats(r, 0)[0] for r in _timed_generations(gen, batches, max_new_tokens)]
    return sum(per_token) / len(per_token)


def _round_stats(r, depth: int) -> tuple[float, float, tuple[float, ...]]:
    """(decode ms per round, tokens per round, P(accepted >= d) for d = 1..depth) of one
    `GenerationResult`, reckoned as `engine.profile.profile` reckons them."""
    from specpilot.engine.profile import acceptance_by_depth

    round_ms = (r.seconds - r.prefill_seconds) / max(max(r.rounds), 1) * 1e3
    return round_ms, r.num_tokens / max(sum(r.rounds), 1), acceptance_by_depth(r.accept_lengths, depth) if depth else ()


def _pooled(stats: list[tuple[float, float, tuple[float, ...]]], depth: int) -> tuple[float, float, tuple[float, ...]]:
    """The means of `_round_stats` over batches, each batch weighing the same."""
    n = len(stats)
    return (sum(s[0] for s in stats) / n, sum(s[1] for s in stats) / n,
            tuple(sum(s[2][d] for s in stats) / n for d in range(depth)))


def _timed_generations(gen, batches: list[list[list[int]]], max_new_tokens: int) -> list:
    """Each batch's `GenerationResult` after a warm-up (`engine.profile.warm_up`) on the first."""
    from specpilot.engine.profile import warm_up

    warm_up(gen, batches[0], max_new_tokens)
    return [gen.generate(batch, max_new_tokens) for batch in batches]


def loaded_drafters(session) -> list[DrafterKind]:
    """The drafters other than n-gram that `session` holds a model for."""
    held = ((DrafterKind.MODEL, session.drafter_model), (DrafterKind.EAGLE3, session.eagle3_model),
            (DrafterKind.DFLASH, session.dflash_model))
    return [kind for kind, model in held if model is not None]


def switch_measurements(session, system: System, batches: list[list[list[int]]], max_new_tokens: int) -> dict[str, dict]:
    """{drafter kind: {"ms_per_token", "round_ms", "tokens_per_round", "accept_at_depth"}} of
    `system` with each other drafter the session loads switched in (`loop.systems.switched`),
    decoded on the same batches and reckoned as the profile reckons the system's own (decode time
    per round over tokens per round; each batch weighs the same). Their generators are dropped
    afterwards: the session keeps no graphs for systems it only measured."""
    out = {}
    for kind in loaded_drafters(session):
        other = switched(system, kind) if kind is not system.drafter else None
        if other is None:
            continue
        gen = session.generator(other)
        depth = getattr(next(iter(gen.drafters.values()), None), "depth", 0) or 0
        stats = [_round_stats(r, depth) for r in _timed_generations(gen, batches, max_new_tokens)]
        round_ms, tau, curve = _pooled(stats, depth)
        per_token = sum(ms / max(t, 1e-9) for ms, t, _ in stats) / len(stats)
        out[kind.value] = {"ms_per_token": per_token, "round_ms": round_ms, "tokens_per_round": tau,
                           "accept_at_depth": list(curve)}
        session.forget(other.fingerprint())
    return out


def measure_in_worktree(workdir: str, deployment: str, system: System, batches: list[list[list[int]]],
                        max_new_tokens: int, device: str, timeout_s: float = 1800.0) -> CostTable:
    """`measure` in a subprocess that imports the code of `workdir` first."""
    with tempfile.TemporaryDirectory(prefix="specpilot-measure-") as tmp:
        args = Path(tmp) / "args.json"
        out = Path(tmp) / "cost.json"
        args.write_text(json.dumps({"deployment": deployment, "system": {"name": system.name, **system.knobs()},
                                    "batches": batches, "max_new_tokens": max_new_tokens, "device": device,
                                    "out": str(out)}))
        code = (f"import sys; sys.path.insert(0, {str(Path(workdir).resolve())!r}); "
                f"from specpilot.loop.measure import main; main({str(args)!r})")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SpecPilotError(f"measuring {system.name} in its worktree failed: {tail[0]}")
        return CostTable.from_dict(json.loads(out.read_text()))


def main(args_file: str) -> None:
    """Subprocess entry of `measure_in_worktree`."""
    import torch

    from specpilot.config import load_deployment
    from specpilot.engine.session import Session

    a = json.loads(Path(args_file).read_text())
    if a["device"].startswith("cpu"):
        torch.set_num_threads(1)
    deployment = load_deployment(a["deployment"])
    knobs = dict(a["system"])
    name = knobs.pop("name")
    system = deployment.stock.with_knobs(knobs, name)
    session = Session.load(deployment, device=a["device"])
    table = measure(session, system, a["batches"], a["max_new_tokens"])
    from specpilot.loop.journal import plain_json

    Path(a["out"]).write_text(json.dumps(plain_json(table.to_dict())))
