"""The training data of the drafter trainers (`train_dflash.py`, `train_eagle3.py`): prompts, the
target's greedy continuations, the sequences file, and the clock every log line reads.

    (data, starts, question), (held, held_starts), held_prompts = make_data(target, args)
    log(msg)   # "[seconds since START] msg"; train_hybrid.py sets START to train_fixture's clock

`args` are a trainer's flags (`train_dflash.py --help`: --prompts, --prompt-len, --data ...).

1. prompts (`training_prompts`): token windows of the offline corpus (`corpus.py`) of
   --min-prompt-len..--prompt-len tokens (log-uniform), half of them from a document's start as a
   user's prompt is; documents containing benchmark text dropped (`leakcheck.py`); every 20th
   document is held out. With --questions N also N prompts shaped like what users send
   (`question_prompts.py`: GSM8K/MBPP train questions and docstring'd functions, encoded by the
   benchmark's own `encode_example`, so they end in "Answer:", "Assistant:" ... as benchmark
   prompts do); --prompt-mix F draws that fraction of the training rows from them (`sample_rows`).
   Why: the target's continuation of a formatted question (an answer, then EOS) is not what it
   writes after a corpus window, and the shipped drafter is weakest exactly there
   (`scripts/dflash_positions.py`: offset-1 accuracy 0.32 in the first 32 generated tokens of
   benchmark prompts, 0.58 at 128-256).
2. data (`generate`, `make_data`): greedy continuations from the target with the engine, every
   sequence cut to --prompt-len + --gen-tokens. On the target's own greedy text "next token" is
   "target argmax", so every label is an acceptance label. Read from --data when that file exists,
   else generated and written there, so side-by-side runs share it; `data_digest` fingerprints it
   for a resumed run. `eos_ends` marks each continuation's first EOS (--stop-at-eos).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from specpilot.config import BENCHMARK_SETS
from specpilot.engine.generator import Generator

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


def data_digest(*tensors: torch.Tensor) -> str:
    """SHA-256 of the sequences a run trains and evaluates on (as int64): a resumed call must read
    the same data, wherever its file now lies."""
    import hashlib

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.long().contiguous().numpy().tobytes())
    return h.hexdigest()


def bench_prompt_ids(target_spec: str, n: int) -> list[list[int]]:
    """Token ids of n prompts per benchmark set, seeded and formatted as `specpilot bench` draws them."""
    from specpilot.bench.datasets import select
    from specpilot.bench.prompts import encode_example
    from specpilot.models.fixture import resolve_checkpoint
    from specpilot.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(resolve_checkpoint(target_spec, "target"))
    return [list(encode_example(e, tok).ids) for e in select(BENCHMARK_SETS, n, 0)]
