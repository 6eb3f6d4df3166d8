"""How well the loop's acceptance model predicts other tree shapes: fitted on one, measured on all.

    python scripts/acceptance_check.py --out DIR [--n-prompts 3] [--tokens 128] [--device cpu]

On the fixture at x1 (`fixture-dflash`: the draft model and the EAGLE-3 head beside the target),
for each drafter: generate the benchmark prompts (n per set, `specpilot bench`'s draw) with the
stock tree shape (depth 5, topk 4, 7 nodes), fit `loop.acceptance.AcceptanceModel` to its
P(accepted >= d) as the cost model does, and predict tokens per round for other shapes, scaled to
the measured shape as `CostTable.tokens_per_round_for` scales them; then generate with each shape
and measure. Acceptance does not depend on speed, so CPU float32 measures what the GPU would (up to
bf16 near-ties). Writes DIR/acceptance_check.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
os.environ.setdefault("SPECPILOT_COMPILE", "0")

import torch  # noqa: E402
from train_data import bench_prompt_ids  # noqa: E402

from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.config import DrafterKind, load_deployment  # noqa: E402
from specpilot.engine.profile import acceptance_by_depth  # noqa: E402
from specpilot.engine.session import Session  # noqa: E402
from specpilot.loop.acceptance import AcceptanceModel, TreeShape, rank_decay  # noqa: E402

FITTED = TreeShape(5, 4, 7)  # the draft-model stock (SGLang's EAGLE defaults)
SHAPES = (TreeShape(5, 4, 16), TreeShape(6, 4, 16), TreeShape(4, 4, 7), TreeShape(6, 2, 10), TreeShape(9, 2, 16),
          TreeShape(7, 8, 32), TreeShape(16, 2, 32), TreeShape(7, 8, 128))


def measure(session: Session, drafter: DrafterKind, shape: TreeShape, prompts, tokens: int) -> dict:
    """Tokens per round and P(accepted >= d) of one system on the prompts."""
    system = session.deployment.stock.with_changes(name=f"{drafter.value}-{shape.label()}", drafter=drafter,
                                                   depth=shape.depth, topk=shape.topk, tree_budget=shape.budget)
    result = session.generator(system).generate(prompts, tokens, stop_at_eos=False)
    return {"tokens_per_round": result.mean_accepted_length, "rounds": sum(result.rounds),
            "accept_at_depth": list(acceptance_by_depth(result.accept_lengths, shape.depth))}


def predict(model: AcceptanceModel, measured_tokens_per_round: float, shape: TreeShape) -> float:
    """Tokens per round of `shape`, scaled to the fitted shape's measurement (`CostTable.tokens_per_round_for`)."""
    return max(1.0, measured_tokens_per_round / model.tokens_per_round(FITTED) * model.tokens_per_round(shape))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--deployment", default="fixture-dflash")
    p.add_argument("--n-prompts", type=int, default=3, help="prompts per benchmark set")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (EOS ignored)")
    p.add_argument("--drafters", nargs="+", default=["model", "eagle3"])
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    deployment = load_deployment(args.deployment)
    session = Session.load(deployment, device=device)
    prompts = bench_prompt_ids(deployment.target, args.n_prompts)
    rows = []
    for name in args.drafters:
        kind = DrafterKind(name)
        fitted = measure(session, kind, FITTED, prompts, args.tokens)
        model = AcceptanceModel.fit(fitted["accept_at_depth"], FITTED, rank_decay(name))
        geometric = AcceptanceModel.fit(fitted["accept_at_depth"], FITTED, 1.0)  # r = 1, for comparison
        for shape in SHAPES:
            got = measure(session, kind, shape, prompts, args.tokens)
            predicted, flat = (predict(m, fitted["tokens_per_round"], shape) for m in (model, geometric))
            rows.append({"drafter": name, "shape": shape.label(), "depth": shape.depth, "topk": shape.topk,
                         "budget": shape.budget, "predicted": predicted, "measured": got["tokens_per_round"],
                         "error": predicted / got["tokens_per_round"] - 1, "rounds": got["rounds"],
                         "geometric": flat, "geometric_error": flat / got["tokens_per_round"] - 1})
            print(f"{name:7s} {shape.label():28s} predicted {predicted:5.2f} measured {got['tokens_per_round']:5.2f}",
                  flush=True)
        rows.append({"drafter": name, "shape": FITTED.label(), "fitted": True, "measured": fitted["tokens_per_round"],
                     "accept_at_depth": fitted["accept_at_depth"], "alpha": model.alpha, "decay": model.decay,
                     "rank_decay": model.rank, "residual": model.residual})
    doc = {"benchmark": "acceptance model: predicted vs measured tokens per round by tree shape",
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "provenance": capture(device, session.target.dtype), "deployment": args.deployment,
           "prompts": len(prompts), "tokens": args.tokens, "fitted_on": FITTED.label(), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "acceptance_check.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Acceptance model: predicted vs measured tokens per round", "",
             f"`{args.deployment}` on {len(prompts)} benchmark prompts x {args.tokens} tokens ({device.type}); fitted "
             f"on {FITTED.label()} per drafter, predicted as the cost model does.", ""]
    for name in args.drafters:
        fit = next(r for r in rows if r["drafter"] == name and r.get("fitted"))
        lines += [f"## {name}: measured {fit['measured']:.2f} on the fitted shape (alpha {fit['alpha']:.3f}, "
                  f"decay {fit['decay']:.3f}, rank decay {fit['rank_decay']:g}, rmse {fit['residual']:.3f})", "",
                  "| shape | predicted | measured | error | error at r = 1 |", "|---|---|---|---|---|"]
        shapes = [r for r in rows if r["drafter"] == name and not r.get("fitted")]
        lines += [f"| {r['shape']} | {r['predicted']:.2f} | {r['measured']:.2f} | {r['error']:+.1%} | "
                  f"{r['geometric_error']:+.1%} |" for r in shapes]
        mean = {k: sum(abs(r[k]) for r in shapes) / len(shapes) for k in ("error", "geometric_error")}
        lines += ["", f"Mean |error|: {mean['error']:.1%} at rank decay {fit['rank_decay']:g}, "
                  f"{mean['geometric_error']:.1%} at r = 1 (every rank as likely as the top one once those above "
                  "missed).", ""]
    lines.append("Written by `scripts/acceptance_check.py`.")
    (out / "acceptance_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
