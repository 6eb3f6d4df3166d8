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
    p.add_argument("--seed", type=int, default=d.seed, help="bootstrap seed (default 0)")
    p.add_argument("--chunk", type=int, default=d.chunk, help=f"tokens per forced forward (default {d.chunk})")
    p.add_argument("--pairing", choices=[m.value for m in Pairing], default=d.pairing.value,
                   help="required: same prompts, paired bootstrap (default); auto: paired when the prompts "
                        "match; independent: resample each side on its own")
    p.add_argument("--rate-test", choices=[m.value for m in RateTest], default=d.rate_test.value,
                   help="excess: reject when the lower bound exceeds the margin (default); non-inferiority: "
                        "reject unless the upper bound is below it")
    p.add_argument("--min-sequences", type=int, default=d.min_sequences,
                   help=f"warn below this many prompts (default {d.min_sequences})")
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


def run_guard(args) -> int:
    from specpilot.guard.forcing import check_records
    from specpilot.guard.gate import gate
    from specpilot.guard.records import read_records
    from specpilot.guard.verdict import pair_prompts

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
