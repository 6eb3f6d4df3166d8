"""`specpilot generate`: run one system on one or more prompts and print text and statistics.

The system is the deployment's stock (or `--system`) with the flags laid over it, and is named
after what runs: `ar` when nothing drafts, `ngram` when prompt lookup replaces the draft model,
then one `+change` per knob flag (`stock+depth=3`, `stock+fault:accept-unverified`).

On a CPU run the other processes' load is read while the models load and while they are timed
(`cli.cpu_load`): under foreign load torch runs on the cores the others leave free, and a timing
under foreign load gets one `warning:` line on stderr, after the statistics, saying it is not
trustworthy. The rule for the numbers: tok/s and `--compare-ar`'s speedup are still printed with
that warning (AR is timed right after the system, in this process, on the same threads), and
`--json` carries the load as `cpu_load`. GPU runs are not watched.

Sampling: `--temperature` (0, the default: greedy), `--top-k`, `--top-p`, `--min-p` and `--seed`
map 1:1 onto `SamplingParams`; `--samples N` decodes N independent samples of each prompt as N
rows of one batch with seeds seed..seed+N-1 (a seed drawn at random, and printed, when none is
given) and prints each. Every path samples exactly from the target's processed distribution
(`engine.sampled_steps`); a sample's tokens depend on its seed, not on the batch. Bad values are
one `error:` line, exit 2, before any model loads.

`--save-jsonl FILE` refuses a FILE that exists (without `--overwrite`) before any model loads:
one `error:` line, exit 2, the file untouched.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specpilot.config import Deployment, System

HELP = "generate text with AR or speculative decoding and print stats"


def register(sub: argparse._SubParsersAction) -> None:
    from specpilot.config import AttentionKernel, Kernel, TreeConstruction

    p = sub.add_parser("generate", help=HELP,
                       description="Greedy or sampled generation with a target model and an optional drafter.")
    p.add_argument("--deployment", help="deployment file or shipped name (default: fixture)")
    p.add_argument("--target", help="target model directory, or 'fixture', loaded as stored (overrides the "
                   "deployment's target, its target_expand, target_format and target_experts)")
    p.add_argument("--drafter", help="draft model directory, DFlash drafter or EAGLE-3 head directory (public "
                   "z-lab/SpecForge/EAGLE layouts), 'fixture', 'ngram' or 'none' (AR)")
    p.add_argument("--system", help="system file, 'stock' (default) or 'ar'")
    p.add_argument("--depth", type=int, help="draft depth K (draft steps per round)")
    p.add_argument("--topk", type=int, help="children per expanded node / frontier width (1 = chain)")
    p.add_argument("--tree-budget", type=int, help="draft tokens verified per round (root excluded)")
    p.add_argument("--block-size", type=int, help="DFlash: positions per drafted block (root included)")
    p.add_argument("--tree-construction", choices=[c.value for c in TreeConstruction],
                   help="DFlash: chain, best_first (DDTree) or spine_first tree")
    p.add_argument("--tlv-chain", type=int, help="two-level verification: an FP8 view of the target drafts this "
                   "many tokens beside the drafter's tree, verified in the same forward (0: off)")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus: the smallest set of mass >= P (default 1: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="keep tokens with probability >= P x the largest (default 0: off)")
    p.add_argument("--seed", type=int, help="sampling seed of the first sample (default: drawn at random)")
    p.add_argument("--samples", type=int, default=1,
                   help="independent samples of each prompt, batched, seeds seed..seed+N-1 (default 1)")
    p.add_argument("--compare-ar", action="store_true", help="also run AR in the same process and report the speedup")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--kernel", choices=[k.value for k in Kernel if k is not Kernel.FUSED], help="projection kernel")
    p.add_argument("--w12", action="store_true", help="run projections from W12 weights (implies --kernel triton)")
    p.add_argument("--draft-kernel", choices=[k.value for k in Kernel],
                   help="the drafter's projection kernel (its projections, lm_head and feature fusion); fused: the "
                        "draft model's decoder layers in four fused Triton kernels each")
    p.add_argument("--attention", choices=[a.value for a in AttentionKernel],
                   help="cached attention: torch's SDPA (default) or the split-KV Triton kernel")
    p.add_argument("--compile", action="store_true",
                   help="draft_compile and verify_compile: the round's proposal and verification (AR: its step) "
                        "under torch.compile (CUDA; inert elsewhere)")
    p.add_argument("--pdl", action="store_true",
                   help="launch the Triton kernels (ours, inductor's) with programmatic dependent launch (sm_90+)")
    p.add_argument("--rope-store", action="store_true",
                   help="each attention layer's q/k norm, RoPE and K/V cache write in one Triton kernel (CUDA)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run eagerly instead of replaying CUDA graphs")
    p.add_argument("--fault", help="inject a fault: 'logit-bias:VALUE:every=K:after=T' or 'accept-unverified'")
    p.add_argument("--save-jsonl", help="write {prompt_ids, output_ids} per prompt to this JSONL file (for `specpilot guard`)")
    p.add_argument("--overwrite", action="store_true", help="allow --save-jsonl to replace an existing file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run_generate)


def deployment_from_args(args) -> Deployment:
    from specpilot.config import Deployment, TargetFormat, load_deployment

    if args.target and not args.deployment:
        # an ad-hoc deployment; an arbitrary target has no known draft model, so prompt lookup
        return Deployment(name="cli", target=args.target, drafter=args.drafter or "ngram")
    dep = load_deployment(args.deployment)
    changes = {}
    if args.target:
        changes.update(target=args.target, target_expand=1, target_format=TargetFormat.STORED, target_experts="")
    if args.drafter:
        changes["drafter"] = args.drafter
        changes["drafter_expand"] = 1
    return replace(dep, **changes) if changes else dep


def _dflash_block_size(drafter: str) -> int:
    """The trained block size when `drafter` names a DFlash drafter directory, else 0."""
    from specpilot.models.dflash_checkpoint import is_dflash_dir, read_dflash_config

    path = _drafter_dir(drafter)
    if path is None or not is_dflash_dir(path):
        return 0
    return read_dflash_config(path)[1].block_size


def _drafter_dir(drafter: str):
    """The directory `drafter` names (a shipped fixture drafter name or a path), None for the
    fixture's draft model, ngram and none."""
    from pathlib import Path

    from specpilot.models.fixture import SHIPPED_DRAFTERS, resolve_checkpoint

    if drafter in ("fixture", "ngram", "none"):
        return None
    return resolve_checkpoint(drafter, "drafter") if drafter in SHIPPED_DRAFTERS else Path(drafter)


def _is_eagle3(drafter: str) -> bool:
    """True when `drafter` names an EAGLE-3 head directory."""
    from specpilot.models.eagle3_checkpoint import is_eagle3_dir

    path = _drafter_dir(drafter)
    return path is not None and is_eagle3_dir(path)


def system_from_args(args, dep: Deployment) -> System:
    """The system to run, named after what it runs (see the module docstring)."""
    from specpilot.config import AttentionKernel, DrafterKind, Kernel, TreeConstruction, load_system

    system = load_system(args.system, dep)
    changes = {}
    if dep.drafter == "ngram" and system.drafter is not DrafterKind.NONE:
        changes["drafter"] = DrafterKind.NGRAM
    elif dep.drafter == "none":
        changes["drafter"] = DrafterKind.NONE
    elif system.drafter is DrafterKind.MODEL and _dflash_block_size(dep.drafter):
        # a DFlash directory drafts with its trained block, as SGLang's DFLASH default: one chain of
        # block_size - 1 drafts (flags below may turn it into a tree)
        changes["drafter"] = DrafterKind.DFLASH
        changes["block_size"] = _dflash_block_size(dep.drafter)
        changes["tree_budget"] = changes["block_size"] - 1
        changes["tree_construction"] = TreeConstruction.CHAIN
    elif system.drafter is DrafterKind.MODEL and _is_eagle3(dep.drafter):
        # an EAGLE-3 head drafts the stock best-first tree (SGLang's EAGLE defaults)
        changes["drafter"] = DrafterKind.EAGLE3
    for flag, knob in (("depth", "depth"), ("topk", "topk"), ("tree_budget", "tree_budget"),
                       ("block_size", "block_size"), ("tlv_chain", "tlv_chain")):
        if getattr(args, flag, None) is not None:
            changes[knob] = getattr(args, flag)
    if getattr(args, "tree_construction", None):
        changes["tree_construction"] = TreeConstruction(args.tree_construction)
    if args.kernel:
        changes["kernel"] = Kernel(args.kernel)
    if args.w12:
        changes["w12"], changes["kernel"] = True, Kernel.TRITON
    if getattr(args, "draft_kernel", None):
        changes["draft_kernel"] = Kernel(args.draft_kernel)
    if getattr(args, "attention", None):
        changes["attention"] = AttentionKernel(args.attention)
    if getattr(args, "compile", False):
        changes["verify_compile"] = True
        changes["draft_compile"] = changes.get("drafter", system.drafter) not in (DrafterKind.NONE, DrafterKind.NGRAM)
    if getattr(args, "pdl", False):
        changes["pdl"] = True
    if getattr(args, "rope_store", False):
        changes["rope_store"] = True
    if args.no_cuda_graphs:
        changes["cuda_graphs"] = False
    if args.fault:
        changes["fault"] = args.fault
    if "depth" in changes and "tree_budget" not in changes and changes.get("topk", system.topk) == 1:
        changes["tree_budget"] = changes["depth"]
    if not changes:
        return system
    run = system.with_changes(**changes)
    return run.with_changes(name=system_name(system, run))


def system_name(base: System, run: System) -> str:
    """`base`'s name for `run` (base with flags laid over it): 'ar' or 'ngram' when the drafter
    changed, then '+knob=value' per other knob that differs ('+fault:SPEC' for a fault)."""
    from specpilot.config import DrafterKind

    name = base.name
    if run.drafter is not base.drafter:
        name = "ar" if run.drafter is DrafterKind.NONE else run.drafter.value
    diff = run.diff(base)
    diff.pop("drafter", None)
    if not run.speculative:  # AR drafts nothing: the tree's shape does not matter
        for knob in ("depth", "topk", "tree_budget"):
            diff.pop(knob, None)
    parts = [name]
    for knob, (_, value) in diff.items():
        if knob == "fault" and value:
            parts.append(f"fault:{value}")
        else:
            parts.append(f"{knob}={json.dumps(value)}" if isinstance(value, bool) else f"{knob}={value}")
    return "+".join(parts)


def run_generate(args) -> int:
    from specpilot.cli.cpu_load import watched
    from specpilot.engine.faults import parse_fault
    from specpilot.engine.session import Session
    from specpilot.env import resolve_device
    from specpilot.errors import ConfigError
    from specpilot.guard.divergence import first_divergence

    if args.max_new_tokens < 1:
        raise ConfigError("--max-new-tokens must be >= 1")
    params = sampling_from_args(args)  # bad values: one `error:` line before anything loads
    if args.save_jsonl:  # before anything loads or runs: a refused file costs no generation
        from specpilot.guard.records import refuse_existing

        refuse_existing(args.save_jsonl, args.overwrite)
    dep = deployment_from_args(args)
    system = system_from_args(args, dep)
    parse_fault(system.fault)  # fail fast on a bad spec
    device = resolve_device(args.device)
    from specpilot.engine.memory_check import check_memory

    check_memory(dep, device)  # a CPU load that cannot fit: one `error:` line, before anything loads
    with watched(device) as cpu:
        session = Session.load(dep, device=device)
        prompts = [session.encode_prompt(p) for p in args.prompt for _ in range(args.samples)]
        rows = [params_for(params, i) for _ in args.prompt for i in range(args.samples)] if params else None
        gen = session.generator(system)
        cpu.fit_threads()  # under foreign load: torch on the cores left free
        warm = min(args.max_new_tokens, 16)
        gen.generate(prompts, warm, sampling=rows)  # warm-up: graph capture, allocator, kernel selection
        result = gen.generate(prompts, args.max_new_tokens, sampling=rows)
        if args.compare_ar:
            ar = session.generator(system.plain_ar().with_changes(fault=""))
            ar.generate(prompts, warm, sampling=rows)
            ar_result = ar.generate(prompts, args.max_new_tokens, sampling=rows)
        cpu.timed()
    report = {
        "system": system.name,
        "knobs": system.knobs(),
        "device": str(session.device),
        "tokens": result.num_tokens,
        "rounds": sum(result.rounds),
        "mean_accepted_length": result.mean_accepted_length,
        "seconds": result.seconds,
        "tokens_per_second": result.tokens_per_second,
    }
    if params is not None:
        report["sampling"] = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                              "min_p": params.min_p, "seeds": [r.seed for r in rows]}
    if args.compare_ar:
        report["ar_seconds"] = ar_result.seconds
        report["ar_tokens_per_second"] = ar_result.tokens_per_second
        report["speedup_vs_ar"] = ar_result.seconds / result.seconds
        if params is None:  # sampled outputs of two systems are equal in law, not token for token
            report["identical_to_ar"] = ar_result.outputs == result.outputs
            report["first_divergence"] = [first_divergence(a, b) for a, b in zip(result.outputs, ar_result.outputs)]
    if cpu.on:
        report["cpu_load"] = cpu.record()
    warning = cpu.warning("generate" + (" --compare-ar" if args.compare_ar else ""))
    if args.save_jsonl:
        from specpilot.guard.records import OutputRecord, write_records

        write_records(args.save_jsonl, [OutputRecord(tuple(p), tuple(o)) for p, o in zip(prompts, result.outputs)],
                      overwrite=args.overwrite)
        report["saved"] = args.save_jsonl
    texts = [session.tokenizer.decode(o) for o in result.outputs]
    if args.json:
        print(json.dumps({**report, "texts": texts}, indent=2))
    else:
        for i, text in enumerate(texts):
            prompt = args.prompt[i // args.samples]
            if params is not None:
                print(f"[sample {i % args.samples + 1}/{args.samples}, seed {rows[i].seed}]")
            print(prompt + text)
            print("-" * 60)
        print(format_stats(report), file=sys.stderr)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def sampling_from_args(args):
    """The flags' `SamplingParams` (its seed: the first sample's, drawn when not given), or None
    for greedy decoding with one sample per prompt."""
    from specpilot.engine.row_sampling import request_seed
    from specpilot.engine.sampling import SamplingParams
    from specpilot.errors import ConfigError

    if args.samples < 1:
        raise ConfigError(f"--samples must be >= 1 (got {args.samples})")
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    if params.greedy:
        if args.samples > 1:
            raise ConfigError("--samples N > 1 needs --temperature > 0 (greedy samples are all the same)")
        return None
    return replace(params, seed=request_seed(params))


def params_for(params, i: int):
    """Sample i's parameters: the flags' with seed + i."""
    return replace(params, seed=params.seed + i)


def format_stats(r: dict) -> str:
    lines = [
        f"system {r['system']} on {r['device']}: {r['tokens']} tokens in {r['seconds']:.3f} s "
        f"({r['tokens_per_second']:.1f} tok/s), {r['rounds']} target forwards, "
        f"mean accepted length {r['mean_accepted_length']:.2f}",
    ]
    if "sampling" in r:
        s = r["sampling"]
        lines.append(f"sampled: temperature {s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}, "
                     f"min-p {s['min_p']:g}; seeds {min(s['seeds'])}..{max(s['seeds'])}")
    if "speedup_vs_ar" in r:
        if "identical_to_ar" not in r:
            same = "sampled (equal to AR in distribution)"
        else:
            same = ("identical to AR" if r["identical_to_ar"]
                    else f"DIFFERS from AR (first divergence {r['first_divergence']})")
        lines.append(f"AR: {r['ar_tokens_per_second']:.1f} tok/s; speedup vs AR {r['speedup_vs_ar']:.2f}x; output {same}")
    if "saved" in r:
        lines.append(f"outputs written to {r['saved']}")
    return "\n".join(lines)
