"""`specpilot w12 convert SRC DST` and `specpilot w12 verify SRC DST`.

Owns the argparse surface of the W12 tools; flags map 1:1 onto `convert_checkpoint` /
`verify_checkpoint` arguments. Bad input raises `CheckpointError` (one line, exit 2, printed by
`specpilot.cli`); `verify` exits 1 when any tensor differs. `convert` prints a short summary
(the per-tensor table with `--verbose`). Does not own the work (`specpilot/models/convert.py`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from specpilot import env

HELP = "convert checkpoints to the lossless 12-bit W12 format and verify them"


def run_convert(args: argparse.Namespace) -> int:
    from specpilot.models.convert import convert_checkpoint

    report = convert_checkpoint(
        args.src, args.dst, include_embeddings=args.embeddings, include_lm_head=args.lm_head,
        force=args.force, device=env.resolve_device(args.device), shard_bytes=int(args.shard_gb * 2**30),
        storage=args.storage,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    elif args.verbose:
        print("\n".join(report.lines()))
    else:
        print(report.lines()[-1])  # the totals: tensors converted, sizes, bits/weight, tensors kept
        weights, nbytes = kept_size(report.dst)
        weights += sum(t.weights for t in report.tensors)
        nbytes += sum(t.nbytes for t in report.tensors)
        print(f"whole model {8 * nbytes / weights:.4f} bits/weight; wrote {report.dst} (--verbose lists every tensor)")
    return 0


def kept_size(dst: str) -> tuple[int, int]:
    """(weights, bytes) of the tensors a conversion left as they were, from the header of DST's kept file."""
    from specpilot.models.convert import KEPT_FILE

    path = Path(dst) / KEPT_FILE
    if not path.is_file():
        return 0, 0
    with open(path, "rb") as f:  # safetensors: 8-byte little-endian header length, then the JSON header
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return (sum(math.prod(t["shape"]) for t in header.values()),
            sum(t["data_offsets"][1] - t["data_offsets"][0] for t in header.values()))


def run_verify(args: argparse.Namespace) -> int:
    from specpilot.models.convert import verify_checkpoint

    report = verify_checkpoint(args.src, args.dst)
    print(json.dumps(report.to_dict(), indent=1) if args.json else "\n".join(report.lines()))
    return 0 if report.ok else 1


def register(subparsers) -> None:
    """Add the `w12` subcommand (with `convert` and `verify`) to the main CLI's subparsers."""
    p = subparsers.add_parser("w12", help=HELP,
                              description="Lossless 12-bit storage of BF16 weights (see specpilot/w12/layout.py).")
    actions = p.add_subparsers(dest="w12_action", metavar="ACTION", required=True)

    c = actions.add_parser("convert", help="write a W12 copy of an HF BF16 model directory")
    c.add_argument("src", help="HF model directory with BF16 safetensors (single file or sharded)")
    c.add_argument("dst", help="output model directory (must not exist or be empty, unless --force)")
    c.add_argument("--embeddings", action="store_true",
                   help="also convert model.embed_tokens.weight (stored in W12, decoded to BF16 at load)")
    c.add_argument("--lm-head", action="store_true",
                   help="also convert lm_head.weight (runs through the W12 kernels)")
    c.add_argument("--storage", action="store_true",
                   help="store every 2-D BF16 tensor in W12 (any layout, drafter heads too) and load the directory "
                        "decoded, as the BF16 original: 25%% smaller on disk, not the runtime format")
    c.add_argument("--force", action="store_true", help="replace DST if it exists and is not empty")
    c.add_argument("--device", default=None, help="device to encode on (default: cuda if available, else cpu)")
    c.add_argument("--shard-gb", type=float, default=2.0, help="approximate size of each W12 shard file in GiB")
    c.add_argument("--json", action="store_true", help="print the report as JSON instead of the summary")
    c.add_argument("-v", "--verbose", action="store_true", help="also print the per-tensor table (name, shape, "
                                                                 "escapes, bits/weight)")
    c.set_defaults(func=run_convert)

    v = actions.add_parser("verify", help="decode every W12 tensor of DST and compare its bits with SRC")
    v.add_argument("src", help="the original HF model directory")
    v.add_argument("dst", help="the W12 model directory written by `convert`")
    v.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    v.set_defaults(func=run_verify)
