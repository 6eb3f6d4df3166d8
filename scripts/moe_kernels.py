"""One sparse MoE layer's routed experts at decode / verify sizes: the pair-wise GEMV kernels of
`specpilot.kernels.moe_gemv` against the grouped-GEMM path of `Experts.forward` (`torch._grouped_mm`
with its sort / gather glue), and both against the byte floor (GPU; `--smoke`: tiny shapes on CPU
under the Triton interpreter, for the tests).

    python scripts/moe_kernels.py --out DIR [--rounds 3] [--replays 20] [--sweep] [--smoke]

Rows: a Qwen3-30B-A3B-like layer (C=2048, I=768, E=128, k=8) and the MoE decoder of
`scripts/families_checks.py` (C=2048, I=768, E=64, k=8), BF16, at T = 1, 2, 4, 8, 16 tokens (T*k
pairs; the kernels are `Experts.forward`'s path up to `moe_gemv.MAX_PAIRS` pairs, timed here beyond
it too, to place that threshold). Each token routes to k distinct uniformly random experts. Arms,
from x, the routing weights and the ids to the layer's expert output: `kernels`
(`moe_gemv.moe_experts_eager`: three kernels) and `grouped` (`Experts.forward(kernel=False,
grouped=True)`: sort, gathers, two grouped GEMMs, the ordered sum). Each arm's calls are captured in
a CUDA graph over rotating routings (`--sets` of them, each a fresh draw of experts, so that the
weights come from HBM, not L2), replayed, CUDA events around each replay, median µs per call
(`kernels.timing.graph_time_us`); arms in rotated order over `--rounds`, fastest round kept. Each
arm's output is checked against `moe_gemv.reference` first (max relative error).

Byte floor: the weights of the distinct experts the T tokens route to (gate|up and down rows, each
read once) plus x, the routing and the output, divided by this GPU's copy bandwidth (a 1 GiB
device-to-device copy: 2 bytes moved per byte copied). `--sweep` also times the kernels at other
blockings. Writes OUT/moe_kernels.json and OUT/moe_kernels.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.provenance import capture
from specpilot.kernels import moe_gemv
from specpilot.kernels.timing import copy_bandwidth, time_arms
from specpilot.models.config import ModelConfig
from specpilot.models.moe import Experts


@dataclass(frozen=True)
class LayerShape:
    name: str
    C: int  # hidden size
    I: int  # expert intermediate size
    E: int  # experts
    k: int  # experts per token

    def expert_bytes(self, act_bytes: int = 2) -> int:
        """One expert's weights: gate|up [2I,C] and down [C,I]."""
        return 3 * self.C * self.I * act_bytes


SHAPES = (LayerShape("Qwen3-30B-A3B-like", 2048, 768, 128, 8), LayerShape("families_checks moe", 2048, 768, 64, 8))
TOKENS = (1, 2, 4, 8, 16)
SMOKE_SHAPES = (LayerShape("smoke", 40, 24, 8, 2),)
SMOKE_TOKENS = (1, 3)
SWEEP = (moe_gemv.Blocking(gate_up_n=8, down_n=16), moe_gemv.Blocking(gate_up_n=32, down_n=64),
         moe_gemv.Blocking(gate_up_n=16, gate_up_k=128, down_n=32, down_k=128),
         moe_gemv.Blocking(gate_up_n=16, down_n=32, num_warps=8))
ARMS = ("kernels", "grouped")


def blocking_label(b: moe_gemv.Blocking) -> str:
    return f"kernels gu{b.gate_up_n}x{b.gate_up_k} d{b.down_n}x{b.down_k} w{b.num_warps}"


def floor_bytes(shape: LayerShape, T: int, distinct: int, act_bytes: int = 2) -> dict[str, int]:
    """Bytes the layer's routed experts must move for T tokens routed to `distinct` experts, by part."""
    return {"expert_weights": distinct * shape.expert_bytes(act_bytes), "x": T * shape.C * act_bytes,
            "routing": T * shape.k * (act_bytes + 8), "output": T * shape.C * act_bytes}


class Case:
    """One (layer shape, T): the experts (shared) and `sets` routings of T tokens."""

    def __init__(self, shape: LayerShape, T: int, device, dtype, sets: int, seed: int = 0):
        s = shape
        self.shape, self.T = shape, T
        gen = torch.Generator().manual_seed(seed)
        cfg = ModelConfig(family="qwen3_moe", vocab_size=32, hidden_size=s.C, intermediate_size=s.I, num_layers=1,
                          num_heads=1, num_kv_heads=1, head_dim=8, num_experts=s.E, num_experts_per_tok=s.k,
                          moe_intermediate_size=s.I)
        self.experts = Experts(cfg).to(device=device, dtype=dtype)
        with torch.no_grad():  # N(0, 1/fan_in), drawn on the device (GB of weights)
            self.experts.gate_up_proj.normal_(std=s.C**-0.5)
            self.experts.down_proj.normal_(std=s.I**-0.5)
        self.sets = []
        for _ in range(sets):
            ids = torch.stack([torch.randperm(s.E, generator=gen)[:s.k] for _ in range(T)])
            w = torch.rand(T, s.k, generator=gen) + 0.05
            x = torch.randn(T, s.C, generator=gen)
            self.sets.append((x.to(device, dtype), (w / w.sum(-1, keepdim=True)).to(device, dtype), ids.to(device)))

    def distinct(self) -> float:
        """Mean distinct experts over the routings."""
        return statistics.mean(len(ids.unique()) for _, _, ids in self.sets)

    def kernels(self, routing, block: moe_gemv.Blocking | None = None) -> torch.Tensor:
        x, w, ids = routing
        return moe_gemv.moe_experts_eager(x, w, ids, self.experts.gate_up_proj, self.experts.down_proj, block=block)

    def grouped(self, routing) -> torch.Tensor:
        x, w, ids = routing
        return self.experts(x, w, ids, kernel=False, grouped=True)

    def reference(self, routing) -> torch.Tensor:
        x, w, ids = routing
        return moe_gemv.reference(x, w, ids, self.experts.gate_up_proj, self.experts.down_proj)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-30))


def measure(shape: LayerShape, T: int, args, device, bandwidth: float) -> dict:
    case = Case(shape, T, device, torch.bfloat16, 1 if args.smoke else args.sets)
    arms = {"kernels": case.kernels}
    if device.type == "cuda" and hasattr(torch, "_grouped_mm"):
        arms["grouped"] = case.grouped
    if args.sweep:
        for b in SWEEP:
            arms[blocking_label(b)] = lambda routing, b=b: case.kernels(routing, b)
    ref = case.reference(case.sets[0])
    errors = {name: relative_error(arm(case.sets[0]), ref) for name, arm in arms.items()}
    calls = {name: [(lambda arm=arm, r=r: arm(r)) for r in case.sets] for name, arm in arms.items()}
    best, runs = time_arms(calls, 1 if args.smoke else args.rounds, args.replays, args.smoke)
    distinct = case.distinct()
    parts = floor_bytes(shape, T, round(distinct))
    floor = sum(parts.values())
    return {"shape": asdict(shape), "tokens": T, "pairs": T * shape.k, "kernel_path": T * shape.k <= moe_gemv.MAX_PAIRS,
            "distinct_experts": distinct, "sets": len(case.sets), "floor_bytes": parts, "floor_bytes_total": floor,
            "floor_us": floor / bandwidth, "us": best, "rounds_us": runs,
            "over_floor": {k: v / (floor / bandwidth) for k, v in best.items()}, "relative_error": errors}


def write_md(doc: dict, path: Path) -> None:
    env = doc["environment"]
    where = env.get("gpu") or env.get("cpu") or "CPU"
    smoke = " --smoke (CPU, interpreter: not a timing)" if doc["smoke"] else ""
    lines = [f"# MoE routed experts per layer ({where})", "",
             (f"{doc['date']}, commit {env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}; "
              f"torch {env['versions'].get('torch')}, triton {env['versions'].get('triton')}; "
              f"written by `scripts/moe_kernels.py`{smoke}"), "",
             "µs per layer (the routed experts, BF16), "
             + ("each call timed alone on CPU" if doc["smoke"] else "CUDA-graph replay over rotating routings")
             + f", median of {doc['replays']} replays, fastest of {doc['rounds']} rotated rounds. Floor: the distinct "
             f"routed experts' weights + x, routing, output / copy bandwidth ({doc['copy_bandwidth_GBps']:.0f} GB/s "
             f"measured). `Experts.forward` takes the kernels up to {doc['max_pairs']} pairs. Errors: max |arm - "
             "reference| / max |reference|.", "",
             ("| layer | T | pairs | experts read | floor MB | floor µs | kernels µs | x floor | grouped µs | x floor "
              "| grouped / kernels | kernels rel. error |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        us, over = r["us"], r["over_floor"]
        g = us.get("grouped")
        grouped = (f"{g:.1f} | {over['grouped']:.1f} | {g / us['kernels']:.2f}x" if g is not None else "- | - | -")
        lines.append(f"| {r['shape']['name']} | {r['tokens']} | {r['pairs']}{'' if r['kernel_path'] else ' (grouped)'} | "
                     f"{r['distinct_experts']:.1f} | {r['floor_bytes_total'] / 1e6:.2f} | {r['floor_us']:.1f} | "
                     f"{us['kernels']:.1f} | {over['kernels']:.1f} | {grouped} | {r['relative_error']['kernels']:.1e} |")
    swept = sorted({k for r in doc["rows"] for k in r["us"]} - set(ARMS))
    if swept:
        lines += ["", "Kernel blockings (gate|up rows x columns, down rows x columns, warps), µs per layer:", "",
                  "| layer | T | kernels | " + " | ".join(swept) + " |", "|---|---|---|" + "---|" * len(swept)]
        for r in doc["rows"]:
            lines.append(f"| {r['shape']['name']} | {r['tokens']} | {r['us']['kernels']:.1f} | "
                         + " | ".join(f"{r['us'][k]:.1f}" if k in r["us"] else "-" for k in swept) + " |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for moe_kernels.json and .md")
    ap.add_argument("--rounds", type=int, default=3, help="rotated rounds per row; the fastest is kept")
    ap.add_argument("--replays", type=int, default=20, help="graph replays per timing (median)")
    ap.add_argument("--sets", type=int, default=16, help="routings per row, replayed in turn (fresh experts each)")
    ap.add_argument("--sweep", action="store_true", help="also time the kernels at other blockings")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import Triton
        device, shapes, tokens, args.replays = torch.device("cpu"), SMOKE_SHAPES, SMOKE_TOKENS, 2
    elif not torch.cuda.is_available():
        print("error: moe_kernels.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    else:
        device, shapes, tokens = torch.device("cuda"), SHAPES, TOKENS
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(device, args.smoke)
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "smoke": args.smoke,
           "rounds": 1 if args.smoke else args.rounds, "replays": args.replays,
           "copy_bandwidth_GBps": bandwidth / 1e3, "max_pairs": moe_gemv.MAX_PAIRS,
           "default_blocking": asdict(moe_gemv.Blocking()), "environment": capture(device, torch.bfloat16), "rows": []}
    for shape in shapes:
        for T in tokens:
            with torch.inference_mode():
                doc["rows"].append(measure(shape, T, args, device, bandwidth))
            (args.out / "moe_kernels.json").write_text(json.dumps(doc, indent=1))
            write_md(doc, args.out / "moe_kernels.md")
            r = doc["rows"][-1]
            print(shape.name, f"T={T}", {k: round(v, 1) for k, v in r["us"].items()},
                  f"floor {r['floor_us']:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
