"""`specpilot guard`: force a candidate's and stock's outputs through the target and decide.

Owns the subcommand: flags (mapped 1:1 onto `GuardConfig`), loading the scorer, reading the two
JSONL files, printing the verdict, and the exit code (0 pass, 1 reject, 2 bad input via
`SpecPilotError`). The lead wires `register` into `specpilot.cli`.
"""

from __future__ import annotations

import argparse
import json

HELP = "token forcing: check that a candidate's outputs are as lossless as stock's"

EPILOG = """\
outputs files (JSONL), one JSON object per line, one line per prompt:
  {"prompt_ids": [int, ...], "output_ids": [int, ...]}
prompt_ids: the prompt's token ids as fed to the engine (non-empty); output_ids: the generated
token ids (EOS kept if emitted; may be empty). Extra keys are ignored, blank lines skipped.
`specpilot generate ... --save-jsonl FILE` writes this format. Both files must hold outputs for
the same prompts (any order; pairing is by prompt ids) unless --pairing says otherwise.

scorer: the target runs on the stock engine path (plain teacher-forced chunk forwards). Run it
in the SAME dtype the systems generated in (--dtype): near-ties are rounding effects of a dtype,
and the near-tie threshold defaults per dtype (bfloat16 0.5, float16 0.0625, float32 0.001 nats).

decision: reject if the one-sided 95% lower bound of rate(candidate) - rate(stock), from a
bootstrap over whole prompts (paired), exceeds --rate-margin-pp, or if the candidate has more
large-margin mismatches (margin > near-tie threshold) than stock.
sampling mode (--temperature > 0): for outputs SAMPLED with these settings (temperature, top-k,
top-p, min-p as in `specpilot generate`), each emitted token is forced through the target, its
processed distribution p taken, and u = F(x-) + V p(x) computed (randomized PIT, tokens ordered by
p). Exact sampling gives i.i.d. uniform u's. Reject if the candidate emitted more tokens with
p(x) = 0 than stock, or its u's fail a uniformity test (KS or chi-square) at 1 - confidence while
stock's pass. Use at least 16384 emitted tokens per side (--min-tokens) for power.
exit status: 0 pass, 1 reject, 2 bad input.
"""


def register(sub: argparse._SubParsersAction) -> None:
    from specpilot.guard.config import DTYPES, GuardConfig, Pairing, RateTest

    d = GuardConfig()
    p = sub.add_parser(
        "guard",
        help=HELP,
        description="Token forcing: feed a candidate system's and stock's outputs back through the target "
                    "and test whether the candidate mismatches the target's argmax more than stock does.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", required=True, help="target model directory, or 'fixture'")
    p.add_argument("--candidate", required=True, help="candidate system's outputs (JSONL, format below)")
    p.add_argument("--stock", required=True, help="stock system's outputs for the same prompts (JSONL)")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="scorer dtype: the dtype the systems ran in "
                   "(default: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--rate-margin-pp", type=float, default=100 * d.rate_margin,
                   help=f"allowed excess mismatch rate in percentage points (default {100 * d.rate_margin:g})")
    p.add_argument("--confidence", type=float, default=d.confidence,
                   help=f"one-sided confidence of the rate bound (default {d.confidence:g})")
    p.add_argument("--near-tie-nats", type=float,
                   help="mismatches with a margin up to this are near-ties (default: per dtype)")
    p.add_argument("--large-margin-allowance", type=int, default=d.large_margin_allowance,
                   help="large-margin mismatches allowed beyond stock's (default 0)")
    p.add_argument("--resamples", type=int, default=d.resamples, help=f"bootstrap resamples (default {d.resamples})")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="bootstrap seed; in sampling mode the seed of the PIT's V's (default 0)")
    p.add_argument("--chunk", type=int, default=d.chunk, help=f"tokens per forced forward (default {d.chunk})")
    p.add_argument("--pairing", choices=[m.value for m in Pairing], default=d.pairing.value,
                   help="required: same prompts, paired bootstrap (default); auto: paired when the prompts "
                        "match; independent: resample each side on its own")
    p.add_argument("--rate-test", choices=[m.value for m in RateTest], default=d.rate_test.value,
                   help="excess: reject when the lower bound exceeds the margin (default); non-inferiority: "
                        "reject unless the upper bound is below it")
    p.add_argument("--min-sequences", type=int, default=d.min_sequences,
                   help=f"warn below this many prompts (default {d.min_sequences})")
    from specpilot.guard.sampling import SamplingGuardConfig, TokenOrder, UniformityTest

    sd = SamplingGuardConfig()
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the outputs were sampled at this temperature: the sampling guard (default 0: token forcing)")
    p.add_argument("--top-k", type=int, default=0, help="sampling mode: the outputs' top-k (default 0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling mode: the outputs' top-p (default 1: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="sampling mode: the outputs' min-p (default 0: off)")
    p.add_argument("--uniformity-test", choices=[t.value for t in UniformityTest], default=sd.test.value,
                   help="sampling mode: Kolmogorov-Smirnov (default) or chi-square on equal bins")
    p.add_argument("--order", choices=[o.value for o in TokenOrder], default=sd.order.value,
                   help="sampling mode: token order of the PIT (default: by probability)")
    p.add_argument("--min-tokens", type=int, default=sd.min_tokens,
                   help=f"sampling mode: caution below this many scored tokens per side (default {sd.min_tokens})")
    p.set_defaults(func=run_guard)


def config_from_args(args):
    from specpilot.guard.config import GuardConfig, Pairing, RateTest

    return GuardConfig(
        rate_margin=args.rate_margin_pp / 100.0,
        confidence=args.confidence,
        near_tie_nats=args.near_tie_nats,
        large_margin_allowance=args.large_margin_allowance,
        resamples=args.resamples,
        seed=args.seed,
        chunk=args.chunk,
        pairing=Pairing(args.pairing),
        rate_test=RateTest(args.rate_test),
        min_sequences=args.min_sequences,
    )


def load_scorer(name: str, device: str | None, dtype_name: str | None):
    """The target on `device` in `dtype_name` (defaults as the engine's)."""
    from specpilot import env
    from specpilot.engine.session import load_role
    from specpilot.guard.config import DTYPES

    dev = env.resolve_device(device or None)  # one `error:` line for a device this torch cannot use
    dtype = DTYPES[dtype_name] if dtype_name else env.default_dtype(dev)
    return load_role(name, "target", 1, dev, dtype)


def sampling_from_args(args):
    """(SamplingParams, SamplingGuardConfig) of sampling mode, or None for token forcing."""
    from specpilot.engine.sampling import SamplingParams
    from specpilot.errors import ConfigError
    from specpilot.guard.sampling import SamplingGuardConfig, TokenOrder, UniformityTest

    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p)
    if params.greedy:
        return None
    if not 0.5 < args.confidence < 1.0:
        raise ConfigError(f"guard confidence must be in (0.5, 1) (got {args.confidence})")
    config = SamplingGuardConfig(alpha=1.0 - args.confidence, test=UniformityTest(args.uniformity_test),
                                 order=TokenOrder(args.order), min_tokens=args.min_tokens, seed=args.seed)
    return params, config


def run_sampling_guard(args, params, config) -> int:
    from specpilot.guard.forcing import check_records
    from specpilot.guard.records import read_records
    from specpilot.guard.sampled_forcing import sampling_gate

    candidate = read_records(args.candidate)  # format errors before the model loads
    stock = read_records(args.stock)
    target = load_scorer(args.target, args.device, args.dtype)
    check_records(target, candidate, args.candidate)
    check_records(target, stock, args.stock)
    verdict = sampling_gate(target, candidate, stock, params, config, args.chunk)
    print(json.dumps(verdict.to_dict(), indent=2) if args.json else verdict.summary())
    return 0 if verdict.passed else 1


def run_guard(args) -> int:
    from specpilot.guard.forcing import check_records
    from specpilot.guard.gate import gate
    from specpilot.guard.records import read_records
    from specpilot.guard.verdict import pair_prompts

    sampled = sampling_from_args(args)  # bad values: one `error:` line before anything loads
    if sampled is not None:
        return run_sampling_guard(args, *sampled)
    config = config_from_args(args)
    candidate = read_records(args.candidate)  # format errors before the model loads
    stock = read_records(args.stock)
    pair_prompts([r.prompt_ids for r in candidate], [r.prompt_ids for r in stock], config.pairing)
    target = load_scorer(args.target, args.device, args.dtype)
    check_records(target, candidate, args.candidate)  # ids and lengths, naming the file
    check_records(target, stock, args.stock)
    verdict = gate(target, candidate, stock, config)
    print(json.dumps(verdict.to_dict(), indent=2) if args.json else verdict.summary())
    return 0 if verdict.passed else 1
