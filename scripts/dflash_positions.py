"""Where a DFlash drafter loses acceptance: per-position accuracy on the benchmark sets' own AR text.

    python scripts/dflash_positions.py --out DIR [--drafter fixture-dflash] [--n-prompts 2] [--tokens 128]

For each benchmark prompt the target's greedy continuation is computed, then every generated
position is an anchor: the drafter's block at that anchor (the training forward, which equals the
engine's: `tests/tools/test_train_dflash.py`) is compared with the target's tokens. Reports
- accuracy at each block offset 1..block-1 (argmax == the target's token, each offset on its own);
- the chain's accepted length averaged over every anchor (1 + the matching prefix);
- the same split by whether the next 8 tokens already occurred earlier in the text ("looping":
  a small target's greedy text repeats itself), and
- offset accuracy with the root's embedding replaced by the mask embedding (how much the drafter
  uses the root token);
- the chain's accepted length per round along the engine's own walk over the same text (the first
  root is the last prompt token, each next one the token after a round's accepted drafts: anchors
  that follow a miss),
  beside the engine's measured mean accepted length with the chain on the same prompts. Walk and
  engine agree when the training forward is the engine's; "every anchor" exceeds both when long
  accepted runs cluster (the walk spends few rounds in them).
Runs on CPU in float32 (the fixture) or on a GPU. Writes DIR/dflash_positions.json and .md.
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
from dflash_objective import block_logits, target_features  # noqa: E402
from train_data import bench_prompt_ids  # noqa: E402

from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.config import TreeConstruction  # noqa: E402
from specpilot.engine.drafters.dflash import DFlashDrafter  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.models.dflash_checkpoint import load_dflash  # noqa: E402
from specpilot.models.fixture import resolve_checkpoint  # noqa: E402
from specpilot.models.loading import load_model  # noqa: E402

LOOP_NGRAM = 8


class _MaskAsRoot(torch.nn.Module):
    """An embedding that returns the drafter's mask embedding for every token (root ablation)."""

    def __init__(self, mask: torch.Tensor):
        super().__init__()
        self.mask = mask

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mask.expand(*tokens.shape, -1).clone()


def looping(seq: list[int], n: int = LOOP_NGRAM) -> list[bool]:
    """[i] = the n tokens starting at i occurred earlier in `seq` (False where fewer than n remain)."""
    seen, out = set(), []
    for i in range(len(seq)):
        gram = tuple(seq[i : i + n])
        out.append(len(gram) == n and gram in seen)
        if len(gram) == n:
            seen.add(gram)
    return out


def block_hits(draft, target, tokens: torch.Tensor, feats: torch.Tensor, start: int, block: int,
               ablate_root: bool = False) -> torch.Tensor:
    """[A, block-1] bool: the drafter's argmax == the text tokens [1,S] at offsets 1.. for every
    anchor from start-1 (the last prompt token) on whose whole block lies inside the text, given
    the target's features [1,S,nC] of the text."""
    anchors = torch.arange(start - 1, tokens.shape[1] - block + 1, device=target.device)[None]
    embed = target.embed_tokens
    if ablate_root:
        target._modules["embed_tokens"] = _MaskAsRoot(draft.mask_embedding)
    try:
        logits, labels, _ = block_logits(draft, target, tokens, feats, anchors, block)
    finally:
        target._modules["embed_tokens"] = embed
    return (logits.argmax(-1) == labels).view(-1, block)[:, 1:]


def walk(hits: torch.Tensor, tokens: int) -> tuple[int, int]:
    """(tokens committed, rounds) of the engine's chain over `tokens` new tokens, from per-anchor
    hits [A, block-1] whose row 0 is the last prompt token: the engine's first root (the prefill
    covers the tokens before it), and each round's root sits right after its accepted drafts and
    commits them and the bonus token."""
    run = hits.long().cumprod(-1).sum(-1)  # [A] drafts the chain accepts at each anchor
    committed, rounds, a = 0, 0, 0
    while committed < tokens:
        if a >= run.shape[0]:
            raise ValueError("text too short for the walk: generate block_size more tokens")
        step = 1 + int(run[a])
        committed, rounds, a = committed + step, rounds + 1, a + step
    return min(committed, tokens), rounds


def summarize(hits: torch.Tensor) -> dict:
    if hits.shape[0] == 0:
        return {"anchors": 0}
    chain = 1 + hits.long().cumprod(-1).sum(-1).float()
    return {"anchors": int(hits.shape[0]), "offset_accuracy": [round(float(x), 4) for x in hits.float().mean(0)],
            "chain_accepted_length": round(float(chain.mean()), 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="fixture")
    p.add_argument("--drafter", default="fixture-dflash", help="DFlash directory or a shipped name")
    p.add_argument("--n-prompts", type=int, default=2, help="prompts per benchmark set")
    p.add_argument("--tokens", type=int, default=128, help="greedy tokens generated per prompt")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_model(resolve_checkpoint(args.target, "target"), device=device, dtype=dtype)
    draft = load_dflash(resolve_checkpoint(args.drafter, "dflash"), target, device=device, dtype=dtype)
    block = draft.spec.block_size
    prompts = bench_prompt_ids(args.target, args.n_prompts)
    # block more tokens than the report covers, so the walk's last rounds see whole blocks
    outs = Generator(target).generate(prompts, args.tokens + block, stop_at_eos=False).outputs
    chain = DFlashDrafter(draft, target, block, block - 1, TreeConstruction.CHAIN)
    engine = Generator(target, {block - 1: chain}).generate(prompts, args.tokens, stop_at_eos=False)
    split = {"all": [], "looping": [], "fresh": [], "root_ablated": []}
    committed = rounds = 0
    with torch.inference_mode():
        for prompt, out in zip(prompts, outs):
            seq = prompt + out
            tokens = torch.tensor([seq], device=target.device)
            feats = target_features(target, tokens, draft.feature_layers)
            every = block_hits(draft, target, tokens, feats, len(prompt), block)
            c, r = walk(every, args.tokens)
            committed, rounds = committed + c, rounds + r
            hits = every[: args.tokens - block + 2]  # anchors whose block lies in the first --tokens
            loop = torch.tensor(looping(seq)[len(prompt) : len(prompt) + hits.shape[0]], device=hits.device)
            split["all"].append(hits)
            split["looping"].append(hits[loop])
            split["fresh"].append(hits[~loop])
            split["root_ablated"].append(block_hits(draft, target, tokens, feats, len(prompt), block,
                                                    ablate_root=True)[: hits.shape[0]])
    doc = {"benchmark": "DFlash accuracy per block offset on the benchmark sets' AR text",
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "provenance": capture(device, dtype),
           "drafter": args.drafter, "prompts": len(prompts), "tokens": args.tokens, "block_size": block,
           "loop_ngram": LOOP_NGRAM, **{k: summarize(torch.cat(v)) for k, v in split.items()},
           "walk": {"tokens": committed, "rounds": rounds, "chain_accepted_length": round(committed / rounds, 4)},
           "engine_chain": {"tokens": engine.num_tokens, "rounds": sum(engine.rounds),
                            "chain_accepted_length": round(engine.mean_accepted_length, 4),
                            "identical_to_ar": sum(e == o[: args.tokens] for e, o in zip(engine.outputs, outs))}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dflash_positions.json").write_text(json.dumps(doc, indent=2) + "\n")
    shown = min(8, block - 1)
    lines = ["# DFlash accuracy per block offset", "",
             f"drafter `{args.drafter}` on {len(prompts)} benchmark prompts x {args.tokens} greedy tokens ({device.type}, "
             f"{str(dtype).removeprefix('torch.')}); every generated position is an anchor.", "",
             "| anchors | count | chain accepted length | " + " | ".join(f"offset {k}" for k in range(1, shown + 1)) + " |",
             "|---|---|---|" + "---|" * shown]
    for k in split:
        s = doc[k]
        if not s["anchors"]:
            continue
        acc = " | ".join(f"{x:.2f}" for x in s["offset_accuracy"][:shown])
        lines.append(f"| {k.replace('_', ' ')} | {s['anchors']} | {s['chain_accepted_length']:.2f} | {acc} |")
    lines += ["", f"looping: the next {LOOP_NGRAM} tokens already occurred earlier in the text; root ablated: the "
              "root token's embedding replaced by the mask embedding.", "",
              f"Chain accepted length per round: every anchor {doc['all']['chain_accepted_length']:.2f}; along the "
              f"engine's walk over the same text {doc['walk']['chain_accepted_length']:.2f} "
              f"({doc['walk']['rounds']} rounds); the engine, measured {doc['engine_chain']['chain_accepted_length']:.2f} "
              f"({doc['engine_chain']['rounds']} rounds, {doc['engine_chain']['identical_to_ar']}/{len(prompts)} "
              "outputs identical to AR).", "", "Written by `scripts/dflash_positions.py`."]
    (out / "dflash_positions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
