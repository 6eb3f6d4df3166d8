"""W12 projections called eagerly (a prefill) against the same calls captured in a CUDA graph (GPU).

    python scripts/w12_eager.py --out results/w12/eager [--commit HASH]

For fixture-x16's target projections (qkv, o, gate_up, down) at prefill's padded row counts (16, 64),
times three paths to one [M, N] output, each called back to back 200 times eagerly (wall clock per
call after a synchronize: the larger of the host's launch cost and the GPU's time) and replayed
in a CUDA graph (`timing.graph_time_us`: GPU time only):

- `w12 kernels`: the launch config of these rows (tuned table, else the heuristic; `choose_config`);
- `w12 copy`: cuBLAS on the weight's kept decoded copy (what an eager prefill runs, `dispatch.prefill_scope`);
- `bf16`: cuBLAS on a plain BF16 weight of the same values.

Random weights (normal, std 0.02). One weight per shape: eager rows read it from L2 when it fits,
which favours the GPU side, so an eager time above the graph time is the host's. Writes
w12_eager.json and w12_eager.md under --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {"qkv": (8192, 4096), "o": (4096, 4096), "gate_up": (32768, 4096), "down": (4096, 16384)}
ROWS = (16, 64)
CALLS = 200


def eager_us(fn, calls: int = CALLS) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure() -> list[dict]:
    import torch
    import torch.nn.functional as F

    from specpilot.kernels import dispatch
    from specpilot.kernels.configs import WeightFormat, choose_config
    from specpilot.kernels.timing import graph_time_us
    from specpilot.w12 import encode

    dev = torch.device("cuda")
    name = dispatch.device_name(dev)
    rows = []
    for label, (N, K) in SHAPES.items():
        torch.manual_seed(0)
        dense = (torch.randn(N, K, device=dev) * 0.02).to(torch.bfloat16)
        w12 = encode(dense)
        copy = dispatch.decoded(w12)
        assert torch.equal(copy, dense)
        for M in ROWS:
            x = (torch.randn(M, K, device=dev)).to(torch.bfloat16)
            choice = choose_config(WeightFormat.W12, M, N, K, name)  # the kernels, whatever `choose` says
            paths = {
                "w12 kernels": lambda: dispatch.linear(x, w12, config=choice),
                "w12 copy": lambda: F.linear(x, copy),
                "bf16": lambda: F.linear(x, dense),
            }
            row = {"shape": label, "M": M, "N": N, "K": K, "config": choice.label()}
            for path, fn in paths.items():
                row[path] = {"eager_us": eager_us(fn), "graph_us": graph_time_us([fn])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def render(rows: list[dict], meta: dict) -> str:
    out = [f"# W12 projections eager vs captured ({meta['device']}, fixture-x16 target shapes)", "",
           f"{meta['created']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}. "
           f"Eager: {CALLS} calls back to back, wall clock per call; graph: replayed in a CUDA graph, GPU "
           "time per call (`timing.graph_time_us`). µs.", "",
           "| shape | M | W12 config | W12 kernels eager | W12 kernels graph | W12 copy eager | W12 copy graph | "
           "BF16 eager | BF16 graph |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[p][k]:.1f}" for p in ("w12 kernels", "w12 copy", "bf16") for k in ("eager_us", "graph_us")]
        out.append(f"| {r['shape']} | {r['M']} | {r['config']} | " + " | ".join(cells) + " |")
    total = {p: {k: sum(r[p][k] for r in rows if r["M"] == 64) for k in ("eager_us", "graph_us")}
             for p in ("w12 kernels", "w12 copy", "bf16")}
    out += ["", "One decoder layer's four projections at M = 64 (sums): " + "; ".join(
        f"{p} eager {t['eager_us']:.1f}, graph {t['graph_us']:.1f}" for p, t in total.items()) + ".", "",
        "Written by `scripts/w12_eager.py`; every number is in w12_eager.json."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default="")
    args = p.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("error: w12_eager.py needs a CUDA GPU", file=sys.stderr)
        return 2
    commit = args.commit or subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    meta = {"device": torch.cuda.get_device_name(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": commit, "torch": torch.__version__, "triton": triton.__version__}
    rows = measure()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "w12_eager.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (out / "w12_eager.md").write_text(render(rows, meta))
    print(render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
