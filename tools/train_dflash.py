"""Train a DFlash block drafter for a target on the target's own greedy continuations.

    python tools/train_dflash.py --out OUT                 # the fixture target, one GPU, <= 5 minutes
    python tools/train_dflash.py --smoke --out OUT         # a random tiny target on CPU, seconds
    python tools/train_dflash.py --out OUT --prompt-mix 0.5 --stop-at-eos --anchor-window 128
    python tools/train_dflash.py --out OUT --resume --total-minutes 20 --minutes 7   # per device call, 2-3 calls

Recipe (`shared/research/mechanisms.md` 1.4, after SpecForge's `OnlineDFlashModel`):
1. prompts: token windows of the offline corpus (`corpus.py`) of --min-prompt-len..--prompt-len
   tokens (log-uniform), half of them from a document's start as a user's prompt is; documents
   containing benchmark text dropped (`leakcheck.py`); every 20th document is held out. With
   --questions N also N prompts shaped like what users send (`question_prompts.py`: GSM8K/MBPP
   train questions and docstring'd functions, encoded by the benchmark's own `encode_example`, so
   they end in "Answer:", "Assistant:" ... as benchmark prompts do); --prompt-mix F draws that
   fraction of the training rows from them. Why: the target's continuation of a formatted
   question (an answer, then EOS) is not what it writes after a corpus window, and the shipped
   drafter is weakest exactly there (`scripts/dflash_positions.py`: offset-1 accuracy 0.32 in the
   first 32 generated tokens of benchmark prompts, 0.58 at 128-256).
2. data: greedy continuations from the target with the engine, every sequence cut to
   --prompt-len + --gen-tokens. On the target's own greedy text "next token" is "target argmax",
   so every label is an acceptance label.
3. step: the frozen target's features (outputs of `target_layer_ids`) for whole sequences; up to
   `--anchors` anchor positions per sequence among those whose next token was generated; block b
   = [token[a], MASK x (block-1)] at positions a..a+block-1, label at offset k = token[a+k];
   block tokens see context keys at positions < a and their own block (the SpecForge mask); loss =
   CE at offsets 1..block-1 weighted exp(-(k-1)/gamma) (--distill w: (1 - w) CE + w KL from the
   target's distribution at the position that predicted the token). Variable prefix (--prefix-max
   P): a block gets p in 0..P real tokens after its root (p = 0 half the time) and the loss covers
   offsets > p, weighted exp(-(k-p-1)/gamma): drafting after a partial accept, as newer public
   DFlash recipes train (`block_loss`). AdamW, warmup 4 %, cosine, clip 1.0. The draft layers
   start as the target's last layers (--init). Every sequence is --prompt-len + --gen-tokens
   long, so a short prompt gets a long continuation; the fixture's greedy text repeats itself
   (the next 8 tokens occurred before at most positions past the 64th generated token:
   `scripts/dflash_positions.py`); --anchor-window N keeps the anchors among the first N
   generated positions; --stop-at-eos puts no loss past a continuation's first EOS (the engine
   stops there; the text after it is not what a user is served).
4. resumable (--resume), for a training longer than one device call (10 minutes; each call a fresh
   machine that gets back only OUT): the same command in every call. The schedule is planned once,
   at the first slice's 30th step, over --total-minutes less the seconds spent making the data;
   each call trains --minutes (its slice), writing OUT/checkpoint.pt (`train_checkpoint.py`:
   drafter, AdamW state, step, planned steps, the loss curve, the sampling generator's state, the
   defining arguments and the data's SHA-256) every --checkpoint-minutes and at the slice's end;
   the data is OUT/data.pt unless --data names it. A call that ends before the schedule writes
   `training_log.json` with "status": "partial" and exits 0; the call that reaches the planned
   step (or overruns the whole budget by 5 %) evaluates and writes the drafter as a one-call run
   does, its log holding the whole curve and every slice's seconds. A checkpoint made with other
   defining arguments (`DEFINING`) or other data is refused (exit 2). Resuming gives the
   uninterrupted run's weights bit for bit on CPU (fixed --steps, --stop-after N ending a slice
   after N steps: tests/tools/test_train_dflash.py).
   OUT to carry for the fixture: data.pt ~7 MB (int16 ids), checkpoint ~28 MB in 2 parts.
5. out: the drafter in the public DFlash layout (learned mask embedding: the fixture vocabulary
   has no spare token), `training_log.json` with the loss curve and the held-out simulated
   acceptance length (SpecForge's `simulated_acc_len`; from the root, p = 0, whatever
   --prefix-max), and an engine check: DFlash outputs equal
   AR on a few held-out prompts, with the mean accepted length per round.
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
import train_checkpoint  # noqa: E402

from specpilot.config import BENCHMARK_SETS, TreeConstruction  # noqa: E402
from specpilot.engine.drafters.dflash import DFlashDrafter  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.models.dflash import build_target_layer_ids, random_dflash  # noqa: E402
from specpilot.models.dflash_checkpoint import load_dflash, write_dflash  # noqa: E402

START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def load_target(args, device):
    """(target, vocab for random prompts or None) for --smoke or a real checkpoint."""
    if args.smoke:
        from specpilot.models.random_checkpoint import random_model, tiny_config

        return random_model(tiny_config(max_position_embeddings=512), seed=args.seed).to(device).eval()
    from specpilot.models.fixture import resolve_checkpoint
    from specpilot.models.loading import load_model

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return load_model(resolve_checkpoint(args.target, "target"), device=device, dtype=dtype)


def offline_corpus(args) -> tuple[list[str], list[str]]:
    """(leak-checked corpus documents, the Python sources among them)."""
    import benchmark_prompts
    import corpus as corpus_mod
    import leakcheck

    corpus = corpus_mod.build_corpus(python_bytes=6_000_000, english_chars=2_000_000, seed=args.seed)
    docs = corpus.documents
    python = {id(d) for d in corpus.by_source["python_source"]}
    leaks = leakcheck.find_leaks(docs, benchmark_prompts.protected_texts())
    bad = {leak.document for leak in leaks}
    docs = [d for i, d in enumerate(docs) if i not in bad]
    log(f"corpus: {len(docs)} documents ({len(bad)} dropped by the leak check)")
    return docs, [d for d in docs if id(d) in python]


def corpus_prompts(args, n: int, docs: list[str], tok) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) prompts of --min-prompt-len..--prompt-len tokens from leak-checked corpus
    documents; half start at the document's start."""
    g = torch.Generator().manual_seed(args.seed)
    train, held = [], []
    for i in torch.randperm(len(docs), generator=g).tolist():
        ids = tok.encode(docs[i])
        lo, hi = math.log(args.min_prompt_len), math.log(args.prompt_len)
        n_tok = int(round(math.exp(lo + (hi - lo) * float(torch.rand((), generator=g)))))
        if len(ids) < n_tok:
            continue
        s = 0 if torch.rand((), generator=g) < 0.5 else int(torch.randint(0, len(ids) - n_tok + 1, (1,), generator=g))
        (held if i % 20 == 0 else train).append(ids[s : s + n_tok])
        if len(train) >= n and len(held) >= args.eval_prompts:
            break
    return train[:n], held[: args.eval_prompts]


def training_prompts(args) -> tuple[list[list[int]], list[list[int]], list[list[int]], list[list[int]]]:
    """(corpus train, corpus held-out, question train, question held-out) prompts: --prompts corpus
    windows and --questions train-split questions formatted as the benchmark formats its prompts
    (`question_prompts.py`), --eval-prompts held out of each kind that is drawn."""
    from question_prompts import question_prompts

    from specpilot.models.fixture import resolve_checkpoint
    from specpilot.models.tokenizer import Tokenizer

    docs, python_docs = offline_corpus(args)
    tok = Tokenizer.from_dir(resolve_checkpoint(args.target, "target"))
    train, held = corpus_prompts(args, args.prompts, docs, tok)
    q_train, q_held = ([], [])
    if args.questions:
        q_train, q_held = question_prompts(tok, python_docs, args.questions, args.eval_prompts, args.prompt_len, args.seed)
        log(f"questions: {len(q_train)} + {len(q_held)} formatted train-split prompts")
    return train, held, q_train, q_held


def generate(target, prompts: list[list[int]], args) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N,S], starts [N]): prompt + greedy continuation (no EOS stop) cut to S =
    --prompt-len + --gen-tokens, and each row's first generated position."""
    gen = Generator(target, cuda_graphs=target.device.type == "cuda")
    S = args.prompt_len + args.gen_tokens
    rows, starts = [], []
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths per batch
    for i in range(0, len(order), args.gen_batch):
        chunk = [prompts[j] for j in order[i : i + args.gen_batch]]
        out = gen.generate(chunk, S - min(map(len, chunk)), stop_at_eos=False).outputs
        rows += [(p + o)[:S] for p, o in zip(chunk, out)]
        starts += [len(p) for p in chunk]
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64)


def target_features(target, tokens: torch.Tensor, layer_ids, logits: bool = False):
    """[B,S,n*C] outputs of `layer_ids` from a causal forward of tokens [B,S] (HF hidden_states[i+1];
    id -1: the embedding), as `forward_causal(capture=layer_ids)` returns them, for a dense or a
    hybrid target; with `logits`, (features, the target's logits [B,S,V] at every position)."""
    out, feats = target.forward_causal(tokens, capture=tuple(layer_ids))
    return (feats, out) if logits else feats


def sample_anchors(S: int, starts: torch.Tensor, anchors: int, g: torch.Generator, window: int = 0,
                   ends: torch.Tensor | None = None) -> torch.Tensor:
    """[B,A] sorted anchor positions per row whose next token was generated (>= starts[b] - 1),
    with `window` > 0 only among the first `window` of them (the early part of a continuation),
    and with `ends` only those whose next token lies before ends[b]; a row with fewer such
    positions than A fills up with later ones, whose labels `block_loss` masks."""
    A = min(anchors, S - int(starts.max()), window or S)
    rows = []
    for b, start in enumerate(starts.tolist()):
        lo, hi = start - 1, S - 2
        if window:
            hi = min(hi, lo + window - 1)
        if ends is not None:
            hi = max(lo, min(hi, int(ends[b]) - 2))
        first = lo + torch.randperm(hi - lo + 1, generator=g)
        if len(first) < A:
            first = torch.cat([first, hi + 1 + torch.randperm(S - 2 - hi, generator=g)])
        rows.append(first[:A])
    return torch.stack(rows).sort(1).values


def block_logits(draft, target, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor, block: int,
                 prefix: torch.Tensor | None = None):
    """(logits [B,Q,V], labels [B,Q], offsets [B,Q]) of the blocks at `anchors [B,A]`, Q = A*block.

    Block b is [token[a], MASK...] at positions a..a+block-1; its tokens see context positions < a
    (the target's features at a do not exist at inference: token a is the root) and their own block.
    With `prefix [B,A]` (p per block), offsets 1..p hold the real tokens token[a+1..a+p] instead of MASK.
    """
    B, S = tokens.shape
    dev = tokens.device
    A = anchors.shape[1]
    k = torch.arange(block, device=dev)
    pos = (anchors[..., None] + k).reshape(B, A * block)  # [B,Q]
    labels = tokens.gather(1, pos.clamp(max=S - 1))
    labels = torch.where(pos < S, labels, torch.full_like(labels, -100))
    offset = k.repeat(A).expand(B, -1)
    q_anchor = anchors.repeat_interleave(block, 1)  # [B,Q]
    ctx = torch.arange(S, device=dev)[None, None, :] < q_anchor[..., None]  # [B,Q,S]
    bid = torch.arange(A, device=dev).repeat_interleave(block)
    own = (bid[:, None] == bid[None, :]).expand(B, -1, -1)  # [B,Q,Q]
    mask = torch.cat([ctx, own], -1)[:, None]
    if prefix is None:
        emb = draft.input_embeddings(target.embed_tokens, tokens.gather(1, anchors))  # [B,A,C]
        emb, given = emb.repeat_interleave(block, 1), offset == 0  # [B,Q,C], [B,Q]
    else:
        emb = draft.input_embeddings(target.embed_tokens, tokens.gather(1, pos.clamp(max=S - 1)))  # [B,Q,C]
        given = offset <= prefix.repeat_interleave(block, 1)
    noise = torch.where(given[..., None], emb, draft.mask_embedding.to(emb.dtype).expand_as(emb))
    ctx_pos = torch.arange(S, device=dev).expand(B, -1)
    hidden = draft.forward_dense(feats.to(emb.dtype), ctx_pos, noise, pos, mask)
    return draft.logits(target.lm_head, hidden).float(), labels, offset


def sample_prefix(anchors: torch.Tensor, S: int, prefix_max: int, g: torch.Generator) -> torch.Tensor | None:
    """[B,A] real tokens after the root per block for the variable-prefix objective: p = 0 with
    probability 1/2 (the engine's case), else uniform in 1..prefix_max; at most S - 2 - a, so every
    block keeps a label. None when prefix_max is 0 (the generator is not drawn from)."""
    if prefix_max <= 0:
        return None
    root = torch.rand(anchors.shape, generator=g) < 0.5
    p = torch.where(root, 0, torch.randint(1, prefix_max + 1, anchors.shape, generator=g)).to(anchors.device)
    return torch.minimum(p, S - 2 - anchors)


def block_weights(labels: torch.Tensor, offset: torch.Tensor, prefix: torch.Tensor, gamma: float):
    """(valid [B,Q], weight [B,Q]) of block tokens: a label exists and its offset k is drafted (k > p,
    `prefix [B,Q]` the block's p per token); weight exp(-(k - p - 1)/gamma), counted from the first
    drafted offset."""
    valid = (labels >= 0) & (offset > prefix)
    return valid, torch.exp(-(offset - 1 - prefix).clamp(min=0).float() / gamma) * valid


def teacher_logits(logits: torch.Tensor, anchors: torch.Tensor, block: int) -> torch.Tensor:
    """[B,Q,V] the target's logits that predicted each block token: position anchor + k - 1 for
    offset k (offset 0, unsupervised, takes the anchor's own row), from logits [B,S,V]."""
    B, S, V = logits.shape
    k = torch.arange(block, device=anchors.device)
    src = (anchors[..., None] + k - 1).clamp(min=0, max=S - 1).reshape(B, -1)  # [B,Q]
    return logits.gather(1, src[..., None].expand(-1, -1, V))


def block_loss(draft, target, tokens, starts, feats, args, g, teacher=None, ends=None):
    """(weighted loss, simulated acceptance length) of one batch of sequences whose generated part
    begins at `starts [B]` (with `ends [B]`, labels at positions >= ends[b] carry no loss). The loss
    per block token is CE against the target's token, or with --distill w and the target's logits
    `teacher [B,S,V]`, (1 - w) CE + w KL(target || drafter).

    Variable prefix (--prefix-max P > 0): block b gets p in 0..P real tokens after its root (p = 0
    half the time, `sample_prefix`) and the loss covers offsets > p only, weighted from offset p + 1
    (`block_weights`). Why: the drafter learns to draft after a partial accept, as newer public
    DFlash recipes train it; our engine always drafts from the root, so p = 0 stays the larger
    share. P = 0 draws nothing more from `g` and is today's loss bit for bit. The simulated
    acceptance length counts from the first drafted offset."""
    S = tokens.shape[1]
    anchors = sample_anchors(S, starts, args.anchors, g, args.anchor_window, ends).to(tokens.device)
    prefix = sample_prefix(anchors, S, getattr(args, "prefix_max", 0), g)  # [B,A] or None
    logits, labels, offset = block_logits(draft, target, tokens, feats, anchors, args.block_size, prefix)
    B, Q = labels.shape
    if ends is not None:
        pos = anchors.repeat_interleave(args.block_size, 1) + offset
        labels = torch.where(pos < ends.to(pos.device)[:, None], labels, torch.full_like(labels, -100))
    p = torch.zeros_like(offset) if prefix is None else prefix.repeat_interleave(args.block_size, 1)  # [B,Q]
    valid, w = block_weights(labels, offset, p, args.gamma)
    ce = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view(B, Q)
    if teacher is not None and args.distill > 0:
        t = torch.log_softmax(teacher_logits(teacher, anchors, args.block_size).float(), -1)  # [B,Q,V]
        kl = F.kl_div(torch.log_softmax(logits, -1), t, log_target=True, reduction="none").sum(-1)
        ce = (1 - args.distill) * ce + args.distill * kl
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        given = offset <= p  # the root and the prefix: accepted by construction
        hit = (((logits.argmax(-1) == labels) & valid) | given).view(B, -1, args.block_size)[..., 1:]
        p_block = p.view(B, -1, args.block_size)[..., 0]  # [B,A]
        counted = valid.view(B, -1, args.block_size).gather(-1, (p_block + 1)[..., None])[..., 0]  # not fill-ups
        acc_len = 1 + (hit.long().cumprod(-1).sum(-1) - p_block).float()[counted].mean()
    return loss, float(acc_len)


def make_data(target, args):
    """((train tokens, starts, is_question), (held tokens, starts), held prompts): read from --data
    when that file exists, else generated (and written to --data when given), so side-by-side runs
    share it (token ids stored as int16 or int32, returned as int64). Training rows of questions
    follow the corpus rows; held-out prompts alternate kinds."""
    if args.data and Path(args.data).is_file():
        d = torch.load(args.data)
        log(f"data: read {args.data}")
        question = d.get("question", torch.zeros(len(d["data"]), dtype=torch.bool))
        return (d["data"].long(), d["starts"], question), (d["held"].long(), d["held_starts"]), d["held_prompts"]
    if args.smoke:
        g = torch.Generator().manual_seed(args.seed)
        make = lambda n: torch.randint(1, target.config.vocab_size, (n, args.prompt_len), generator=g).tolist()  # noqa: E731
        train, held, q_train = make(args.prompts), make(args.eval_prompts), make(args.questions)
        q_held = make(args.eval_prompts) if args.questions else []
    else:
        train, held, q_train, q_held = training_prompts(args)
    held_prompts = [p for pair in zip(held, q_held) for p in pair] + held[len(q_held):] + q_held[len(held):]
    (data, starts), (held_t, held_starts) = generate(target, train + q_train, args), generate(target, held_prompts, args)
    question = torch.arange(len(data)) >= len(train)
    if args.data:  # token ids in the narrowest integer type that holds them: the file travels between calls
        ids = torch.int16 if target.config.vocab_size <= torch.iinfo(torch.int16).max else torch.int32
        tmp = Path(args.data).with_suffix(".tmp")
        torch.save({"data": data.to(ids), "starts": starts, "question": question, "held": held_t.to(ids),
                    "held_starts": held_starts, "held_prompts": held_prompts}, tmp)
        tmp.replace(args.data)
    return (data, starts, question), (held_t, held_starts), held_prompts


def eos_ends(tokens: torch.Tensor, starts: torch.Tensor, eos_ids) -> torch.Tensor:
    """[N] one past each row's first generated EOS (the EOS itself is a label: the engine drafts
    it), or S where the continuation has none."""
    N, S = tokens.shape
    gen = torch.arange(S)[None, :] >= starts[:, None]
    eos = torch.isin(tokens, torch.tensor(list(eos_ids), dtype=tokens.dtype)) & gen
    first = torch.where(eos, torch.arange(S).expand(N, -1), torch.full_like(tokens, S)).min(1).values
    return (first + 1).clamp(max=S)


def sample_rows(question: torch.Tensor, batch: int, mix: float, g: torch.Generator) -> torch.Tensor:
    """[batch] training rows: a question row with probability `mix`, else a corpus row."""
    q, c = question.nonzero().flatten(), (~question).nonzero().flatten()
    if len(q) == 0 or len(c) == 0:
        pool = q if len(c) == 0 else c
        return pool[torch.randint(0, len(pool), (batch,), generator=g)]
    pick_q = torch.rand(batch, generator=g) < mix
    return torch.where(pick_q, q[torch.randint(0, len(q), (batch,), generator=g)],
                       c[torch.randint(0, len(c), (batch,), generator=g)])


def bench_prompt_ids(target_spec: str, n: int) -> list[list[int]]:
    """Token ids of n prompts per benchmark set, seeded and formatted as `specpilot bench` draws them."""
    from specpilot.bench.datasets import select
    from specpilot.bench.prompts import encode_example
    from specpilot.models.fixture import resolve_checkpoint
    from specpilot.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(resolve_checkpoint(target_spec, "target"))
    return [list(encode_example(e, tok).ids) for e in select(BENCHMARK_SETS, n, 0)]


def acceptance(target, drafter_model, prompts, tokens: int, block: int, trees) -> dict:
    """Per (construction, budget) of `trees`: the engine's mean accepted length per round drafting
    with `drafter_model`, and how many outputs equal AR's (`tokens` new tokens per prompt)."""
    ar = Generator(target).generate(prompts, tokens).outputs
    out = {}
    for c, budget in trees:
        drafter = DFlashDrafter(drafter_model, target, block, budget, c)
        r = Generator(target, {block - 1: drafter}).generate(prompts, tokens)
        out[(c, budget)] = {"mean_accepted_length": r.mean_accepted_length,
                            "identical_to_ar": sum(a == b for a, b in zip(r.outputs, ar)), "prompts": len(prompts)}
    return out


def bench_check(target, drafter_dir, args, device) -> dict:
    """Mean accepted length per round of the shipped benchmark sets' prompts (--bench-eval per set,
    seeded as `specpilot bench`, --gen-tokens each): chain and DDTree at budgets 32 and 64."""
    loaded = load_dflash(drafter_dir, target, device=device, dtype=target.dtype)
    trees = ((TreeConstruction.CHAIN, args.block_size - 1), (TreeConstruction.BEST_FIRST, 32),
             (TreeConstruction.BEST_FIRST, 64))
    found = acceptance(target, loaded, bench_prompt_ids(args.target, args.bench_eval), args.gen_tokens,
                       args.block_size, trees)
    return {f"{c.value}-{budget}": r for (c, budget), r in found.items()}


# the arguments that define a run's data, model, objective and schedule: a resumed call must repeat them
DEFINING = ("target", "smoke", "layers", "features", "feature_layers", "init", "block_size", "prompts", "eval_prompts",
            "prompt_len", "min_prompt_len", "gen_tokens", "questions", "batch", "anchors", "steps", "total_minutes",
            "lr", "gamma", "distill", "seed", "anchor_window", "prompt_mix", "stop_at_eos", "prefix_max")


def data_digest(*tensors: torch.Tensor) -> str:
    """SHA-256 of the sequences a run trains and evaluates on (as int64): a resumed call must read
    the same data, wherever its file now lies."""
    import hashlib

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.long().contiguous().numpy().tobytes())
    return h.hexdigest()


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (drafter in the public DFlash layout + log)")
    p.add_argument("--target", default="fixture", help="target checkpoint directory or 'fixture'")
    p.add_argument("--smoke", action="store_true", help="a random tiny target on CPU, a few steps (tests)")
    p.add_argument("--device", default=None, help="cpu, cuda ... (default: cuda if available, cpu for --smoke)")
    p.add_argument("--layers", type=int, default=2, help="draft layers")
    p.add_argument("--features", type=int, default=5, help="target layers read (DFlash's spread over them)")
    p.add_argument("--feature-layers", help="comma-separated target layer ids (overrides --features)")
    p.add_argument("--init", choices=("target", "random"), default="target",
                   help="draft layers start as the target's last layers (default) or random")
    p.add_argument("--block-size", type=int, default=16, help="positions per block (root included)")
    p.add_argument("--prompts", type=int, default=12288, help="training prompts")
    p.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts")
    p.add_argument("--prompt-len", type=int, default=160, help="longest prompt (tokens)")
    p.add_argument("--min-prompt-len", type=int, default=8, help="shortest prompt (tokens)")
    p.add_argument("--gen-tokens", type=int, default=128, help="sequence length beyond --prompt-len")
    p.add_argument("--gen-batch", type=int, default=1024, help="prompts per generation batch")
    p.add_argument("--batch", type=int, default=64, help="sequences per step")
    p.add_argument("--anchors", type=int, default=80, help="anchor blocks per sequence")
    p.add_argument("--steps", type=int, default=0, help="training steps (0: as many as --total-minutes allow)")
    p.add_argument("--minutes", type=float, default=None,
                   help="this call's training minutes, its slice (default: --total-minutes, else 3.5)")
    p.add_argument("--total-minutes", type=float, default=None,
                   help="the whole training's minutes across calls, data making included: the cosine schedule is "
                        "planned over them less the data's seconds (default: --minutes of training alone)")
    p.add_argument("--resume", action="store_true",
                   help="continue OUT/checkpoint.pt when it exists, else start; write it every --checkpoint-minutes "
                        "and at the slice's end; --data defaults to OUT/data.pt. Repeat the same command per call")
    p.add_argument("--checkpoint-minutes", type=float, default=3.0, help="with --resume, checkpoint this often")
    p.add_argument("--stop-after", type=int, default=0,
                   help="end this call's slice after N steps (0: at --minutes; tests use it for a fixed slice)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak AdamW learning rate")
    p.add_argument("--gamma", type=float, default=7.0, help="offset k weighs exp(-(k-1)/gamma)")
    p.add_argument("--distill", type=float, default=0.0,
                   help="weight w of KL(target || drafter) in the loss, (1 - w) CE (0: CE on the target's tokens)")
    p.add_argument("--prefix-max", type=int, default=0,
                   help="variable-prefix objective: up to P real tokens after each block's root, loss past them "
                        "(p = 0 half the time; 0: off, the root alone as the engine drafts)")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts, anchors and initialisation")
    p.add_argument("--anchor-window", type=int, default=0,
                   help="anchors only among the first N generated positions (0: all of them)")
    p.add_argument("--questions", type=int, default=None,
                   help="train-split questions formatted as the benchmark's prompts, generated beside the --prompts "
                        "corpus windows (default: --prompts // 2 when --prompt-mix > 0, else 0)")
    p.add_argument("--prompt-mix", type=float, default=0.0,
                   help="fraction F of training rows drawn from the question prompts, 1 - F from corpus windows "
                        "(0: corpus rows only, also from a --data file that holds questions)")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="no loss past a continuation's first EOS, anchors before it (the engine stops there)")
    p.add_argument("--data", help="sequences file: read when it exists, else generated and written there")
    p.add_argument("--data-only", action="store_true", help="make --data and stop")
    p.add_argument("--bench-eval", type=int, default=0,
                   help="also measure acceptance on N prompts per benchmark set (0: skip)")
    args = p.parse_args(argv)
    if args.smoke:
        args.prompts, args.eval_prompts, args.prompt_len, args.min_prompt_len, args.gen_tokens = 12, 4, 16, 16, 24
        args.batch, args.anchors, args.block_size, args.steps = 4, 6, 4, args.steps or 6
        args.questions = None if args.questions is None else min(args.questions, 6)
    if args.questions is None:
        args.questions = args.prompts // 2 if args.prompt_mix > 0 else 0
    if args.minutes is None:
        args.minutes = args.total_minutes if args.total_minutes is not None else 3.5
    if not 0 <= args.prompt_mix <= 1:
        p.error("--prompt-mix must be in [0, 1]")
    if not 0 <= args.prefix_max <= args.block_size - 2:
        p.error(f"--prefix-max must be in [0, --block-size - 2 = {args.block_size - 2}]")
    if args.resume and not args.steps and args.total_minutes is None:
        p.error("--resume needs --total-minutes (the schedule across calls) or --steps")
    if args.resume and not args.data:
        args.data = str(Path(args.out) / "data.pt")
    return p, args


def main(argv=None) -> int:
    p, args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "checkpoint.pt"

    def refuse(msg: str):
        p.exit(2, f"{p.prog}: error: {msg}\n")

    ck = None
    if args.resume:
        try:
            ck = train_checkpoint.load(ckpt_path)
        except ValueError as e:
            refuse(str(e))
    if ck is not None:
        differ = [f"--{k.replace('_', '-')} {ck['args'].get(k)!r} (now {getattr(args, k)!r})"
                  for k in DEFINING if ck["args"].get(k) != getattr(args, k)]
        if differ:
            refuse(f"--resume: {ckpt_path} was trained with " + ", ".join(differ) + "; repeat its arguments or use another --out")
        if not Path(args.data).is_file():
            refuse(f"--resume: {ckpt_path} needs its data file {args.data} (carry it with the checkpoint)")
        log(f"resume: {ckpt_path} at step {ck['step']}/{ck['planned'] or '?'}")

    target = load_target(args, device).requires_grad_(False)
    L = target.config.num_layers
    ids = tuple(int(x) for x in args.feature_layers.split(",")) if args.feature_layers else build_target_layer_ids(L, args.features)
    t0 = time.perf_counter()
    (data, starts, question), (held, held_starts), held_prompts = make_data(target, args)
    gen_s = time.perf_counter() - t0
    log(f"data: {len(data)} ({int(question.sum())} of them questions) + {len(held)} sequences of {data.shape[1]} "
        f"tokens in {gen_s:.1f}s")
    if args.data_only:
        return 0
    digest = data_digest(data, starts, question, held, held_starts) if args.resume else None
    if ck is not None and ck["data_digest"] != digest:
        refuse(f"--resume: {args.data} is not the data {ckpt_path} was trained on")
    if args.prompt_mix > 0 and not question.any():
        raise SystemExit("--prompt-mix > 0 needs question rows in the data (--questions, or a --data file made with it)")
    eos = target.config.eos_token_ids
    ends = eos_ends(data, starts, eos) if args.stop_at_eos and eos else None
    held_ends = eos_ends(held, held_starts, eos) if args.stop_at_eos and eos else None

    draft = random_dflash(target.config, args.layers, args.block_size, ids, mask_token_id=None, seed=args.seed)
    if args.init == "target" and target.config.hybrid:
        log("--init target: a hybrid target's blocks are not dense layers; the draft layers start random")
    elif args.init == "target":  # start from the target's last blocks: a language model's layers, not noise
        L = target.config.num_layers
        for j, layer in enumerate(draft.layers):
            layer.load_state_dict(target.layers[L - args.layers + j].state_dict())
    draft = draft.to(device=device, dtype=torch.float32).train().requires_grad_(True)
    if not target.config.hybrid:  # a hybrid's tables are partial-rotary: the drafter keeps its own
        draft.rope_cos, draft.rope_sin = target.rope_cos.float(), target.rope_sin.float()
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, weight_decay=0.0)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    g = torch.Generator().manual_seed(args.seed + 1)
    # the schedule: --steps, or planned at this slice's 30th step from its speed over the training
    # seconds left of the whole budget (--total-minutes less the data's seconds, else --minutes)
    step, planned, curve, slices = 0, args.steps or None, [], []
    budget_s = args.total_minutes * 60 - gen_s if args.total_minutes is not None else args.minutes * 60
    if ck is not None:
        draft.load_state_dict(ck["draft"])
        opt.load_state_dict(ck["optimizer"])
        g.set_state(ck["generator"])
        torch.set_rng_state(ck["torch_rng"])
        step, planned, curve, slices, budget_s = ck["step"], ck["planned"], ck["curve"], ck["slices"], ck["budget_s"]
    prior_s = sum(s["seconds"] for s in slices)
    first, slice_s = step, args.minutes * 60

    def this_slice(seconds: float) -> dict:
        return {"steps": [first, step], "seconds": seconds, "data_seconds": gen_s, "device": str(device)}

    def checkpoint(seconds: float) -> None:
        train_checkpoint.save({"args": {k: getattr(args, k) for k in DEFINING}, "data_digest": digest, "step": step,
                               "planned": planned, "budget_s": budget_s, "curve": curve,
                               "slices": slices + [this_slice(seconds)], "draft": draft.state_dict(),
                               "optimizer": opt.state_dict(), "generator": g.get_state(),
                               "torch_rng": torch.get_rng_state()}, ckpt_path)

    timed = not args.steps or args.resume  # --steps alone runs to the end; a resumable slice still ends in time
    t0 = last_save = time.perf_counter()
    while step < (planned or 10**9):
        schedule = planned or 10**9
        if step - first == 10:
            t10 = time.perf_counter()
        if planned is None and step - first == 30:  # plan the cosine schedule from the speed after warm-up
            per_step = (time.perf_counter() - t10) / 20
            planned = schedule = max(40, step + int((budget_s - prior_s - (time.perf_counter() - t0)) / per_step))
        warm = max(1, int(0.04 * schedule))
        lr = args.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / schedule)))
        for group in opt.param_groups:
            group["lr"] = lr
        rows = sample_rows(question, args.batch, args.prompt_mix, g)
        tokens = data[rows].to(device)
        with torch.no_grad(), amp:
            feats = target_features(target, tokens, ids, logits=args.distill > 0)
            feats, teacher = feats if args.distill > 0 else (feats, None)
        with amp:
            loss, acc = block_loss(draft, target, tokens, starts[rows], feats, args, g, teacher,
                                   None if ends is None else ends[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % max(1, schedule // 50) == 0 or step == schedule:
            curve.append({"step": step, "loss": loss.item(), "train_acc_len": acc, "lr": lr})
            log(f"step {step}/{schedule} loss {loss.item():.3f} simulated acc_len {acc:.2f}")
        elapsed = time.perf_counter() - t0
        if args.stop_after and step - first >= args.stop_after:
            break
        if timed and (elapsed > slice_s * 1.05 or (not args.steps and prior_s + elapsed > budget_s * 1.05)):
            break
        if args.resume and time.perf_counter() - last_save > args.checkpoint_minutes * 60:
            checkpoint(elapsed)
            last_save = time.perf_counter()
    train_s = time.perf_counter() - t0
    if args.resume:  # also before the evaluation: a call killed there redoes only the evaluation
        checkpoint(train_s)
    slices.append(this_slice(train_s))
    train_total_s = prior_s + train_s
    finished = step >= (planned or 10**9) or (not args.steps and train_total_s > budget_s * 1.05)
    training = {"steps": step, "planned": planned, "seconds": train_total_s, "slices": slices, "curve": curve}
    if args.resume and not finished:
        record = {"status": "partial", "args": vars(args), "device": str(device), "target_layer_ids": list(ids),
                  "training": training, "total_seconds": time.perf_counter() - START}
        (out / "training_log.json").write_text(json.dumps(record, indent=2) + "\n")
        log(f"partial: step {step}/{planned or '?'} in {train_total_s:.0f}s of training; to continue, carry {out} "
            f"({ckpt_path.name}*, {Path(args.data).name}) and run the same command again")
        return 0

    draft.eval().requires_grad_(False)
    eval_args = argparse.Namespace(**{**vars(args), "prefix_max": 0})  # held out: the engine's case, from the root
    with torch.no_grad(), amp:
        ge = torch.Generator().manual_seed(args.seed + 2)
        evals = [block_loss(draft, target, held[i : i + args.batch].to(device), held_starts[i : i + args.batch],
                            target_features(target, held[i : i + args.batch].to(device), ids), eval_args, ge,
                            ends=None if held_ends is None else held_ends[i : i + args.batch])
                 for i in range(0, len(held), args.batch)]
    held_acc = sum(a for _, a in evals) / len(evals)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    write_dflash(draft, out / "dflash", dtype=dtype)
    # engine check: the shipped layout loads and drafts losslessly
    loaded = load_dflash(out / "dflash", target, device=device, dtype=target.dtype)
    trees = ((TreeConstruction.CHAIN, args.block_size - 1), (TreeConstruction.BEST_FIRST, 32))
    found = acceptance(target, loaded, held_prompts[:8], args.gen_tokens, args.block_size, trees)
    check = {c.value: {"identical_to_ar": r["identical_to_ar"] == r["prompts"],
                       "mean_accepted_length": r["mean_accepted_length"], "budget": budget}
             for (c, budget), r in found.items()}
    bench = bench_check(target, out / "dflash", args, device) if args.bench_eval else None
    data_s = slices[0]["data_seconds"]  # the call that made (or first read) the data
    record = {
        "status": "ok", "args": vars(args), "device": str(device), "target_layer_ids": list(ids),
        "data": {"sequences": len(data), "questions": int(question.sum()), "held_out": len(held), "seq_len": int(data.shape[1]), "seconds": data_s},
        "training": training,
        "heldout_simulated_acc_len": held_acc, "engine_check": check, "bench_check": bench,
        "total_seconds": time.perf_counter() - START,
    }
    (out / "training_log.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"held-out simulated acc_len {held_acc:.2f}; engine {json.dumps(check)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
