"""Train an EAGLE-3 head for a target on the target's own greedy continuations.

    python tools/train_eagle3.py --out OUT                 # the fixture target, one GPU, <= 5 minutes
    python tools/train_eagle3.py --smoke --out OUT         # a random tiny target on CPU, seconds

Recipe (`shared/research/mechanisms.md` 2.2, after SafeAILab's `traineagle3` and SpecForge):
1. prompts and data: those of `train_data.py` (leak-checked corpus windows, greedy continuations
   of `--gen-tokens` from the target with the engine). On the target's own greedy text "next
   token" is "target argmax", so hard labels are exactly acceptance labels.
2. head: one layer at the target's width, `fc` 3C -> C over the inputs of target layers
   (2, L//2, L-3), `lm_head` initialised from the target's embedding rows; the target's embedding
   is shared and frozen. Its vocabulary is the target's, or with `--draft-vocab N` the N target
   tokens most frequent in the generated parts of the training sequences (d2t / t2d): labels
   outside it carry no loss and count as misses in top-1 and acceptance, as in the engine. A
   hybrid target (Gated DeltaNet) works the same: the head is a dense layer with its own RoPE.
3. step, a training-time test of length `--ttt`: step 0 runs slot t = (feature of token t,
   embedding of token t+1) at position t, causally, and predicts token t+2; step j >= 1 feeds the
   head's own output of step j-1 at the same row with the embedding of token t+1+j at position
   t+j, attending to the step-0 keys of rows <= t and to its own row's keys of steps 1..j — what a
   drafted path sees at inference — and predicts token t+2+j. Loss = sum_j decay^j CE_j over
   labels in the generated part. AdamW, warmup 4 %, cosine, clip 1.0.
4. out: OUT/eagle3 in the public layout, `training_log.json` with the loss curve, the held-out
   top-1 per step (step 0 = the next-token agreement) and the simulated chain acceptance length,
   and an engine check: EAGLE-3 outputs equal AR on held-out prompts, with the mean accepted
   length per round for a chain and for trees.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]
os.environ.setdefault("SPECPILOT_COMPILE", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import train_data  # noqa: E402  (data generation, and the clock of every log line)
from dflash_objective import target_features  # noqa: E402  (the target's feature forward)

from specpilot.engine.drafters.eagle3 import Eagle3Drafter  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.models.eagle3 import default_layer_ids, random_eagle3  # noqa: E402
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3  # noqa: E402

log = train_data.log
ENGINE_SHAPES = {"chain": (6, 1, 6), "tree": (6, 4, 16), "stock": (5, 4, 7), "wide": (7, 8, 64)}  # depth, topk, budget


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
    """Attention of step len(ks) - 1: q [B,T,H,D] over the step-0 keys of rows <= t and the
    same row's keys of steps 1.. (ks, vs: per step [B,T,Hkv,D]) -> [B,T,H*D]."""
    B, T, H, D = q.shape
    G = H // ks[0].shape[2]
    rep = lambda x: x.transpose(1, 2).repeat_interleave(G, 1)  # noqa: E731  [B,H,T,D], head h -> kv h // G
    qh = q.transpose(1, 2)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = [(qh @ rep(ks[0]).transpose(-1, -2)).masked_fill(~causal, float("-inf"))]  # [B,H,T,T]
    scores += [(qh * rep(k)).sum(-1, keepdim=True) for k in ks[1:]]  # [B,H,T,1] each: the diagonal
    w = torch.softmax(torch.cat(scores, -1).float() * D**-0.5, -1).to(q.dtype)
    o = w[..., :T] @ rep(vs[0])
    for i, v in enumerate(vs[1:]):
        o = o + w[..., T + i, None] * rep(v)
    return o.transpose(1, 2).reshape(B, T, H * D)


def ttt_logits(draft, target, tokens: torch.Tensor, feats: torch.Tensor, ttt: int):
    """[(logits [B,T,V], labels [B,T])] of steps 0..ttt-1 over slots t = 0..S-2 of tokens [B,S]
    with the target's features [B,S,n*C] (labels -100 past the sequence)."""
    B, S = tokens.shape
    T = S - 1
    t = torch.arange(T, device=tokens.device)
    h = draft.fuse(feats[:, :T])
    ks, vs, out = [], [], []
    for j in range(ttt):
        fed = tokens[:, (t + 1 + j).clamp(max=S - 1)]  # token t+1+j
        label_at = t + 2 + j
        labels = torch.where(label_at < S, tokens[:, label_at.clamp(max=S - 1)], -100)
        q, k, v, residual = draft.project(target.embed_tokens(fed), h, (t + j).expand(B, T))
        ks.append(k)
        vs.append(v)
        h = draft.finish(residual, draft.midlayer.self_attn.o_proj(ttt_attention(q, ks, vs)))
        out.append((draft.logits(h), labels))
    return out


def ttt_loss(draft, target, tokens, starts, feats, args):
    """(weighted CE, per-step top-1 [ttt], simulated chain acceptance length) of one batch whose
    generated part begins at `starts [B]` (labels only there)."""
    starts = starts.to(tokens.device)[:, None]
    steps = ttt_logits(draft, target, tokens, feats, args.ttt)
    ids = draft.token_ids()  # [Vd] target id of each draft id; None: the target's vocabulary
    to_draft = None
    if ids is not None:  # target id -> draft id, -100 where the draft vocabulary lacks it
        to_draft = torch.full((draft.config.vocab_size,), -100, dtype=torch.int64, device=tokens.device)
        to_draft[ids] = torch.arange(ids.numel(), device=tokens.device)
    loss, top1, hits = 0.0, [], []
    for j, (logits, labels) in enumerate(steps):
        labels = labels.masked_fill(torch.arange(labels.shape[1], device=labels.device)[None] + 2 + j < starts, -100)
        valid = labels >= 0
        targets = labels if to_draft is None else torch.where(valid, to_draft[labels.clamp(min=0)], -100)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        loss = loss + args.decay**j * ce
        with torch.no_grad():
            pred = logits.argmax(-1) if ids is None else ids[logits.argmax(-1)]
            hit = (pred == labels) & valid
            top1.append(float(hit.sum() / valid.sum().clamp(min=1)))
            hits.append(hit)
    with torch.no_grad():  # rows whose every step has a label: accepted length of a chain of ttt drafts
        full = steps[-1][1] >= 0
        full &= torch.arange(full.shape[1], device=full.device)[None] + 2 >= starts
        run = torch.stack(hits, -1).long().cumprod(-1).sum(-1).float()
        acc_len = float(1 + run[full].mean()) if bool(full.any()) else float("nan")
    return loss, top1, acc_len


def draft_vocab_ids(data: torch.Tensor, starts: torch.Tensor, vocab_size: int, n: int) -> torch.Tensor:
    """The n target ids most frequent in the generated parts of `data [N,S]` (from `starts [N]` on),
    sorted: a reduced draft vocabulary (EAGLE-3's d2t)."""
    generated = torch.arange(data.shape[1])[None] >= starts[:, None]
    counts = torch.bincount(data[generated].flatten(), minlength=vocab_size)
    return counts.topk(n).indices.sort().values


def new_head(target, layer_ids, args, draft_vocab: torch.Tensor | None = None, device="cpu"):
    """A float32 EAGLE-3 head for `target` to train: norms at 1, lm_head = the target's embedding
    rows of its vocabulary."""
    draft = random_eagle3(target.config, layer_ids, draft_vocab=draft_vocab,
                          intermediate_size=args.intermediate_size or None, seed=args.seed)
    with torch.no_grad():
        for name, prm in draft.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
        rows = target.embed_tokens.weight.float()
        draft.lm_head.weight.copy_(rows if draft_vocab is None else rows[draft_vocab.to(rows.device)])
    draft = draft.to(device=device, dtype=torch.float32).train().requires_grad_(True)
    if not target.config.hybrid:  # a hybrid's tables are partial-rotary: the head keeps its own
        draft.rope_cos, draft.rope_sin = target.rope_cos.float(), target.rope_sin.float()
    return draft


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


def train_head(draft, target, data: torch.Tensor, starts: torch.Tensor, args, device) -> dict:
    """AdamW on `data [N,S]` (generated from `starts [N]` on) for --steps, or as many as --minutes
    allow (the cosine schedule planned from the speed of steps 10-30); {steps, seconds, curve}."""
    capture = draft.feature_layers  # layer i's input = layer i-1's output (-1: the embedding)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, weight_decay=0.0)
    amp = autocast(device)
    g = torch.Generator().manual_seed(args.seed + 1)
    budget_s, curve, step = args.minutes * 60, [], 0
    t0 = time.perf_counter()
    planned = args.steps or 10**9
    while step < planned:
        if step == 10:
            t10 = time.perf_counter()
        if not args.steps and step == 30:  # plan the cosine schedule from the speed after warm-up
            per_step = (time.perf_counter() - t10) / 20
            planned = max(40, 30 + int((budget_s - (time.perf_counter() - t0)) / per_step))
        warm = max(1, int(0.04 * planned))
        lr = args.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / planned)))
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, len(data), (args.batch,), generator=g)
        tokens = data[rows].to(device)
        with torch.no_grad(), amp:
            feats = target_features(target, tokens, capture)
        with amp:
            loss, top1, acc = ttt_loss(draft, target, tokens, starts[rows], feats, args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % max(1, planned // 50) == 0 or step == planned:
            curve.append({"step": step, "loss": loss.item(), "top1": top1, "train_acc_len": acc, "lr": lr})
            log(f"step {step}/{planned} loss {loss.item():.3f} top1 {top1[0]:.3f} simulated acc_len {acc:.2f}")
        if not args.steps and time.perf_counter() - t0 > budget_s * 1.05:
            break
    return {"steps": step, "seconds": time.perf_counter() - t0, "curve": curve}


def evaluate_head(draft, target, held: torch.Tensor, held_starts: torch.Tensor, args, device):
    """(top-1 per training-time-test step [ttt], simulated chain acceptance length) on held-out
    sequences; the head is left in eval mode."""
    draft.eval().requires_grad_(False)
    with torch.no_grad(), autocast(device):
        evals = []
        for i in range(0, len(held), args.batch):
            tokens = held[i : i + args.batch].to(device)
            _, top1, acc = ttt_loss(draft, target, tokens, held_starts[i : i + args.batch],
                                    target_features(target, tokens, draft.feature_layers), args)
            evals.append((top1, acc, len(tokens)))
    n = sum(e[2] for e in evals)
    return [sum(e[0][j] * e[2] for e in evals) / n for j in range(args.ttt)], sum(e[1] * e[2] for e in evals) / n


def engine_check(head, target, prompts: list[list[int]], tokens: int, shapes=None) -> dict:
    """Per (depth, topk, budget) of `shapes`: do EAGLE-3 outputs equal AR's, and the mean accepted
    length per round, over `prompts` (`tokens` new tokens each)."""
    ar = Generator(target).generate(prompts, tokens).outputs
    check = {}
    for name, (depth, topk, budget) in (shapes or ENGINE_SHAPES).items():
        r = Generator(target, {depth: Eagle3Drafter(head, target, depth, topk, budget)}).generate(prompts, tokens)
        check[name] = {"identical_to_ar": r.outputs == ar, "mean_accepted_length": r.mean_accepted_length,
                       "depth": depth, "topk": topk, "budget": budget}
    return check


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (OUT/eagle3 in the public layout + log)")
    p.add_argument("--target", default="fixture", help="target checkpoint directory or 'fixture'")
    p.add_argument("--smoke", action="store_true", help="a random tiny target on CPU, a few steps (tests)")
    p.add_argument("--device", default=None, help="cpu, cuda ... (default: cuda if available, cpu for --smoke)")
    p.add_argument("--feature-layers", help="comma-separated target layers whose inputs are fused (default 2,L//2,L-3)")
    p.add_argument("--intermediate-size", type=int, default=0, help="head MLP width (default: the target's)")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="draft vocabulary: the N most frequent generated target tokens (0: the target's)")
    p.add_argument("--prompts", type=int, default=12288, help="training prompts")
    p.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts")
    p.add_argument("--prompt-len", type=int, default=160, help="longest prompt (tokens)")
    p.add_argument("--min-prompt-len", type=int, default=8, help="shortest prompt (tokens)")
    p.add_argument("--gen-tokens", type=int, default=128, help="sequence length beyond --prompt-len")
    p.add_argument("--gen-batch", type=int, default=1024, help="prompts per generation batch")
    p.add_argument("--batch", type=int, default=64, help="sequences per step")
    p.add_argument("--ttt", type=int, default=7, help="training-time test length (steps per slot)")
    p.add_argument("--decay", type=float, default=0.8, help="step j's loss weighs decay^j")
    p.add_argument("--steps", type=int, default=0, help="training steps (0: as many as --minutes allow)")
    p.add_argument("--minutes", type=float, default=3.5, help="training wall-clock budget when --steps is 0")
    p.add_argument("--lr", type=float, default=6e-4, help="peak AdamW learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts, batches and initialisation")
    p.add_argument("--data", help="sequences file (train_dflash.py --data): read when it exists, else written")
    args = p.parse_args(argv)
    if args.smoke:
        args.prompts, args.eval_prompts, args.prompt_len, args.min_prompt_len, args.gen_tokens = 12, 4, 16, 16, 24
        args.batch, args.steps = 4, args.steps or 6
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    target = train_data.load_target(args, device).requires_grad_(False)
    L = target.config.num_layers
    ids = tuple(int(x) for x in args.feature_layers.split(",")) if args.feature_layers else default_layer_ids(L)
    t0 = time.perf_counter()
    args.questions = 0  # corpus windows only (train_dflash's --questions is DFlash's)
    (data, starts, _), (held, held_starts), held_prompts = train_data.make_data(target, args)
    gen_s = time.perf_counter() - t0
    log(f"data: {len(data)} + {len(held)} sequences of {data.shape[1]} tokens in {gen_s:.1f}s")

    vocab = draft_vocab_ids(data, starts, target.config.vocab_size, args.draft_vocab) if args.draft_vocab else None
    draft = new_head(target, ids, args, vocab, device)
    run = train_head(draft, target, data, starts, args, device)
    held_top1, held_acc = evaluate_head(draft, target, held, held_starts, args, device)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    write_eagle3(draft, out / "eagle3", dtype=dtype)
    # engine check: the shipped layout loads and drafts losslessly
    loaded = load_eagle3(out / "eagle3", target, device=device, dtype=target.dtype)
    check = engine_check(loaded, target, held_prompts[:8], args.gen_tokens)
    record = {
        "status": "ok", "args": vars(args), "device": str(device), "layer_ids": list(ids),
        "data": {"sequences": len(data), "held_out": len(held), "seq_len": int(data.shape[1]), "seconds": gen_s},
        "training": run, "draft_vocab_size": draft.spec.draft_vocab_size,
        "heldout_top1": held_top1[0], "heldout_top1_by_step": held_top1, "heldout_simulated_acc_len": held_acc,
        "engine_check": check, "total_seconds": time.perf_counter() - train_data.START,
    }
    (out / "training_log.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"held-out top-1 {held_top1[0]:.3f}, simulated chain acc_len {held_acc:.2f}; engine {json.dumps(check)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
