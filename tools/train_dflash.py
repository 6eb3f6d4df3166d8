"""Train a DFlash block drafter for a target on the target's own greedy continuations.

    python tools/train_dflash.py --out OUT                 # the fixture target, one GPU, <= 5 minutes
    python tools/train_dflash.py --smoke --out OUT         # a random tiny target on CPU, seconds
    python tools/train_dflash.py --out OUT --prompt-mix 0.5 --stop-at-eos --anchor-window 128
    python tools/train_dflash.py --out OUT --resume --total-minutes 20 --minutes 7   # per device call, 2-3 calls

Recipe (`shared/research/mechanisms.md` 1.4, after SpecForge's `OnlineDFlashModel`):
1. prompts and data: `train_data.py` (leak-checked corpus windows of --min-prompt-len..--prompt-len
   tokens, --questions train-split questions formatted as the benchmark's prompts drawn with
   --prompt-mix; the target's greedy continuations with the engine, cut to --prompt-len +
   --gen-tokens, so every label is an acceptance label).
2. loss: the block objective of `dflash_objective.py` (anchors among the generated positions,
   blocks [root, MASK...] under the SpecForge mask, CE at offsets 1..block-1 weighted
   exp(-(k-1)/gamma) or --distill, the variable prefix of --prefix-max).
3. step: AdamW, warmup 4 %, cosine, clip 1.0. The draft layers start as the target's last layers
   (--init). Every sequence is --prompt-len + --gen-tokens long, so a short prompt gets a long
   continuation; the fixture's greedy text repeats itself (the next 8 tokens occurred before at
   most positions past the 64th generated token: `scripts/dflash_positions.py`); --anchor-window N
   keeps the anchors among the first N generated positions; --stop-at-eos puts no loss past a
   continuation's first EOS (the engine stops there; the text after it is not what a user is served).
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
import train_checkpoint  # noqa: E402
import train_data  # noqa: E402  (START: the clock of every log line, which train_hybrid.py may set)
from dflash_objective import block_loss, target_features  # noqa: E402
from train_data import bench_prompt_ids, data_digest, eos_ends, load_target, log, make_data, sample_rows  # noqa: E402

from specpilot.config import TreeConstruction  # noqa: E402
from specpilot.engine.drafters.dflash import DFlashDrafter  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.models.dflash import build_target_layer_ids, random_dflash  # noqa: E402
from specpilot.models.dflash_checkpoint import load_dflash, write_dflash  # noqa: E402


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
                  "training": training, "total_seconds": time.perf_counter() - train_data.START}
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
        "total_seconds": time.perf_counter() - train_data.START,
    }
    (out / "training_log.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"held-out simulated acc_len {held_acc:.2f}; engine {json.dumps(check)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
