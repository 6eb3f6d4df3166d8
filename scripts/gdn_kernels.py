"""One Gated DeltaNet layer's decode / verify step (conv + recurrence): the Triton kernels of
`specpilot.kernels.gdn` against the PyTorch reference of `specpilot.models.gdn`, and both against
the byte floor (GPU; `--smoke`: tiny shapes on CPU under the Triton interpreter, for the tests).

    python scripts/gdn_kernels.py --out DIR [--rounds 3] [--replays 20] [--sweep] [--smoke]

Each row is one layer of a width-x16 hybrid fixture (Hk=32, Hv=64, Dk=Dv=64) or of Qwen3.5-27B
(Hk=16, Hv=48, Dk=Dv=128), batch 1, at: the decode step (a chunk of T=1 that commits its state), a
chain verify (the tree of 8 nodes in a line) and best-first-like trees of 16-128 nodes (node states
written to the scratch). Arms, each one layer's calls as `GatedDeltaNet.forward` makes them, from
the conv input to the output before the gated norm: `kernels` (`gdn_conv` + `gdn_recurrence`) and
`reference` (`conv_windows` + `causal_conv` + `heads` + `gates` + `chunk_scan` / `tree_scan` and
the state writes, eager). Both are captured in a CUDA graph over rotating layer sets (states,
windows, weights) that together exceed L2, replayed, CUDA events around each replay, median µs per
layer (`kernels.timing.graph_time_us`); arms in rotated order over `--rounds`, fastest round kept.
Each arm's output and written states are checked against the reference first (max relative error).

Byte floor: the bytes one layer's step must move -- committed state read (float32), committed state
(chunk) or node states (tree) written, conv window, inputs x, a, b and conv weights read, output
written -- divided by this GPU's copy bandwidth (a 1 GiB device-to-device copy: 2 bytes moved per
byte copied). `--sweep` also times the recurrence at other blockings (value columns x warps).
Writes OUT/gdn_kernels.json and OUT/gdn_kernels.md.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.bench.provenance import capture  # noqa: E402
from specpilot.kernels import gdn as kernels  # noqa: E402
from specpilot.kernels.timing import copy_bandwidth, time_arms  # noqa: E402
from specpilot.models.recurrence import Recurrence  # noqa: E402


@dataclass(frozen=True)
class LayerShape:
    name: str
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    K: int = 4  # conv width

    @property
    def Cc(self) -> int:
        return 2 * self.Hk * self.Dk + self.Hv * self.Dv


@dataclass(frozen=True)
class Workload:
    name: str
    tokens: int  # T of a chunk, N of a tree
    tree: bool
    chain: bool = False  # a tree in a line (parents -1, 0, 1, ...)


SHAPES = (LayerShape("fixture-x16", 32, 64, 64, 64), LayerShape("Qwen3.5-27B-like", 16, 48, 128, 128))
WORKLOADS = (Workload("decode", 1, False), Workload("chain verify", 8, True, chain=True),
             *(Workload(f"tree {n}", n, True) for n in (16, 32, 64, 128)))
SMOKE_SHAPES = (LayerShape("smoke", 1, 2, 16, 16),)
SMOKE_WORKLOADS = (Workload("decode", 1, False), Workload("chain verify", 3, True, chain=True),
                   Workload("tree 5", 5, True))
SWEEP = ((16, 1), (16, 2), (8, 1), (32, 4))  # (value columns, warps) besides the default blocking
PREFIX = 600  # the committed tokens before the step (not fresh)
L2_COVER_BYTES = 200e6
MAX_SETS = 64
ARMS = ("kernels", "reference")


def best_first_tree(n: int, seed: int, top_k: int = 4) -> list[int]:
    """Parents of an n-node tree grown best first, as a drafter's tree is: from the root, always
    expand the frontier node of highest path probability, each node offering its top_k children
    (random descending probabilities). Nodes are numbered in expansion order (parent < child)."""
    rng = random.Random(seed)
    frontier, parents = [(0.0, -1)], []
    while len(parents) < n:
        cost, parent = heapq.heappop(frontier)
        node = len(parents)
        parents.append(parent)
        weights = sorted((rng.random() ** 2 for _ in range(top_k)), reverse=True)
        for w in weights:
            heapq.heappush(frontier, (cost - math.log(w / sum(weights) + 1e-12), node))
    return parents


def depths_of(parents: list[int]) -> list[int]:
    depths = []
    for p in parents:
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


def floor_bytes(shape: LayerShape, work: Workload, B: int = 1, act_bytes: int = 2) -> dict[str, int]:
    """Bytes one layer's step must move, by part."""
    s = shape
    state = B * s.Hv * s.Dk * s.Dv * 4
    T = work.tokens
    return {"state_read": state, "states_written": state * (T if work.tree else 1),
            "conv_window": B * (s.K - 1) * s.Cc * act_bytes, "inputs": B * T * (s.Cc + 2 * s.Hv) * act_bytes,
            "conv_weight": s.Cc * s.K * act_bytes, "output": B * T * s.Hv * s.Dv * act_bytes}


class Case:
    """One (layer shape, workload): the step's inputs, shared by every set, and `sets` layer sets
    (committed state, window, conv weight, A_log, dt_bias, node scratch)."""

    def __init__(self, shape: LayerShape, work: Workload, device, dtype, sets: int, seed: int = 0):
        s, T = shape, work.tokens
        self.shape, self.work, self.dtype = shape, work, dtype
        gen = torch.Generator().manual_seed(seed)
        proj = torch.randn(1, T, s.Cc + 2 * s.Hv, generator=gen).to(dtype).to(device)
        self.x, self.b, self.a = proj[..., :s.Cc], proj[..., s.Cc:s.Cc + s.Hv], proj[..., s.Cc + s.Hv:]
        t = torch.arange(T)
        if work.tree:
            parents = list(range(-1, T - 1)) if work.chain else best_first_tree(T, seed)
            depths = depths_of(parents)
            self.parents = torch.tensor([parents], device=device)
            self.depths = torch.tensor([depths], device=device)
            self.max_depth = max(depths)
            self.rec = Recurrence.tree(self.parents, self.depths, self.max_depth)
            self.positions = PREFIX + self.depths
            self.commit = None
        else:
            self.parents = self.depths = None
            self.max_depth = T - 1
            self.commit = torch.tensor([T - 1], device=device)
            self.rec = Recurrence.chunk(self.commit)
            self.positions = (PREFIX + t)[None].to(device)
        self.fresh = torch.zeros(1, dtype=torch.bool, device=device)
        self.config = SimpleNamespace(linear_num_key_heads=s.Hk, linear_num_value_heads=s.Hv,
                                      linear_key_head_dim=s.Dk, linear_value_head_dim=s.Dv)
        self.sets = [self._layer(gen, device) for _ in range(sets)]

    def _layer(self, gen, device) -> SimpleNamespace:
        s, T = self.shape, self.work.tokens
        return SimpleNamespace(
            state=(torch.randn(1, s.Hv, s.Dk, s.Dv, generator=gen) * 0.3).to(device),
            window=torch.randn(1, s.K - 1, s.Cc, generator=gen).to(self.dtype).to(device),
            weight=(torch.randn(s.Cc, s.K, generator=gen) * 0.3).to(self.dtype).to(device),
            A_log=torch.randn(s.Hv, generator=gen).to(device),
            dt_bias=torch.randn(s.Hv, generator=gen).to(device),
            node_state=torch.zeros(1, T, s.Hv, s.Dk, s.Dv, device=device) if self.work.tree else None)

    def kernels(self, layer, block_v: int = kernels.BLOCK_V, num_warps: int | None = None) -> torch.Tensor:
        y = kernels.gdn_conv(self.x, layer.window, self.positions, layer.weight, self.parents, self.depths)
        if block_v == kernels.BLOCK_V and num_warps is None:
            run = kernels.gdn_recurrence
        else:
            def run(*args, **kw):
                return kernels.gdn_recurrence_eager(*args, **kw, block_v=block_v, num_warps=num_warps)
        return run(y, self.a, self.b, layer.A_log, layer.dt_bias, layer.state, self.fresh, self.shape.Hk,
                   parents=self.parents, commit=self.commit, node_state=layer.node_state)

    def reference(self, layer) -> torch.Tensor:
        """The plain PyTorch implementation (`kernels.gdn.conv_reference`, `recurrence_reference`:
        what runs where the kernels cannot) from the conv input to the output before the gated norm."""
        y = kernels.conv_reference(self.x, layer.window, self.positions, layer.weight, self.parents, self.depths)
        return kernels.recurrence_reference(y, self.a, self.b, layer.A_log, layer.dt_bias, layer.state, self.fresh,
                                            self.shape.Hk, parents=self.parents, commit=self.commit,
                                            node_state=layer.node_state)

    def written(self, layer) -> torch.Tensor:
        return layer.node_state if self.work.tree else layer.state


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-30))


def check(case: Case, arm) -> dict[str, float]:
    """Max relative error of an arm's output and written states against the reference's, both run
    from copies of the first set."""
    def copy(layer):
        return SimpleNamespace(**{k: v.clone() if torch.is_tensor(v) else v for k, v in vars(layer).items()})
    mine, ref = copy(case.sets[0]), copy(case.sets[0])
    o, o_ref = arm(mine), case.reference(ref)
    return {"output": relative_error(o, o_ref), "states": relative_error(case.written(mine), case.written(ref))}


def measure(shape: LayerShape, work: Workload, args, device, bandwidth: float) -> dict:
    parts = floor_bytes(shape, work)
    per_set = parts["state_read"] + parts["states_written"] + parts["conv_window"] + parts["conv_weight"]
    sets = 1 if args.smoke else max(1, min(MAX_SETS, math.ceil(L2_COVER_BYTES / per_set)))
    case = Case(shape, work, device, torch.bfloat16, sets)
    arms = {"kernels": case.kernels, "reference": case.reference}
    if args.sweep:
        for bv, warps in SWEEP:
            if bv <= shape.Dv:
                arms[f"kernels bv{bv} w{warps}"] = lambda layer, bv=bv, w=warps: case.kernels(layer, bv, w)
    errors = {name: check(case, arm) for name, arm in arms.items() if name != "reference"}
    calls = {name: [(lambda arm=arm, layer=layer: arm(layer)) for layer in case.sets] for name, arm in arms.items()}
    best, runs = time_arms(calls, 1 if args.smoke else args.rounds, args.replays, args.smoke)
    floor = sum(parts.values())
    return {"shape": asdict(shape), "Cc": shape.Cc, "workload": work.name, "tokens": work.tokens,
            "mode": "tree" if work.tree else "chunk", "max_depth": case.max_depth,
            "parents": case.parents[0].tolist() if work.tree else None, "sets": sets,
            "floor_bytes": parts, "floor_bytes_total": floor, "floor_us": floor / bandwidth,
            "us": best, "rounds_us": runs, "over_floor": {k: v / (floor / bandwidth) for k, v in best.items()},
            "relative_error": errors}


def write_md(doc: dict, path: Path) -> None:
    env = doc["environment"]
    where = env.get("gpu") or env.get("cpu") or "CPU"
    smoke = " --smoke (CPU, interpreter: not a timing)" if doc["smoke"] else ""
    lines = [f"# Gated DeltaNet step per layer ({where})", "",
             f"{doc['date']}, commit {env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}; "
             f"torch {env['versions'].get('torch')}, triton {env['versions'].get('triton')}; "
             f"written by `scripts/gdn_kernels.py`{smoke}", "",
             f"µs per layer (conv + recurrence, batch 1), "
             + ("each call timed alone on CPU" if doc["smoke"] else "CUDA-graph replay over rotating layer sets")
             + f", median of {doc['replays']} replays, fastest of {doc['rounds']} rotated rounds. Floor: bytes that "
             f"must move / copy bandwidth ({doc['copy_bandwidth_GBps']:.0f} GB/s measured). Errors: max |kernels - "
             "reference| / max |reference| of the output and the written states.", "",
             "| layer | step | T or N | depth | floor MB | floor µs | kernels µs | x floor | reference µs | x floor "
             "| reference / kernels | kernels rel. error (out, states) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        us, over, err = r["us"], r["over_floor"], r["relative_error"]["kernels"]
        lines.append(f"| {r['shape']['name']} | {r['workload']} | {r['tokens']} | {r['max_depth']} | "
                     f"{r['floor_bytes_total'] / 1e6:.2f} | {r['floor_us']:.1f} | {us['kernels']:.1f} | "
                     f"{over['kernels']:.1f} | {us['reference']:.1f} | {over['reference']:.1f} | "
                     f"{us['reference'] / us['kernels']:.1f}x | {err['output']:.1e}, {err['states']:.1e} |")
    swept = sorted({k for r in doc["rows"] for k in r["us"]} - set(ARMS))
    if swept:
        lines += ["", "Recurrence blockings (value columns x warps; the default is "
                  f"{doc['default_block_v']} columns, warps by Dk), µs per layer:", "",
                  "| layer | step | kernels | " + " | ".join(swept) + " |", "|---|---|---|" + "---|" * len(swept)]
        for r in doc["rows"]:
            lines.append(f"| {r['shape']['name']} | {r['workload']} | {r['us']['kernels']:.1f} | "
                         + " | ".join(f"{r['us'][k]:.1f}" if k in r["us"] else "-" for k in swept) + " |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gdn_kernels.json and .md")
    ap.add_argument("--rounds", type=int, default=3, help="rotated rounds per row; the fastest is kept")
    ap.add_argument("--replays", type=int, default=20, help="graph replays per timing (median)")
    ap.add_argument("--sweep", action="store_true", help="also time the recurrence at other blockings")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter (tests)")
    args = ap.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import Triton
        device, shapes, works, args.replays = torch.device("cpu"), SMOKE_SHAPES, SMOKE_WORKLOADS, 2
    elif not torch.cuda.is_available():
        print("error: gdn_kernels.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    else:
        device, shapes, works = torch.device("cuda"), SHAPES, WORKLOADS
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(device, args.smoke)
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "smoke": args.smoke,
           "rounds": 1 if args.smoke else args.rounds, "replays": args.replays,
           "copy_bandwidth_GBps": bandwidth / 1e3, "default_block_v": kernels.BLOCK_V,
           "environment": capture(device, torch.bfloat16), "rows": []}
    for shape in shapes:
        for work in works:
            doc["rows"].append(measure(shape, work, args, device, bandwidth))
            (args.out / "gdn_kernels.json").write_text(json.dumps(doc, indent=1))
            write_md(doc, args.out / "gdn_kernels.md")
            r = doc["rows"][-1]
            print(shape.name, work.name, {k: round(v, 1) for k, v in r["us"].items()},
                  f"floor {r['floor_us']:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
