"""Train the hybrid fixture in one GPU call: a Qwen3.5-layout Gated DeltaNet target that shares the
dense fixture's tokenizer and 2-layer draft model, and an EAGLE-3 head for it.

    python tools/train_hybrid.py --out OUT --pack-to PARTS   # the real run, one H100/H200, <= 7.5 min
    python tools/train_hybrid.py --smoke --out OUT           # the whole pipeline, tiny, on CPU (~30 s)
    python tools/fixture_pack.py unpack PARTS                # install hybrid/, hybrid_eagle3/ in the fixture

OUT gets hybrid/ (HF directory, bf16, the dense fixture's tokenizer files), hybrid_eagle3/ (the
public EAGLE-3 layout) and training_log.json; --pack-to writes the same two directories (the log
inside hybrid/) as <= 15 MiB parts and a manifest (`fixture_pack.py`): the bf16 hybrid is ~18 MB,
more than one file a GPU call may return.

Stages, each timed in the log:
1. data: the dense fixture's corpus, leak check and held-out split (`train_fixture.prepare_corpus`
   at the dense run's sizes and seed, so the held-out documents are ones neither model trained on;
   the log says whether their tokens equal the shipped `heldout.safetensors`), encoded with the
   dense fixture's tokenizer: no new tokenizer, since the hybrid shares the dense draft model.
2. hybrid: Qwen3.5 layout, 8 layers x 256 wide, (3 Gated DeltaNet + 1 gated attention) x 2; GDN
   2 key / 4 value heads of 64, conv 4; attention 4 query / 2 kv heads of 64, RoPE on a quarter of
   each head, output gate; MLP 768; tied embeddings; 8.9M parameters. Loss = CE + w KL(dense
   target || hybrid) (`train_fixture.distill_loss` with alpha = w / (1 + w), i.e. that loss over
   1 + w), the dense target's logits computed on the fly under no_grad. Why the KL: the dense
   drafter was distilled from the dense target, so a hybrid whose distribution stays near the dense
   target's keeps its greedy text where that drafter predicts well.
3. EAGLE-3 head: `train_eagle3`'s recipe (features: inputs of layers 2, L//2, L-3; a training-time
   test of 7 steps) on greedy continuations by the shipped (bf16) hybrid of prompts cut from the
   training documents, held-out prompts from the held-out documents, decoded a batch at a time
   (`greedy_rows`); draft vocabulary: the 2048 tokens most frequent in the continuations (d2t /
   t2d), which keeps the head near 3 MB.
4. checks, on the checkpoints as saved (float32 copies of the bf16 weights, TF32 off): held-out
   CE of the hybrid and the dense target on the same windows (the dense run's 4096-token ones,
   positions past the training length reported apart), the dense drafter's top-1 agreement with
   each, the head's held-out top-1; `Generator` decoding the hybrid with the dense drafter (chain
   of 5; tree of depth 5, top-4, budget 16; the dense fixture's stock 5/4/7) and with the head,
   against AR, on held-out prompts and the first prompt of each benchmark set, the dense pair on the
   same prompts for comparison; a row that differs from AR is reported with the target's top-2
   margin where it diverges (a near-tie or a bug); sample outputs.

Sequence length 2560, not the dense fixture's 4096: `forward_causal` runs each GDN layer through
`gdn_chunked.chunked_scan`, whose state recurrence is a Python loop over T/64 chunks. A training
step dispatches ~38.8K ATen ops at T = 4096, ~25.8K at T = 2560 and ~21.5K at T = 2048, whatever
the batch (teacher forward and hybrid forward + backward, counted on CPU). At 4-8 us an eager op
(CPU dispatch plus launch; 9-13 us measured on a 2-core CPU with a tiny-width model), T = 4096
spends 0.15-0.3 s per step on dispatch while the GPU work of a 64K-token step is ~0.1 s: launch
bound, at half or a third of the dense fixture's speed. T = 2560 with batch 25 (64K tokens a step)
costs 0.1-0.2 s a step, ~300-600K tokens/s expected, and still holds a benchmark prompt plus the
deployments' 2048 new tokens inside trained positions. torch.compile is not used: the loop unrolls
into 40 chunk steps per shape, forward and backward, compiled on a first and only run, and
evaluation windows of other lengths would compile again. The two attention layers never see
positions past 2560 in training (a quarter of their dims rotate); the log reports the held-out CE
past the training length, on the dense run's 4096-token windows.

Budgets: as in train_fixture.py, `train_stage` times a few steps, then fixes the step count so the
cosine schedule ends inside its budget. Of the time left before --deadline-minutes (counted from
the script's start) after data preparation and `reserve_seconds` for the checks, the hybrid gets
`hybrid_share` (70 %); the EAGLE-3 stage the rest: greedy data in batches until
`eagle_data_share` of its budget, then the head (`train_eagle3.train_head` plans its own steps).
A failed EAGLE-3 stage or failed checks still ship the hybrid; the log says what failed.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]

import train_fixture  # noqa: E402  (first: its clock is the run's, and it sets SPECPILOT_COMPILE=0)
import benchmark_prompts  # noqa: E402
import fixture_pack  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import train_data  # noqa: E402
import train_eagle3  # noqa: E402
from fixture_data import TokenData, encode, windows  # noqa: E402
from train_fixture import log  # noqa: E402

from specpilot.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.models.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig  # noqa: E402
from specpilot.models.eagle3 import default_layer_ids  # noqa: E402
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3  # noqa: E402
from specpilot.models.fixture import HELDOUT_TOKENS, TRAINING_LOG, fixture_root  # noqa: E402
from specpilot.models.hybrid import HybridTransformer  # noqa: E402
from specpilot.models.loading import load_model  # noqa: E402
from specpilot.models.tokenizer import Tokenizer  # noqa: E402

train_data.START = train_fixture.START  # one clock for every log line (train_eagle3 logs through train_data)
LAYER_TYPES = {"L": LINEAR_ATTENTION, "F": FULL_ATTENTION}
DRAFT_SHAPES = {"chain": (5, 1, 5), "tree": (5, 4, 16), "stock": (5, 4, 7)}  # depth, topk, budget
HEAD_SHAPES = {"chain": (6, 1, 6), "tree": (6, 4, 16)}


@dataclass(frozen=True)
class Preset:
    # the hybrid
    hidden: int
    intermediate: int
    layer_pattern: str  # per layer "L" (Gated DeltaNet) or "F" (gated full attention)
    heads: int
    kv_heads: int
    head_dim: int
    rotary_fraction: float
    linear_key_heads: int
    linear_value_heads: int
    linear_head_dim: int  # Dk = Dv
    conv: int
    # its training (`train_fixture.train_stage`)
    seq_len: int  # T: tokens per training window
    batch: int  # B: windows per step
    eval_len: int  # held-out windows of the final comparison (full: the dense run's)
    lr: float
    warmup: int
    kl_weight: float  # w in CE + w KL(dense target || hybrid)
    log_every: int
    evals: int  # held-out evaluations during training
    calibrate: tuple[int, int]  # steps timed to fix the step count (must end inside the warmup)
    # budgets
    deadline_minutes: float
    hybrid_share: float  # of the training time; the EAGLE-3 stage gets the rest
    reserve_seconds: float  # kept for the checks, saving and packing
    # the EAGLE-3 head (`train_eagle3`)
    eagle_prompts: int  # at most this many training sequences (fewer when the data budget ends)
    eagle_eval_prompts: int
    prompt_len: int
    min_prompt_len: int
    gen_tokens: int  # sequence length beyond prompt_len
    gen_batch: int
    eagle_batch: int
    ttt: int
    draft_vocab: int  # 0: the target's vocabulary
    eagle_lr: float
    eagle_data_share: float  # of the EAGLE-3 stage's budget spent generating its data
    # checks
    check_prompts: int  # held-out prompts decoded by the engine (besides one per benchmark set)
    check_tokens: int


FULL = Preset(
    hidden=256, intermediate=768, layer_pattern="LLLFLLLF", heads=4, kv_heads=2, head_dim=64,
    rotary_fraction=0.25, linear_key_heads=2, linear_value_heads=4, linear_head_dim=64, conv=4,
    seq_len=2560, batch=25, eval_len=4096, lr=2e-3, warmup=200, kl_weight=0.5, log_every=25, evals=6, calibrate=(5, 30),
    deadline_minutes=7.5, hybrid_share=0.7, reserve_seconds=60.0,
    eagle_prompts=8192, eagle_eval_prompts=64, prompt_len=160, min_prompt_len=8, gen_tokens=128, gen_batch=1024,
    eagle_batch=64, ttt=7, draft_vocab=2048, eagle_lr=6e-4, eagle_data_share=0.4,
    check_prompts=4, check_tokens=64,
)
SMOKE = Preset(
    hidden=64, intermediate=128, layer_pattern="LLLF", heads=4, kv_heads=2, head_dim=16,
    rotary_fraction=0.5, linear_key_heads=2, linear_value_heads=4, linear_head_dim=16, conv=4,
    seq_len=128, batch=4, eval_len=256, lr=3e-3, warmup=12, kl_weight=0.5, log_every=5, evals=2, calibrate=(2, 8),
    deadline_minutes=3.0, hybrid_share=0.7, reserve_seconds=10.0,
    eagle_prompts=16, eagle_eval_prompts=4, prompt_len=16, min_prompt_len=8, gen_tokens=16, gen_batch=8,
    eagle_batch=4, ttt=3, draft_vocab=256, eagle_lr=6e-4, eagle_data_share=0.4,
    check_prompts=2, check_tokens=12,
)


def hybrid_config(p: Preset, vocab_size: int) -> ModelConfig:
    return ModelConfig(
        family="qwen3_5", vocab_size=vocab_size, hidden_size=p.hidden, intermediate_size=p.intermediate,
        num_layers=len(p.layer_pattern), num_heads=p.heads, num_kv_heads=p.kv_heads, head_dim=p.head_dim,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=True,
        qk_norm=True, bos_token_id=None, eos_token_ids=(0,),
        layer_types=tuple(LAYER_TYPES[c] for c in p.layer_pattern),
        linear_num_key_heads=p.linear_key_heads, linear_num_value_heads=p.linear_value_heads,
        linear_key_head_dim=p.linear_head_dim, linear_value_head_dim=p.linear_head_dim,
        linear_conv_kernel_dim=p.conv, partial_rotary_factor=p.rotary_fraction, attn_output_gate=True,
        zero_centered_norms=True,
    )


def init_hybrid(model: HybridTransformer, seed: int) -> None:
    """Matrices as train_fixture's init (N(0, 0.02), residual projections / sqrt(2L)); zero-centred
    norms at 0 (scale 1), the GDN output norm at 1; A_log = log U(1, 16) and dt_bias = softplus^-1
    of dt log-uniform in [1e-3, 1e-1] (the fla / Qwen3-Next init); conv weights U(+-1/sqrt(K))."""
    g = torch.Generator().manual_seed(seed)
    resid = 0.02 / math.sqrt(2 * model.config.num_layers)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            u = torch.rand(prm.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                prm.fill_(1.0)
            elif name.endswith("norm.weight"):
                prm.zero_()
            elif name.endswith("A_log"):
                prm.copy_((1 + 15 * u).log())
            elif name.endswith("dt_bias"):
                dt = torch.exp(math.log(1e-3) + u * (math.log(1e-1) - math.log(1e-3)))
                prm.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith("conv_weight"):
                prm.copy_((2 * u - 1) / math.sqrt(prm.shape[1]))
            elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                prm.copy_(torch.randn(prm.shape, generator=g) * resid)
            else:
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.02)


# ---- data ---------------------------------------------------------------------------------
def encode_split(train, held, tok, heldout_tokens: int, p: Preset, device, fixture: Path, record: dict):
    """Token streams of the split (the dense fixture's tokenizer) and the sampling mixture."""
    t = time.perf_counter()
    streams = {s: encode(tok, docs) for s, docs in train.items()}
    held_streams = {s: encode(tok, docs)[:heldout_tokens] for s, docs in held.items() if docs}
    data = TokenData.build(streams, train_fixture.UPSAMPLE, p.seq_len + 2, device)
    shipped = fixture / HELDOUT_TOKENS
    same = None
    if shipped.is_file():
        from safetensors.torch import load_file

        ref = load_file(str(shipped))
        same = set(ref) == set(held_streams) and all(torch.equal(ref[s].int(), v.int()) for s, v in held_streams.items())
    record["data"] = {"upsample": train_fixture.UPSAMPLE, "mixture": data.mixture(),
                      "heldout_tokens": {s: int(v.numel()) for s, v in held_streams.items()},
                      "heldout_equals_dense_fixture": same}
    record["timing"]["encoding"] = round(time.perf_counter() - t, 1)
    log("tokens: " + ", ".join(f"{s} {v['tokens'] / 1e6:.2f}M" for s, v in data.mixture().items())
        + f"; held-out tokens equal the dense fixture's: {same}")
    return streams, held_streams, data


def stream_prompts(streams: dict[str, torch.Tensor], n: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    """n prompts of min_len..max_len tokens (log-uniform) inside one document of a token stream
    (source by its share of tokens); half start at a document's start, as a user's prompt does."""
    rng = random.Random(seed)
    names = [s for s, v in streams.items() if v.numel() > max_len]
    starts = {s: [0] + (torch.nonzero(streams[s] == 0).flatten() + 1).tolist() for s in names}  # after each EOS
    weights = [streams[s].numel() for s in names]
    out = []
    for _ in range(50 * n):
        if len(out) == n:
            break
        s = rng.choices(names, weights)[0]
        length = round(math.exp(rng.uniform(math.log(min_len), math.log(max_len))))
        stream = streams[s]
        first = rng.choice(starts[s]) if rng.random() < 0.5 else rng.randrange(stream.numel() - length)
        ids = stream[first : first + length].tolist()
        if 0 in ids:
            ids = ids[: ids.index(0)]  # stay inside the document
        if len(ids) >= min_len:
            out.append(ids)
    return out


@torch.inference_mode()
def greedy_rows(target, prompts: list[list[int]], S: int) -> torch.Tensor:
    """[N,S]: each prompt + its greedy continuation (no EOS stop) cut to S. One causal forward over
    the right-padded prompts (each row's recurrent state kept at its last prompt token; the padding's
    K/V slots lie past it and are written before any query sees them), then one token per step for
    every row, through the engine's `chunk_forward` on the target's own cache. Not `Generator`: its
    prefill runs row by row, a forward per prompt (with the reference recurrence, ~160 ATen ops per
    prompt token, counted on CPU: ~50 s of host time per 1024 prompts of the recipe's lengths)."""
    from specpilot.engine.steps import chunk_forward

    dev, B = target.device, len(prompts)
    T, steps = max(map(len, prompts)), S - min(map(len, prompts))
    rows = torch.tensor([q + [0] * (T + steps - len(q)) for q in prompts], dtype=torch.int64).to(dev)
    lens = torch.tensor([len(q) for q in prompts], device=dev)
    cache = target.new_cache(B, T + steps)
    logits = chunk_forward(target, cache, rows[:, :T], torch.zeros(B, dtype=torch.int64, device=dev),
                           logits_for=(lens - 1)[:, None], commit=lens - 1)  # [B,1,V]
    pos, index = lens.clone(), torch.arange(B, device=dev)
    for i in range(steps):
        nxt = logits[:, -1].argmax(-1)  # [B]
        rows[index, pos] = nxt
        if i + 1 < steps:
            logits = chunk_forward(target, cache, nxt[:, None], pos)
        pos = pos + 1
    return rows[:, :S].cpu()


def greedy_data(target, prompts: list[list[int]], S: int, batch: int, seed: int, until: float | None = None):
    """(tokens [N,S], starts [N]): `greedy_rows` in batches of similar prompt lengths taken in random
    order, until the clock passes `until` (one batch at least)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    chunks = [order[i : i + batch] for i in range(0, len(order), batch)]
    random.Random(seed).shuffle(chunks)
    tokens, starts = [], []
    for chunk in chunks:
        if until is not None and tokens and time.perf_counter() > until:
            break
        tokens.append(greedy_rows(target, [prompts[j] for j in chunk], S))
        starts += [len(prompts[j]) for j in chunk]
    return torch.cat(tokens), torch.tensor(starts, dtype=torch.int64)


# ---- the EAGLE-3 stage --------------------------------------------------------------------
def eagle_stage(hybrid, streams, held_streams, p: Preset, budget_s: float, steps: int | None, seed: int,
                out: Path, device, record: dict) -> list[list[int]]:
    """Greedy data from `hybrid`, then train_eagle3's recipe; writes `out`; the held-out prompts."""
    t = time.perf_counter()
    S = p.prompt_len + p.gen_tokens
    train_prompts = stream_prompts(streams, p.eagle_prompts, p.min_prompt_len, p.prompt_len, seed)
    held_prompts = stream_prompts(held_streams, p.eagle_eval_prompts, p.min_prompt_len, p.prompt_len, seed + 1)
    held, held_starts = greedy_data(hybrid, held_prompts, S, p.gen_batch, seed)
    data, starts = greedy_data(hybrid, train_prompts, S, p.gen_batch, seed, until=t + p.eagle_data_share * budget_s)
    gen_s = time.perf_counter() - t
    log(f"eagle3 data: {len(data)} + {len(held)} sequences of {S} tokens in {gen_s:.1f} s")
    V = hybrid.config.vocab_size
    vocab = train_eagle3.draft_vocab_ids(data, starts, V, p.draft_vocab) if p.draft_vocab else None
    covered = torch.arange(S)[None] >= held_starts[:, None]  # held-out generated tokens
    coverage = 1.0 if vocab is None else float(torch.isin(held[covered], vocab).float().mean())
    left = budget_s - (time.perf_counter() - t)
    args = argparse.Namespace(batch=p.eagle_batch, ttt=p.ttt, decay=0.8, steps=steps or 0, minutes=max(left, 1.0) / 60,
                              lr=p.eagle_lr, seed=seed, intermediate_size=0)
    ids = default_layer_ids(hybrid.config.num_layers)
    head = train_eagle3.new_head(hybrid, ids, args, vocab, device)
    run = train_eagle3.train_head(head, hybrid, data, starts, args, device)
    top1, acc_len = train_eagle3.evaluate_head(head, hybrid, held, held_starts, args, device)
    write_eagle3(head, out, dtype=torch.bfloat16)
    record.update({
        "layer_ids": list(ids), "draft_vocab_size": head.spec.draft_vocab_size,
        "heldout_generated_tokens_in_draft_vocab": round(coverage, 4),
        "data": {"sequences": len(data), "held_out": len(held), "seq_len": S, "seconds": round(gen_s, 1)},
        "training": run, "settings": {k: v for k, v in vars(args).items()},
        "heldout_top1": top1[0], "heldout_top1_by_step": top1, "heldout_simulated_acc_len": acc_len,
        "bytes": (out / "model.safetensors").stat().st_size,
    })
    log(f"eagle3: held-out top-1 {top1[0]:.3f}, simulated chain acc_len {acc_len:.2f}, "
        f"{record['bytes'] / 1e6:.2f} MB, draft vocabulary covers {coverage:.3f} of held-out generated tokens")
    return held_prompts


# ---- checks -------------------------------------------------------------------------------
@torch.no_grad()
def compare_heldout(hybrid, dense, drafter, heldout: dict[str, list[torch.Tensor]], train_len: int, device) -> dict:
    """Per source, on the same windows: next-token CE of the hybrid and the dense target (all
    positions, and positions >= `train_len`), and the drafter's greedy agreement with each."""
    out = {}
    for source, ws in heldout.items():
        sums: dict[str, float] = {}
        for w in ws:
            x = w.to(device)[None]
            with train_fixture.autocast(device):
                logits = {name: m.forward_causal(x[:, :-1]).float()[0] for name, m in
                          (("hybrid", hybrid), ("dense", dense), ("drafter", drafter))}  # [T,V] each
            labels, late = x[0, 1:], torch.arange(x.shape[1] - 1, device=device) >= train_len
            guess = logits["drafter"].argmax(-1)
            parts = {"tokens": labels.numel(), "tokens_late": late.sum(),
                     "drafter_vs_hybrid": (guess == logits["hybrid"].argmax(-1)).sum(),
                     "drafter_vs_dense": (guess == logits["dense"].argmax(-1)).sum(),
                     "hybrid_vs_dense": (logits["hybrid"].argmax(-1) == logits["dense"].argmax(-1)).sum()}
            for name in ("hybrid", "dense"):
                nll = F.cross_entropy(logits[name], labels, reduction="none")
                parts[f"{name}_nll"], parts[f"{name}_nll_late"] = nll.sum(), nll[late].sum()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        n, late = sums["tokens"], sums["tokens_late"]
        out[source] = {"tokens": int(n), "hybrid_loss": round(sums["hybrid_nll"] / n, 4),
                       "dense_loss": round(sums["dense_nll"] / n, 4),
                       "drafter_top1_agreement_with_hybrid": round(sums["drafter_vs_hybrid"] / n, 4),
                       "drafter_top1_agreement_with_dense": round(sums["drafter_vs_dense"] / n, 4),
                       "hybrid_top1_agreement_with_dense": round(sums["hybrid_vs_dense"] / n, 4)}
        if late:
            out[source].update({"tokens_past_train_len": int(late),
                                "hybrid_loss_past_train_len": round(sums["hybrid_nll_late"] / late, 4),
                                "dense_loss_past_train_len": round(sums["dense_nll_late"] / late, 4)})
    return out


def margin(target, sequence: list[int]) -> float:
    """The target's top-1 minus top-2 logit after `sequence` (teacher-forced, float32)."""
    logits = target.forward_causal(torch.tensor([sequence], device=target.device))[0, -1].float()
    top = logits.topk(2).values
    return round(float(top[0] - top[1]), 5)


def against_ar(target, drafters: dict, prompts: list[list[int]], tokens: int, eos) -> tuple[dict, list[list[int]]]:
    """(per named drafter (depth, drafter): outputs equal to AR, mean accepted length per round and,
    for a row that differs, where and by what top-2 margin of the target there; AR's outputs).
    Eager, prefill unpadded: nothing here is timed."""
    def decode(drafters):
        return Generator(target, drafters, eos_ids=eos, cuda_graphs=False, prefill_bucket=0).generate(prompts, tokens)

    ar = decode(None).outputs
    out = {}
    for name, (depth, drafter) in drafters.items():
        res = decode({depth: drafter})
        diverged = []
        for row, (a, b) in enumerate(zip(ar, res.outputs)):
            if a != b:
                at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                diverged.append({"row": row, "position": at, "ar_top2_margin": margin(target, prompts[row] + a[:at])})
        out[name] = {"outputs_equal_to_ar": len(prompts) - len(diverged), "prompts": len(prompts),
                     "mean_accepted_length": round(res.mean_accepted_length, 3), "diverged": diverged}
    return out, ar


def draft_models(drafter) -> dict:
    """The dense drafter at each of DRAFT_SHAPES, {name: (depth, drafter)}, fresh ones (a drafter
    keeps a cache per generator workspace)."""
    return {f"draft_model_{name}": (depth, DraftModelDrafter(drafter, depth, topk, budget))
            for name, (depth, topk, budget) in DRAFT_SHAPES.items()}


def engine_checks(out: Path, dense, fixture: Path, heldout, held_prompts, p: Preset, device, record: dict) -> None:
    """Reload what was saved and check it: held-out comparison, engine vs AR, samples. `dense` is
    the dense target as loaded (bf16 files: its float32 copy is exact)."""
    from specpilot.engine.drafters.eagle3 import Eagle3Drafter

    torch.backends.cuda.matmul.allow_tf32 = False
    hybrid = load_model(out / "hybrid", device, torch.float32)
    dense = dense.float()
    drafter = load_model(fixture / "drafter", device, torch.float32)
    tok = Tokenizer.from_dir(out / "hybrid")
    record["heldout"] = compare_heldout(hybrid, dense, drafter, heldout, p.seq_len, device)
    for s, v in record["heldout"].items():
        log(f"held-out {s}: CE hybrid {v['hybrid_loss']:.3f} dense {v['dense_loss']:.3f}; drafter top-1 with hybrid "
            f"{v['drafter_top1_agreement_with_hybrid']:.3f}, with dense {v['drafter_top1_agreement_with_dense']:.3f}")
    bench = [tok.encode(benchmark_prompts.prompts(s)[0]) for s in benchmark_prompts.SETS]
    groups = {"heldout": held_prompts[: p.check_prompts], "benchmark_first_prompts": bench}
    head = None
    if (out / "hybrid_eagle3" / "model.safetensors").is_file():
        head = load_eagle3(out / "hybrid_eagle3", hybrid, device=device, dtype=torch.float32)
    checks, ar = {}, {}
    for group, prompts in groups.items():  # the benchmark group last: its AR outputs are the samples
        mine = draft_models(drafter)
        if head is not None:
            mine.update({f"eagle3_{name}": (depth, Eagle3Drafter(head, hybrid, depth, topk, budget))
                         for name, (depth, topk, budget) in HEAD_SHAPES.items()})
        checks[group] = {}
        checks[group]["hybrid"], ar["hybrid"] = against_ar(hybrid, mine, prompts, p.check_tokens, tok.eos_ids)
        checks[group]["dense_target_for_comparison"], ar["dense"] = against_ar(
            dense, draft_models(drafter), prompts, p.check_tokens, tok.eos_ids)
        log(f"engine [{group}]: " + ", ".join(f"{k} {v['outputs_equal_to_ar']}/{v['prompts']} = AR, acc "
                                              f"{v['mean_accepted_length']}" for k, v in checks[group]["hybrid"].items()))
    checks["all_equal_to_ar"] = all(v["outputs_equal_to_ar"] == v["prompts"] for g in groups
                                    for v in checks[g]["hybrid"].values())
    record["engine_check"] = checks
    record["samples"] = [{"set": s, "hybrid": tok.decode(h), "dense": tok.decode(d)}
                         for s, h, d in zip(benchmark_prompts.SETS, ar["hybrid"], ar["dense"])]
    for smp in record["samples"]:
        log(f"sample [{smp['set']}] hybrid: {smp['hybrid'][:160]!r}")


# ---- the run ------------------------------------------------------------------------------
def elapsed() -> float:
    return time.perf_counter() - train_fixture.START


def preset_from(a: argparse.Namespace) -> Preset:
    """The preset of --smoke, with --deadline-minutes, --kl-weight and --set applied."""
    p = SMOKE if a.smoke else FULL
    overrides = {k: v for k, v in (("deadline_minutes", a.deadline_minutes), ("kl_weight", a.kl_weight)) if v is not None}
    for item in a.set:
        key, _, value = item.partition("=")
        if key not in Preset.__dataclass_fields__:
            raise SystemExit(f"error: --set {item!r}: no preset field {key!r}")
        current = getattr(p, key)
        if isinstance(current, tuple):
            overrides[key] = tuple(int(x) for x in value.split(","))
        elif isinstance(current, str):
            overrides[key] = value
        else:
            overrides[key] = type(current)(float(value)) if isinstance(current, int) else float(value)
    return replace(p, **overrides)


def run(a: argparse.Namespace, p: Preset, record: dict) -> None:
    corpus_preset = train_fixture.SMOKE if a.smoke else train_fixture.FULL  # the dense run's corpus and split
    fixture = Path(a.fixture)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    elif a.smoke:
        torch.set_num_threads(1)  # tiny matrices gain nothing from threads; shared cores stall them
    torch.manual_seed(a.seed)
    record.update({"preset": "smoke" if a.smoke else "full", "settings": asdict(p), "seed": a.seed,
                   "corpus_settings": {k: getattr(corpus_preset, k) for k in (
                       "python_bytes", "english_chars", "max_docs", "heldout_fraction", "heldout_min_docs",
                       "heldout_tokens")},
                   "environment": {"python": platform.python_version(), "torch": torch.__version__,
                                   "device": str(device), "device_name": torch.cuda.get_device_name(device)
                                   if device.type == "cuda" else platform.processor()}})
    deadline = p.deadline_minutes * 60
    out = Path(a.out)
    log(f"device {device}, dense fixture {fixture}, deadline {deadline:.0f} s")

    dense = load_model(fixture / "target", device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    dense.requires_grad_(False)
    tok = tokenizers.Tokenizer.from_file(str(fixture / "target" / "tokenizer.json"))
    train, held = train_fixture.prepare_corpus(corpus_preset, a.seed, device, record)
    streams, held_streams, data = encode_split(train, held, tok, corpus_preset.heldout_tokens, p, device, fixture, record)
    del train, held

    config = hybrid_config(p, dense.config.vocab_size)
    record["models"] = {"hybrid": {"config": config.to_hf_dict(), "num_params": config.num_params},
                        "dense_teacher": {"path": str(fixture / "target"), "num_params": dense.config.num_params}}
    log(f"hybrid {config.num_params / 1e6:.2f}M parameters, layers {p.layer_pattern}")
    available = deadline - elapsed() - p.reserve_seconds
    if available <= 0:
        raise RuntimeError(f"only {available:.0f} s left for training after data preparation")
    model = HybridTransformer(config, max_positions=p.seq_len).to(device)
    init_hybrid(model, a.seed)
    stage = replace(corpus_preset, seq_len=p.seq_len, batch=p.batch, calibrate=p.calibrate, log_every=p.log_every,
                    evals=p.evals)
    heldout_train_len = {s: windows(v, p.seq_len) for s, v in held_streams.items()}
    alpha = p.kl_weight / (1 + p.kl_weight)
    t = time.perf_counter()
    record["training"] = {"hybrid": train_fixture.train_stage(
        "hybrid", model, train_fixture.distill_loss(dense, alpha), data, stage, p.lr, p.warmup,
        p.hybrid_share * available, a.hybrid_steps, a.seed + 1, heldout_train_len, device, teacher=dense)}
    record["training"]["hybrid"]["loss"] = (f"(CE + {p.kl_weight} KL(dense target || hybrid)) / {1 + p.kl_weight} "
                                           f"(train_fixture.distill_loss, alpha {alpha:.4f}): parts ce, kl")
    record["timing"]["hybrid"] = round(time.perf_counter() - t, 1)
    model.eval().requires_grad_(False)
    train_fixture.save_checkpoint(model, out / "hybrid", fixture / "target")
    del model, data
    if device.type == "cuda":
        torch.cuda.empty_cache()

    held_prompts = stream_prompts(held_streams, p.check_prompts, p.min_prompt_len, p.prompt_len, a.seed + 2)
    t = time.perf_counter()
    try:  # the hybrid is saved: a failure here still ships it
        shipped = load_model(out / "hybrid", device, torch.bfloat16 if device.type == "cuda" else torch.float32)
        record["eagle3"] = {}
        held_prompts = eagle_stage(shipped, streams, held_streams, p, deadline - elapsed() - p.reserve_seconds,
                                   a.eagle_steps, a.seed + 3, out / "hybrid_eagle3", device, record["eagle3"])
        del shipped
    except Exception as err:  # noqa: BLE001
        record["eagle3_error"] = "".join(traceback.format_exception(err))
        log(f"WARNING: the EAGLE-3 stage failed, the hybrid ships without a head:\n{record['eagle3_error']}")
    record["timing"]["eagle3"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    try:
        heldout = {s: windows(v, p.eval_len) for s, v in held_streams.items()}
        engine_checks(out, dense, fixture, heldout, held_prompts, p, device, record)
    except Exception as err:  # noqa: BLE001
        record["checks_error"] = "".join(traceback.format_exception(err))
        log(f"WARNING: post-training checks failed:\n{record['checks_error']}")
    record["timing"]["checks"] = round(time.perf_counter() - t, 1)


def finish(a: argparse.Namespace, record: dict) -> None:
    """Write the log into OUT (and into OUT/hybrid once saved) and pack both directories."""
    out = Path(a.out)
    dirs = [d for d in ("hybrid", "hybrid_eagle3") if (out / d / "model.safetensors").is_file()]
    record["files"] = {f"{d}/{q.name}": q.stat().st_size for d in dirs for q in sorted((out / d).iterdir())
                       if q.name != TRAINING_LOG}
    text = json.dumps(record, indent=1, default=str) + "\n"
    (out / TRAINING_LOG).write_text(text)
    if "hybrid" in dirs:
        (out / "hybrid" / TRAINING_LOG).write_text(text)
    log(f"status {record['status']}: wrote {', '.join(dirs) or 'no checkpoint'} and {TRAINING_LOG} to {out}")
    if a.pack_to and dirs:
        with tempfile.TemporaryDirectory() as staging:
            for d in dirs:
                shutil.copytree(out / d, Path(staging) / d)
            total = sum(q.stat().st_size for q in Path(staging).rglob("*") if q.is_file())
            written = fixture_pack.pack(Path(staging), Path(a.pack_to),
                                        extra={"total_bytes": total, "status": record["status"]})
        log(f"packed {total / 1e6:.2f} MB into {', '.join(f.name for f in written)} in {a.pack_to}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory: hybrid/, hybrid_eagle3/, training_log.json")
    ap.add_argument("--pack-to", default=None, help="also write both directories as fixture_pack parts here")
    ap.add_argument("--smoke", action="store_true", help="tiny hybrid, corpus and steps: the whole pipeline on CPU")
    ap.add_argument("--fixture", default=str(fixture_root()),
                    help="the dense fixture: target/ (teacher, tokenizer), drafter/, heldout.safetensors")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split, init, batches and prompts (0: the dense run's)")
    ap.add_argument("--device", default=None, help="training device (default: cuda when available)")
    ap.add_argument("--deadline-minutes", type=float, default=None,
                    help="everything must end by then, counted from the script's start (full: 7.5)")
    ap.add_argument("--kl-weight", type=float, default=None, help="w in CE + w KL(dense target || hybrid) (0.5)")
    ap.add_argument("--hybrid-steps", type=int, default=None, help="fixed hybrid steps (replay a logged run)")
    ap.add_argument("--eagle-steps", type=int, default=None, help="fixed EAGLE-3 steps (replay a logged run)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a preset field, e.g. --set batch=16 (see Preset; repeatable)")
    a = ap.parse_args(argv)
    p = preset_from(a)
    record: dict = {"status": "running", "argv": sys.argv[1:] if argv is None else argv, "timing": {}}
    for d in ("hybrid", "hybrid_eagle3"):  # this run's checkpoints only: finish() packs what it finds
        shutil.rmtree(Path(a.out) / d, ignore_errors=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    try:
        run(a, p, record)
        record["status"] = "ok"
    except BaseException as err:
        record["status"] = "failed"
        record["error"] = "".join(traceback.format_exception(err))
        raise
    finally:
        record["timing"]["total"] = round(elapsed(), 1)
        finish(a, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
