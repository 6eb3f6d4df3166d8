"""Train the shipped fixture from scratch in one GPU call: tokenizer, target, drafter.

    python tools/train_fixture.py --out OUT            # the real run (H200: ~9 minutes)
    python tools/train_fixture.py --smoke --out OUT    # the whole pipeline, tiny, on CPU (~1 min)
    python tools/fixture_pack.py unpack OUT            # install the result into specpilot/data/fixture

Stages, each timed and logged:
1. corpus (`corpus.py`): offline text only; documents containing any benchmark text are dropped
   (`leakcheck.py`) and the check is re-run on what remains; a held-out share of every source is
   set aside before anything is trained.
2. tokenizer (`train_tokenizer.py`): byte-level BPE, 8192 tokens, EOS after every document.
3. target: Qwen3 architecture, 13 layers x 256 wide (4 query / 2 kv heads of 64, MLP 1024,
   tied embeddings), 14.9M parameters; next-token loss on the source mixture in 4096-token windows
   (prompt + 2048 new tokens stay inside the trained positions).
4. drafter: the same shape with 2 layers (4.1M parameters), initialised from the trained target's
   embeddings, first 2 blocks and final norm, then distilled on the same text: loss =
   a * KL(target || drafter) + (1 - a) * CE, since acceptance is agreement with the target.
5. check and ship: both checkpoints saved in HF format (bf16) with the tokenizer, reloaded with
   SpecPilot to measure held-out loss, sample outputs and drafting acceptance, then packed into
   <= 15 MiB parts (`fixture_pack.py`) plus `training_log.json` under --out.

Budgets: training runs by wall clock. After a few timed steps each stage fixes its step count so
its cosine schedule ends inside its budget; a hard time check stops it regardless, and the whole
run plans around --deadline-minutes (counted from the script's start), shrinking the target's
and the drafter's budgets when corpus preparation was slow. torch.compile is not used: at 64k
tokens per step the run is limited by the corpus (it sees each token several times), not by
FLOPs, and compiling would spend a tenth of the budget and add a failure mode. Mixed precision is
plain autocast to bf16 over float32 master weights.

Determinism: the corpus split, tokenizer, initialisation and batch order are functions of --seed
(and of the machine's Python files, fingerprinted in the log). Step counts depend on measured
speed; the log records them, and --target-steps / --drafter-steps replay them. CPU runs are
bit-reproducible; GPU runs are up to the nondeterminism of GPU kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

START = time.perf_counter()
TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]
# The checks decode a few dozen tokens: compiling SpecPilot's fused decode ops would cost more
# time than it saves and add a failure mode after training. (Training uses forward_causal, eager.)
os.environ.setdefault("SPECPILOT_COMPILE", "0")

import benchmark_prompts
import corpus as corpus_mod
import fixture_pack
import leakcheck
import torch
import torch.nn.functional as F
import train_tokenizer
from fixture_data import TokenData, encode, split_heldout, tokenizer_sample, windows

from specpilot.models.config import ModelConfig
from specpilot.models.expand import ModelSize, expanded_config
from specpilot.models.fixture import HELDOUT_TOKENS, TRAINING_LOG
from specpilot.models.loading import load_model, save_model
from specpilot.models.tokenizer import Tokenizer
from specpilot.models.transformer import Transformer

FIXTURE_BUDGET_BYTES = 40_000_000  # everything committed for the fixture
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
UPSAMPLE = {"python_source": 1.0, "english_text": 2.0, "gsm8k_train": 3.0, "mbpp_train": 3.0}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


@dataclass(frozen=True)
class Preset:
    vocab_size: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    target_layers: int
    drafter_layers: int
    seq_len: int  # T: tokens per training window
    batch: int  # B: windows per step
    python_bytes: int
    english_chars: int
    max_docs: int | None  # cap per source (smoke only)
    tokenizer_chars: int
    heldout_fraction: float
    heldout_min_docs: int
    heldout_tokens: int  # shipped held-out tokens per source
    target_minutes: float
    drafter_minutes: float
    deadline_minutes: float
    target_lr: float
    drafter_lr: float
    target_warmup: int
    drafter_warmup: int
    distill_alpha: float
    log_every: int
    evals: int  # held-out evaluations during each stage
    sample_tokens: int
    calibrate: tuple[int, int]  # steps timed to fix a stage's step count (must end inside the warmup)


FULL = Preset(
    vocab_size=8192, hidden=256, intermediate=1024, heads=4, kv_heads=2, head_dim=64,
    target_layers=13, drafter_layers=2, seq_len=4096, batch=16,
    python_bytes=100_000_000, english_chars=8_000_000, max_docs=None, tokenizer_chars=16_000_000,
    heldout_fraction=0.01, heldout_min_docs=20, heldout_tokens=16_384,
    target_minutes=4.5, drafter_minutes=2.0, deadline_minutes=9.0,
    target_lr=2e-3, drafter_lr=1e-3, target_warmup=200, drafter_warmup=50, distill_alpha=0.9,
    log_every=25, evals=6, sample_tokens=64, calibrate=(5, 30),
)
SMOKE = Preset(
    vocab_size=512, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
    target_layers=3, drafter_layers=1, seq_len=128, batch=8,
    python_bytes=1_500_000, english_chars=300_000, max_docs=400, tokenizer_chars=600_000,
    heldout_fraction=0.01, heldout_min_docs=5, heldout_tokens=2048,
    target_minutes=0.35, drafter_minutes=0.2, deadline_minutes=3.0,
    target_lr=3e-3, drafter_lr=2e-3, target_warmup=12, drafter_warmup=12, distill_alpha=0.9,
    log_every=5, evals=2, sample_tokens=16, calibrate=(2, 8),
)


def model_config(p: Preset, layers: int) -> ModelConfig:
    return ModelConfig(
        family="qwen3", vocab_size=p.vocab_size, hidden_size=p.hidden, intermediate_size=p.intermediate,
        num_layers=layers, num_heads=p.heads, num_kv_heads=p.kv_heads, head_dim=p.head_dim,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096,
        tie_word_embeddings=True, qk_norm=True, bos_token_id=None, eos_token_ids=(0,),
    )


def init_weights(model: Transformer, seed: int) -> None:
    """GPT-2 style: N(0, 0.02), residual projections scaled by 1/sqrt(2L), norms at 1."""
    g = torch.Generator().manual_seed(seed)
    resid = 0.02 / math.sqrt(2 * model.config.num_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * resid)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


# ---- losses -------------------------------------------------------------------------------
def lm_loss(model: Transformer, x: torch.Tensor):
    """Next-token cross-entropy of windows x [B, T+1]."""
    logits = model.forward_causal(x[:, :-1]).float()  # [B,T,V]
    loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    return loss, {}


def distill_loss(teacher: Transformer, alpha: float):
    def loss_fn(model: Transformer, x: torch.Tensor):
        with torch.no_grad():
            t = teacher.forward_causal(x[:, :-1]).float().log_softmax(-1)  # [B,T,V]
        s = model.forward_causal(x[:, :-1]).float().log_softmax(-1)
        kl = F.kl_div(s, t, log_target=True, reduction="none").sum(-1).mean()  # KL(target || drafter)
        ce = F.nll_loss(s.flatten(0, 1), x[:, 1:].flatten())
        return alpha * kl + (1 - alpha) * ce, {"kl": kl, "ce": ce}

    return loss_fn


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def heldout_eval(model, heldout: dict[str, list[torch.Tensor]], device, max_windows=None, teacher=None) -> dict:
    """Per source: mean next-token loss and perplexity; with a teacher, greedy agreement too."""
    was_training = model.training
    model.eval()
    out = {}
    for source, ws in heldout.items():
        nll = count = agree = top4 = 0.0
        for w in ws[:max_windows]:
            x = w.to(device)[None]
            with autocast(device):
                logits = model.forward_causal(x[:, :-1]).float()[0]  # [T,V]
                nll += F.cross_entropy(logits, x[0, 1:], reduction="sum").item()
                count += x.shape[1] - 1
                if teacher is not None:
                    t_top = teacher.forward_causal(x[:, :-1]).float()[0].argmax(-1)  # [T]
                    agree += (logits.argmax(-1) == t_top).sum().item()
                    top4 += (logits.topk(4, dim=-1).indices == t_top[:, None]).any(-1).sum().item()
        if count:
            out[source] = {"loss": round(nll / count, 4), "ppl": round(math.exp(nll / count), 3), "tokens": int(count)}
            if teacher is not None:
                out[source]["top1_agreement"] = round(agree / count, 4)
                out[source]["target_top1_in_top4"] = round(top4 / count, 4)
    model.train(was_training)
    return out


# ---- one training stage -------------------------------------------------------------------
def lr_at(step: int, total: int | None, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup, then cosine from `peak` to `floor * peak` at step `total`."""
    if step < warmup or total is None:
        return peak * min(1.0, (step + 1) / warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_stage(name, model, loss_fn, data: TokenData, p: Preset, lr: float, warmup: int, budget_s: float,
                fixed_steps: int | None, seed: int, heldout, device, teacher=None) -> dict:
    """Train `model` until its step count or time budget is reached; the stage's record."""
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
    )
    gen = torch.Generator().manual_seed(seed)
    total = fixed_steps
    if total is None and warmup <= p.calibrate[1]:
        raise ValueError(f"{name}: warmup {warmup} must exceed the calibration steps {p.calibrate}")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    tokens_per_step = p.batch * p.seq_len
    curve, evals, eval_at = [], [], set()
    running, parts_running, n_running = torch.zeros((), device=device), {}, 0
    model.train()
    t0 = time.perf_counter()
    step, stopped, t_cal = 0, "steps", None
    log(f"{name}: training for {f'{total} steps' if total else f'{budget_s:.0f} s'} "
        f"({tokens_per_step} tokens/step, peak lr {lr:g})")
    while True:
        if total is not None and step >= total:
            break
        if time.perf_counter() - t0 > budget_s:
            stopped = "time"
            break
        cur_lr = lr_at(step, total, lr, warmup)
        for group in opt.param_groups:
            group["lr"] = cur_lr
        x = data.batch(p.batch, p.seq_len, gen)
        with autocast(device):
            loss, parts = loss_fn(model, x)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running += loss.detach()
        for k, v in parts.items():
            parts_running[k] = parts_running.get(k, 0) + v.detach()
        n_running += 1
        if fixed_steps is None and step == p.calibrate[0]:
            sync()
            t_cal = time.perf_counter()
        if fixed_steps is None and step == p.calibrate[1]:
            sync()
            per_step = (time.perf_counter() - t_cal) / (p.calibrate[1] - p.calibrate[0])
            left = budget_s - (time.perf_counter() - t0)
            total = step + 1 + max(0, int(0.93 * left / per_step))
            log(f"{name}: {per_step * 1e3:.1f} ms/step ({tokens_per_step / per_step / 1e3:.0f}k tokens/s) "
                f"-> {total} steps")
        if total is not None and not eval_at:
            eval_at = {round(total * k / p.evals) for k in range(1, p.evals)}
        step += 1
        if step % p.log_every == 0 or step == total:
            mean = (running / n_running).item()
            extra = {k: round((v / n_running).item(), 4) for k, v in parts_running.items()}
            point = {"step": step, "tokens": step * tokens_per_step, "seconds": round(time.perf_counter() - t0, 2),
                     "loss": round(mean, 4), "lr": round(cur_lr, 7), "grad_norm": round(gnorm.item(), 3), **extra}
            curve.append(point)
            log(f"{name}: step {step}/{total or '?'} loss {mean:.4f} {extra or ''} lr {cur_lr:.2e} "
                f"|g| {point['grad_norm']}")
            running.zero_()
            parts_running, n_running = {}, 0
            if fixed_steps is None and t_cal is not None and total is not None and step > p.calibrate[1] + 1:
                # re-plan with the speed seen so far (evals and syncs included); only ever shorten
                per_step = (time.perf_counter() - t_cal) / (step - 1 - p.calibrate[0])
                left = budget_s - (time.perf_counter() - t0)
                total = min(total, step + max(1, int(0.97 * left / per_step)))
        if step in eval_at:
            ev = heldout_eval(model, heldout, device, max_windows=4, teacher=teacher)
            evals.append({"step": step, "tokens": step * tokens_per_step, "heldout": ev})
            log(f"{name}: held-out at step {step}: " + ", ".join(f"{s} {v['loss']:.3f}" for s, v in ev.items()))
    sync()
    seconds = time.perf_counter() - t0
    tokens = step * tokens_per_step
    log(f"{name}: stopped by {stopped} after {step} steps, {tokens / 1e6:.1f}M tokens, {seconds:.0f} s")
    return {
        "steps": step, "planned_steps": total, "stopped_by": stopped, "tokens_seen": tokens,
        "seconds": round(seconds, 1), "tokens_per_second": round(tokens / max(seconds, 1e-9)),
        "budget_seconds": round(budget_s, 1), "peak_lr": lr, "warmup_steps": warmup, "final_lr_fraction": 0.1,
        "batch": p.batch, "seq_len": p.seq_len, "optimizer": "AdamW(0.9, 0.95), wd 0.1 on matrices, clip 1.0",
        "epochs": data.epochs(tokens), "train_curve": curve, "heldout_curve": evals,
    }


# ---- stages -------------------------------------------------------------------------------
def prepare_corpus(p: Preset, seed: int, device, record: dict):
    t = time.perf_counter()
    corpus = corpus_mod.build_corpus(p.python_bytes, p.english_chars, seed, p.max_docs)
    record["corpus"] = {"sources": corpus.sources, "chars": corpus.chars, "fingerprint": corpus.fingerprint()}
    log(f"corpus: {corpus.chars / 1e6:.1f}M chars " + ", ".join(f"{s} {len(d)} docs" for s, d in corpus.by_source.items()))
    texts = benchmark_prompts.protected_texts()
    names = [s for s, docs in corpus.by_source.items() for _ in docs]
    docs = corpus.documents
    leaks = leakcheck.find_leaks(docs, texts, device)
    bad = {x.document for x in leaks}
    removed = {}
    for i in bad:
        removed[names[i]] = removed.get(names[i], 0) + 1
    kept: dict[str, list[str]] = {s: [] for s in corpus.by_source}
    for i, (s, d) in enumerate(zip(names, docs)):
        if i not in bad:
            kept[s].append(d)
    after = leakcheck.find_leaks([d for ds in kept.values() for d in ds], texts, device)
    record["decontamination"] = {
        "method": "whitespace-normalised verbatim substring search (tools/leakcheck.py)",
        "found": leakcheck.summarize(leaks, texts), "removed_documents": removed,
        "after_removal": leakcheck.summarize(after, texts), "passed": not after,
    }
    log(f"leak check: {len(leaks)} occurrences in {len(bad)} documents removed {removed}; "
        f"re-check {'clean' if not after else 'FAILED'}")
    if after:
        raise RuntimeError(f"benchmark texts still present after decontamination: {after[:5]}")
    train, held = split_heldout(kept, p.heldout_fraction, p.heldout_min_docs, seed)
    record["split"] = {s: {"train_documents": len(train[s]), "heldout_documents": len(held[s])} for s in train}
    record["timing"]["corpus"] = round(time.perf_counter() - t, 1)
    return train, held


def prepare_tokens(p: Preset, seed: int, train, held, work: Path, device, record: dict):
    t = time.perf_counter()
    chars = {s: sum(map(len, docs)) for s, docs in train.items()}
    shares = {s: chars[s] * UPSAMPLE.get(s, 0.0) for s in train}  # the training mixture, in characters
    sample = tokenizer_sample(train, shares, p.tokenizer_chars, seed)
    tok = train_tokenizer.train_bpe(sample, p.vocab_size)
    tok_dir = work / "tokenizer"
    train_tokenizer.save_tokenizer(tok, tok_dir)
    if tok.get_vocab_size() > p.vocab_size or tok.token_to_id(train_tokenizer.EOS) != 0:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, EOS id {tok.token_to_id(train_tokenizer.EOS)}")
    log(f"tokenizer: {tok.get_vocab_size()} tokens from {sum(map(len, sample)) / 1e6:.1f}M chars "
        f"({time.perf_counter() - t:.0f} s)")
    streams = {s: encode(tok, docs) for s, docs in train.items()}
    held_streams = {s: encode(tok, docs)[: p.heldout_tokens] for s, docs in held.items() if docs}
    record["tokenizer"] = {
        "vocab_size": tok.get_vocab_size(), "fingerprint": Tokenizer.from_dir(tok_dir).fingerprint(),
        "sample_chars": sum(map(len, sample)), "eos": train_tokenizer.EOS,
        "sample_shares": {s: round(v / max(sum(shares.values()), 1e-9), 4) for s, v in shares.items()},
        "chars_per_token": {s: round(chars[s] / max(1, streams[s].numel()), 3) for s in streams},
    }
    data = TokenData.build(streams, UPSAMPLE, p.seq_len + 2, device)
    record["data"] = {
        "upsample": UPSAMPLE, "mixture": data.mixture(),
        "heldout_tokens": {s: int(v.numel()) for s, v in held_streams.items()},
    }
    log("tokens: " + ", ".join(f"{s} {v['tokens'] / 1e6:.2f}M (p={v['probability']})" for s, v in data.mixture().items()))
    record["timing"]["tokenizer_and_encoding"] = round(time.perf_counter() - t, 1)
    return tok_dir, data, held_streams


def size_record(config: ModelConfig, factor: int) -> dict:
    return {"config": config.to_hf_dict(), "size": ModelSize.of(config).summary(),
            f"expanded_x{factor}": ModelSize.of(expanded_config(config, factor)).summary()}


def check_budget(p: Preset, smoke: bool) -> None:
    """Refuse to start a full run whose checkpoints cannot fit the committed-bytes budget."""
    weights = sum(ModelSize.of(model_config(p, n)).bytes() for n in (p.target_layers, p.drafter_layers))
    estimate = weights + 2 * 600_000 + 2 * 4 * p.heldout_tokens  # + tokenizers, held-out tokens
    if estimate > FIXTURE_BUDGET_BYTES and not smoke:
        raise SystemExit(f"error: the fixture would take ~{estimate / 1e6:.1f} MB > {FIXTURE_BUDGET_BYTES / 1e6:.0f} MB")


def ship_checks(fixture: Path, heldout, p: Preset, device, record: dict) -> None:
    """Reload the saved checkpoints with SpecPilot: held-out loss, samples, drafting acceptance."""
    from specpilot.engine.drafters.draft_model import DraftModelDrafter
    from specpilot.engine.generator import Generator

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_model(fixture / "target", device, dtype)
    drafter = load_model(fixture / "drafter", device, dtype)
    tok = Tokenizer.from_dir(fixture / "target")
    checks = {"dtype": str(dtype).removeprefix("torch."),
              "heldout": {"target": heldout_eval(target, heldout, device),
                          "drafter": heldout_eval(drafter, heldout, device, teacher=target)}}
    prompts = [benchmark_prompts.prompts(s)[0] for s in benchmark_prompts.SETS]
    ids = [tok.encode(x) for x in prompts]
    ar = Generator(target, eos_ids=tok.eos_ids, cuda_graphs=False).generate(ids, p.sample_tokens)
    checks["samples"] = [{"set": s, "prompt": x, "output": tok.decode(o)}
                         for s, x, o in zip(benchmark_prompts.SETS, prompts, ar.outputs)]
    acceptance = {}
    for label, (depth, topk, budget) in {"chain": (5, 1, 5), "tree": (5, 4, 7)}.items():
        gen = Generator(target, {depth: DraftModelDrafter(drafter, depth, topk, budget)},
                        eos_ids=tok.eos_ids, cuda_graphs=False)
        res = gen.generate(ids, p.sample_tokens)
        acceptance[label] = {"depth": depth, "topk": topk, "tree_budget": budget,
                             "mean_accepted_length": round(res.mean_accepted_length, 3),
                             "outputs_equal_to_ar": sum(a == b for a, b in zip(res.outputs, ar.outputs))}
    checks["acceptance_first_prompt_per_set"] = acceptance
    record["checks"] = checks
    log("shipped: held-out target " + ", ".join(f"{s} {v['ppl']:.2f}" for s, v in checks["heldout"]["target"].items())
        + " | acceptance " + ", ".join(f"{k} {v['mean_accepted_length']}" for k, v in acceptance.items()))
    for smp in checks["samples"]:
        log(f"sample [{smp['set']}]: {smp['output'][:160]!r}")


def run(a: argparse.Namespace, record: dict, fixture: Path) -> None:
    """Every stage, writing the fixture (target/, drafter/, held-out tokens) into `fixture`."""
    p = SMOKE if a.smoke else FULL
    overrides = {k: v for k, v in (("target_minutes", a.target_minutes), ("drafter_minutes", a.drafter_minutes),
                                    ("deadline_minutes", a.deadline_minutes)) if v is not None}
    for item in a.set:
        key, _, value = item.partition("=")
        if key not in Preset.__dataclass_fields__:
            raise SystemExit(f"error: --set {item!r}: no preset field {key!r}")
        current = getattr(p, key)
        if isinstance(current, tuple):
            overrides[key] = tuple(int(x) for x in value.split(","))
        elif isinstance(current, float):
            overrides[key] = float(value)
        else:  # int, or an unset cap
            overrides[key] = int(float(value))
    p = replace(p, **overrides)
    check_budget(p, a.smoke)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    elif a.smoke:
        torch.set_num_threads(1)  # tiny matrices gain nothing from threads; shared cores stall them
    torch.manual_seed(a.seed)
    record.update({"preset": "smoke" if a.smoke else "full", "settings": asdict(p), "seed": a.seed,
                   "environment": {"python": platform.python_version(), "torch": torch.__version__,
                                   "tokenizers": __import__("tokenizers").__version__, "device": str(device),
                                   "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()}})
    deadline = p.deadline_minutes * 60
    work = fixture.parent
    log(f"device {device}, work dir {work}, deadline {deadline:.0f} s")

    train, held = prepare_corpus(p, a.seed, device, record)
    tok_dir, data, held_streams = prepare_tokens(p, a.seed, train, held, work, device, record)
    heldout = {s: windows(v, p.seq_len) for s, v in held_streams.items()}

    tcfg, dcfg = model_config(p, p.target_layers), model_config(p, p.drafter_layers)
    record["models"] = {"target": size_record(tcfg, 16), "drafter": size_record(dcfg, 4)}
    log(f"target {tcfg.num_params / 1e6:.2f}M params (x16: {expanded_config(tcfg, 16).num_params / 1e9:.2f}B), "
        f"drafter {dcfg.num_params / 1e6:.2f}M params (x4: {expanded_config(dcfg, 4).num_params / 1e6:.1f}M)")
    reserve = 30.0 if not a.smoke else 10.0  # final checks, saving, packing
    available = deadline - (time.perf_counter() - START) - reserve
    wanted = (p.target_minutes + p.drafter_minutes) * 60
    if available <= 0.2 * wanted:
        raise RuntimeError(f"only {available:.0f} s left for training after data preparation")
    target_budget = p.target_minutes * 60 * min(1.0, available / wanted)  # slow data prep: both shrink

    target = Transformer(tcfg, max_positions=p.seq_len).to(device)
    init_weights(target, a.seed)
    record["training"] = {}
    record["training"]["target"] = train_stage(
        "target", target, lm_loss, data, p, p.target_lr, p.target_warmup, target_budget, a.target_steps,
        a.seed + 1, heldout, device)
    target.eval().requires_grad_(False)
    save_checkpoint(target, fixture / "target", tok_dir)  # shipped even if a later stage fails

    drafter = Transformer(dcfg, max_positions=p.seq_len).to(device)
    init = {k: v for k, v in target.state_dict().items()
            if not k.startswith("layers.") or int(k.split(".")[1]) < p.drafter_layers}
    drafter.load_state_dict(init, strict=False)
    now = time.perf_counter() - START
    drafter_budget = min(p.drafter_minutes * 60, deadline - now - reserve)
    record["training"]["drafter"] = train_stage(
        "drafter", drafter, distill_loss(target, p.distill_alpha), data, p, p.drafter_lr, p.drafter_warmup,
        drafter_budget, a.drafter_steps, a.seed + 2, heldout, device, teacher=target)
    record["training"]["drafter"]["init"] = f"target's embeddings, final norm and first {p.drafter_layers} blocks"
    record["training"]["drafter"]["loss"] = f"{p.distill_alpha} * KL(target || drafter) + {1 - p.distill_alpha:.1f} * CE"
    drafter.eval().requires_grad_(False)

    t = time.perf_counter()
    record["final_heldout"] = {"target": heldout_eval(target, heldout, device),
                               "drafter": heldout_eval(drafter, heldout, device, teacher=target)}
    save_checkpoint(drafter, fixture / "drafter", tok_dir)
    from safetensors.torch import save_file

    save_file({s: v.to(torch.int16).contiguous() for s, v in held_streams.items()}, str(fixture / HELDOUT_TOKENS),
              metadata={"seq_len": str(p.seq_len)})  # one key: safetensors orders metadata like a hash map
    try:
        if deadline - (time.perf_counter() - START) < reserve / 2:
            raise TimeoutError("no time left before the deadline for the post-training checks")
        ship_checks(fixture, heldout, p, device, record)
    except Exception as err:  # noqa: BLE001 -- the checkpoints are saved: ship them, and say loudly what failed
        record["checks_error"] = "".join(traceback.format_exception(err))
        log(f"WARNING: post-training checks failed, the fixture is packed anyway:\n{record['checks_error']}")
    record["timing"]["final_checks"] = round(time.perf_counter() - t, 1)


def save_checkpoint(model: Transformer, out: Path, tok_dir: Path) -> None:
    """HF directory: config.json, bf16 model.safetensors, the tokenizer files."""
    save_model(model, out, dtype=torch.bfloat16)
    for f in TOKENIZER_FILES:
        shutil.copyfile(tok_dir / f, out / f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the packed fixture parts and the log")
    ap.add_argument("--smoke", action="store_true", help="tiny corpus and models: the whole pipeline in ~1 min on CPU")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split, tokenizer sample, init and batches")
    ap.add_argument("--device", default=None, help="training device (default: cuda when available)")
    ap.add_argument("--work-dir", default=None, help="scratch directory (default: a new temporary one)")
    ap.add_argument("--target-minutes", type=float, default=None, help="target training budget (full: 4.5)")
    ap.add_argument("--drafter-minutes", type=float, default=None, help="drafter training budget (full: 2.0)")
    ap.add_argument("--deadline-minutes", type=float, default=None,
                    help="everything must end by then, counted from the script's start (full: 9.0)")
    ap.add_argument("--target-steps", type=int, default=None, help="fixed target steps (replay a logged run)")
    ap.add_argument("--drafter-steps", type=int, default=None, help="fixed drafter steps (replay a logged run)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a preset field, e.g. --set batch=16 (see Preset; repeatable)")
    a = ap.parse_args(argv)
    record: dict = {"status": "running", "argv": sys.argv[1:] if argv is None else argv, "timing": {}}
    a.out.mkdir(parents=True, exist_ok=True)
    fixture = Path(a.work_dir or tempfile.mkdtemp(prefix="specpilot-fixture-")) / "fixture"
    shutil.rmtree(fixture, ignore_errors=True)
    fixture.mkdir(parents=True)
    try:
        run(a, record, fixture)
        record["status"] = "ok"
    except BaseException as err:
        record["status"] = "failed"
        record["error"] = "".join(traceback.format_exception(err))
        raise
    finally:
        record["timing"]["total"] = round(time.perf_counter() - START, 1)
        finish(a, record, fixture)
    return 0


def finish(a: argparse.Namespace, record: dict, fixture: Path) -> None:
    """Write the log into --out and, once a target is saved, next to the checkpoints, and pack
    the fixture there (a failed run still ships what it saved; its log says what is missing)."""
    if not (fixture / "target" / "model.safetensors").is_file():
        fixture = None
    if fixture is not None:
        files = {q.relative_to(fixture).as_posix(): q.stat().st_size for q in sorted(fixture.rglob("*")) if q.is_file()}
        record["shipped"] = {"files": files, "bytes_before_log": sum(files.values()),
                             "budget_bytes": FIXTURE_BUDGET_BYTES}
    text = json.dumps(record, indent=1, default=str) + "\n"
    (a.out / TRAINING_LOG).write_text(text)
    if fixture is None:
        log(f"status {record['status']}: wrote {a.out / TRAINING_LOG}")
        return
    (fixture / TRAINING_LOG).write_text(text)
    total = sum(q.stat().st_size for q in fixture.rglob("*") if q.is_file())
    written = fixture_pack.pack(fixture, a.out, extra={"total_bytes": total, "status": record["status"]})
    log(f"fixture {total / 1e6:.2f} MB ({'within' if total <= FIXTURE_BUDGET_BYTES else 'OVER'} the 40 MB budget); "
        f"wrote {', '.join(f.name for f in written)} and {TRAINING_LOG} to {a.out}")


if __name__ == "__main__":
    sys.exit(main())
