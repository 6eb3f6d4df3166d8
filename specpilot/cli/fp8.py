"""`specpilot fp8 convert SRC DST [--per-channel]`: a block-wise 128x128 (or per-channel) FP8 (e4m3)
copy of a BF16/float32 model.

Owns the argparse surface; flags map 1:1 onto `convert_fp8` arguments. Bad input raises
`CheckpointError` (one `error:` line, exit 2, printed by `specpilot.cli`). Does not own the work
(`specpilot/models/fp8_checkpoint.py`) or loading FP8 directories (`models.loading`, any command's
`--target`).
"""

from __future__ import annotations

import argparse
import json

HELP = "convert checkpoints to FP8 (e4m3; 128x128 block scales, or per-channel)"


def run_convert(args: argparse.Namespace) -> int:
    from specpilot.models.fp8_checkpoint import convert_fp8

    report = convert_fp8(args.src, args.dst, lm_head=args.lm_head, force=args.force, per_channel=args.per_channel)
    if args.json:
        print(json.dumps({"dst": report.dst, "quantized": list(report.quantized), "kept": report.kept,
                          "bytes_before": report.bytes_before, "bytes_after": report.bytes_after}, indent=1))
    else:
        print(report.line())
    return 0


def register(subparsers) -> None:
    """Add the `fp8` subcommand (with `convert`) to the main CLI's subparsers."""
    p = subparsers.add_parser("fp8", help=HELP, description="FP8 targets: block-wise e4m3 weights with float32 "
                                                            "scales, as DeepSeek/Qwen FP8 releases store them.")
    actions = p.add_subparsers(dest="fp8_action", metavar="ACTION", required=True)
    c = actions.add_parser("convert", help="write an FP8 copy of an HF BF16/float32 model directory")
    c.add_argument("src", help="HF model directory with BF16 or float32 safetensors (dense or hybrid)")
    c.add_argument("dst", help="output model directory (must not exist or be empty, unless --force)")
    c.add_argument("--lm-head", action="store_true", help="also quantize lm_head.weight (kept unquantized by default)")
    c.add_argument("--per-channel", action="store_true",
                   help="one scale per output row instead of 128x128 blocks (what the FP8 kernel reads fastest)")
    c.add_argument("--force", action="store_true", help="replace DST if it exists and is not empty")
    c.add_argument("--json", action="store_true", help="print the report as JSON instead of one summary line")
    c.set_defaults(func=run_convert)
