"""GPU benchmark of the FP8 projection kernels, and FP8 against BF16 AR decoding end to end (issue 59).

    python scripts/fp8_kernels.py --out DIR [--commit HASH] [--rounds 2] [--new-tokens 256] [--smoke]

Kernels: every projection of fixture-x16 (hidden 4096, MLP 16384: `fixture` widened x16 by
`models.expand`) and of a Qwen3-8B-like model, at M = 1, 4, 16, 32, 64, 128 rows. Arms: our
weight-only kernel (`kernels.fp8_gemm`) on per-channel and on block-wise 128x128 e4m3 weights;
W8A8 per-channel (dynamic per-token activation scales, quantization included) by our kernel and by
`torch._scaled_mm`, and `torch._scaled_mm` alone on pre-quantized activations; BF16 cuBLAS
(`F.linear`). Timing (`kernels.timing.time_arms`): calls captured in a CUDA graph over rotating
weight sets that together exceed L2, median over REPLAYS replays, arms in rotated order over --rounds,
the fastest round kept. Floor: the bytes an FP8 call must move (codes, scales, activations, output)
over this GPU's copy bandwidth (a 1 GiB device-to-device copy, read + write). Each FP8 arm's max
relative error, max |y - ref| / max |ref|, is against the float32 dequantize-then-matmul of its
weights (activation quantization counts as error for W8A8).

End to end: AR decode at batch 1 of the fixture-x16 target in BF16 and of its FP8 twins, the
expanded projections quantized in memory by `specpilot fp8 convert`'s code (block-wise 128x128,
`quantize_blockwise`) and per channel (`quantize_per_channel`), lm_head kept BF16 as convert
keeps it. Each arm runs `engine.Generator` with CUDA graphs; tokens/s over --new-tokens, arms
interleaved over --rounds (fastest kept), FP8/BF16 ratios from this run. Each arm's greedy tokens
are compared with its own reference path: FP8 with every projection on the dequantize-then-
`F.linear` reference (`FP8Kernel.REFERENCE`, also timed), BF16 with the same model run eagerly
(no CUDA graphs).

--smoke: tiny shapes and a tiny random model on CPU under the Triton interpreter (tests: every code
path, no timing worth reading). Writes OUT/fp8_kernels.json and OUT/fp8_kernels.md after every
section; each section runs in try/except, so a failure costs only that part.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.kernels.timing import copy_bandwidth, time_arms

MS = (1, 4, 16, 32, 64, 128)
SMOKE_MS = (1, 5, 17)
L2_COVER_BYTES = 200e6
MIN_SETS, MAX_SETS = 2, 16
PROMPT_TOKENS = 64
REPLAYS = 7  # graph replays per timing (median)


@dataclass(frozen=True)
class Projection:
    model: str
    name: str
    N: int
    K: int


def model_projections(model: str, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int):
    return [Projection(model, "qkv", (heads + 2 * kv_heads) * head_dim, hidden),
            Projection(model, "o", hidden, heads * head_dim),
            Projection(model, "gate_up", 2 * intermediate, hidden),
            Projection(model, "down", hidden, intermediate)]


# fixture target (hidden 256, MLP 1024, 4 heads, 2 kv heads, head dim 64) widened x16
SHAPES = (model_projections("fixture-x16", 4096, 16384, 64, 32, 64)
          + model_projections("Qwen3-8B-like", 4096, 12288, 32, 8, 128))
SMOKE_SHAPES = (Projection("smoke", "a", 72, 256), Projection("smoke", "b", 48, 320))


# -- measuring --------------------------------------------------------------------------------
def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(min=1e-30))


def fp8_bytes(p: Projection, M: int, scale_cols: int, x_bytes: int = 2) -> int:
    return p.N * p.K + p.N * scale_cols * 4 + M * p.K * x_bytes + M * p.N * 2


def kernel_rows(p: Projection, args, device, bandwidth: float) -> list[dict]:
    """Every M of one projection: arms' µs, floor, errors."""
    from specpilot.kernels.fp8_activations import quantize_activations
    from specpilot.kernels.fp8_dispatch import FP8Kernel, backend
    from specpilot.kernels.fp8_gemm import choose_config, fp8_gemm, reference
    from specpilot.models.fp8_checkpoint import quantize_blockwise, quantize_per_channel

    dtype = torch.float32 if args.smoke else torch.bfloat16
    sets = 1 if args.smoke else max(MIN_SETS, min(MAX_SETS, -(-int(L2_COVER_BYTES) // (p.N * p.K))))
    gen = torch.Generator(device=device).manual_seed(p.N + p.K)
    bf16, channel, block = [], [], []
    for _ in range(sets):
        w = torch.randn(p.N, p.K, device=device, generator=gen) * 0.02
        bf16.append(w.to(dtype))
        channel.append(quantize_per_channel(w))  # (codes, scale [N, 1])
        codes, scale_inv = quantize_blockwise(w)  # scale_inv [ceil(N/128), ceil(K/128)]
        block.append((codes, scale_inv.repeat_interleave(128, 0)[:p.N].contiguous()))  # FP8Weight's row grid
        del w
    rows = []
    for M in (SMOKE_MS if args.smoke else MS):
        x = (torch.randn(M, p.K, device=device, generator=gen)).to(dtype)
        xq, xs = quantize_activations(x, p.K)
        arms = {
            "fp8 channel": [lambda x=x, c=c, s=s: fp8_gemm(x, c, s, p.K) for c, s in channel],
            "fp8 block128": [lambda x=x, c=c, s=s: fp8_gemm(x, c, s, 128) for c, s in block],
            "w8a8 triton": [lambda x=x, c=c, s=s: backend(FP8Kernel.W8A8_TRITON).run(x, c, s, p.K)
                            for c, s in channel],
            "bf16 cublas": [lambda x=x, w=w: F.linear(x, w) for w in bf16],
        }
        refs = {"fp8 channel": reference(x, *channel[0], p.K), "fp8 block128": reference(x, *block[0], 128),
                "w8a8 triton": reference(x, *channel[0], p.K)}
        skipped = {}
        why = backend(FP8Kernel.W8A8_SCALED_MM).why_not(x, *channel[0], p.K)
        if why is None:
            arms["w8a8 scaled_mm"] = [lambda x=x, c=c, s=s: backend(FP8Kernel.W8A8_SCALED_MM).run(x, c, s, p.K)
                                      for c, s in channel]
            arms["scaled_mm only"] = [lambda xq=xq, xs=xs, c=c, s=s: torch._scaled_mm(
                xq, c.t(), scale_a=xs, scale_b=s.view(1, -1), out_dtype=dtype) for c, s in channel]
            refs["w8a8 scaled_mm"] = refs["w8a8 triton"]
        else:
            skipped["w8a8 scaled_mm"] = why
        errors = {}
        for name, ref in refs.items():
            try:
                errors[name] = relative_error(arms[name][0](), ref)
            except Exception as err:  # an arm that fails is reported and not timed
                skipped[name] = f"{type(err).__name__}: {err}"
                arms.pop(name)
        best, runs = time_arms(arms, 1 if args.smoke else args.rounds, 1 if args.smoke else REPLAYS, args.smoke)
        floors = {"fp8 channel": fp8_bytes(p, M, 1), "fp8 block128": fp8_bytes(p, M, -(-p.K // 128)),
                  "bf16": 2 * p.N * p.K + M * p.K * 2 + M * p.N * 2}
        c = choose_config(M, p.N, p.K, p.K, device)
        rows.append({"model": p.model, "projection": p.name, "N": p.N, "K": p.K, "M": M, "sets": sets,
                     "floor_bytes": floors, "floor_us": {k: v / bandwidth for k, v in floors.items()},
                     "us": best, "rounds_us": runs, "relative_error": errors, "skipped": skipped,
                     "config_channel": vars(c)})
        print(p.model, p.name, M, {k: round(v, 1) for k, v in best.items()},
              f"floor {floors['fp8 channel'] / bandwidth:.1f} us", flush=True)
    return rows


# -- end to end -------------------------------------------------------------------------------
def fp8_twin(model, how: str, kernel: str):
    """A copy of `model` sharing every tensor but the projections, which become `FP8Linear`s of the
    expanded weights quantized block-wise (convert's code) or per channel, run by `kernel`."""
    from specpilot.models.fp8_checkpoint import FP8Scheme, fp8_weight, quantize_blockwise, quantize_per_channel
    from specpilot.models.fp8_linear import Activation, FP8Linear, FP8Weight
    from specpilot.models.transformer import replace_linears

    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    twin = copy.deepcopy(model, memo)

    def make(name, linear):
        w = linear.weight.detach()
        if how == "block128":
            codes, scale_inv = quantize_blockwise(w)
            weight = fp8_weight(codes, scale_inv, FP8Scheme((128, 128), Activation.DYNAMIC), None, name, "fp8_kernels")
        else:
            codes, scale = quantize_per_channel(w)
            weight = FP8Weight(codes, scale, w.shape[1], Activation.DYNAMIC)
        return FP8Linear(weight, kernel)

    count = replace_linears(twin, make)
    return twin, count


def build_target(args, device):
    from specpilot.engine.session import resolve_model_dir
    from specpilot.models.expand import load_expanded
    from specpilot.models.loading import load_model

    if args.smoke:
        from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint

        folder = Path(tempfile.mkdtemp(prefix="fp8_kernels_"))
        path = write_random_checkpoint(folder / "tiny", tiny_config(num_layers=2, hidden_size=128,
                                                                    intermediate_size=256, num_heads=4,
                                                                    num_kv_heads=2, head_dim=32))
        return load_model(path, device=device, dtype=torch.float32), "tiny random (smoke)"
    path = resolve_model_dir("fixture", "target")
    return load_expanded(path, 16, device=device, dtype=torch.bfloat16), "fixture-x16 target"


def end_to_end(args, device) -> dict:
    from specpilot.engine.generator import Generator

    target, label = build_target(args, device)
    new = 4 if args.smoke else args.new_tokens
    g = torch.Generator().manual_seed(1)
    prompt = [torch.randint(0, target.config.vocab_size, (8 if args.smoke else PROMPT_TOKENS,), generator=g).tolist()]
    models = {"bf16": target}
    counts = {}
    for how in ("channel", "block128"):
        models[f"fp8 {how}"], counts[how] = fp8_twin(target, how, "auto" if not args.smoke else "triton")
        models[f"fp8 {how} reference"], _ = fp8_twin(target, how, "reference")
    if device.type == "cuda":
        torch.cuda.synchronize()
    gens = {k: Generator(m, eos_ids=(), cuda_graphs=True, sync_every=8) for k, m in models.items()}
    for gen in gens.values():
        gen.generate([prompt[0]], 8, stop_at_eos=False)  # capture and compile outside the timing
    runs = {k: [] for k in gens}
    tokens = {}
    keys = list(gens)
    for r in range(1 if args.smoke else args.rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            res = gens[k].generate([prompt[0]], new, stop_at_eos=False)
            runs[k].append(new / res.decode_seconds)
            tokens[k] = res.outputs[0]
    eager = Generator(target, eos_ids=(), cuda_graphs=False).generate([prompt[0]], new, stop_at_eos=False).outputs[0]
    best = {k: max(v) for k, v in runs.items()}
    same = {"bf16": tokens["bf16"] == eager}
    for how in ("channel", "block128"):
        same[f"fp8 {how}"] = tokens[f"fp8 {how}"] == tokens[f"fp8 {how} reference"]

    def agree(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))

    return {"model": label, "dtype": str(target.dtype).removeprefix("torch."), "prompt_tokens": len(prompt[0]),
            "new_tokens": new, "projections_quantized": counts, "tokens_per_second": best,
            "rounds_tokens_per_second": runs,
            "ratio_over_bf16": {k: v / best["bf16"] for k, v in best.items()},
            "tokens_equal_own_reference": same,
            "first_divergence": {"fp8 channel vs its reference": agree(tokens["fp8 channel"],
                                                                        tokens["fp8 channel reference"]),
                                 "fp8 block128 vs its reference": agree(tokens["fp8 block128"],
                                                                         tokens["fp8 block128 reference"]),
                                 "bf16 vs eager": agree(tokens["bf16"], eager),
                                 "fp8 channel vs bf16": agree(tokens["fp8 channel"], tokens["bf16"])}}


# -- report -----------------------------------------------------------------------------------
KERNEL_ARMS = ("fp8 channel", "fp8 block128", "w8a8 triton", "w8a8 scaled_mm", "scaled_mm only", "bf16 cublas")


def write_md(doc: dict, path: Path) -> None:
    env = doc.get("environment", {})
    where = env.get("gpu") or env.get("cpu") or "CPU"
    smoke = " --smoke (CPU, interpreter: not a timing)" if doc["smoke"] else ""
    lines = [f"# FP8 projection kernels and FP8 AR decoding ({where})", "",
             (f"{doc['date']}, commit {doc.get('commit') or env.get('git_commit')}"
              f"{' (dirty)' if env.get('git_dirty') else ''}; torch {env.get('versions', {}).get('torch')}, "
              f"triton {env.get('versions', {}).get('triton')}; written by `scripts/fp8_kernels.py`{smoke}"), ""]
    if doc.get("copy_bandwidth_GBps"):
        lines += [(f"Copy bandwidth {doc['copy_bandwidth_GBps']:.0f} GB/s (read + write). µs per call, CUDA-graph "
                   f"replay over rotating weight sets, fastest of {doc['rounds']} rotated rounds; floor = FP8 bytes "
                   "(per-channel codes + scales + x + y) / copy bandwidth; err = max |y - ref| / max |ref| against "
                   "the float32 dequantize-then-matmul (W8A8: activation quantization included)."), "",
                  "| model | proj | N | K | M | floor µs | " + " | ".join(KERNEL_ARMS)
                  + " | channel x floor | bf16 / channel | scaled_mm / channel | err channel | err block | err w8a8 |",
                  "|---|---|---|---|---|---|" + "---|" * (len(KERNEL_ARMS) + 6)]
        for r in doc["kernel_rows"]:
            us, err = r["us"], r["relative_error"]
            fl = r["floor_us"]["fp8 channel"]
            cell = lambda k, us=us: f"{us[k]:.1f}" if k in us else "-"
            ratio = lambda a, b, us=us: f"{us[a] / us[b]:.2f}" if a in us and b in us else "-"
            e = lambda k, err=err: f"{err[k]:.1e}" if k in err else "-"
            over = f"{us['fp8 channel'] / fl:.2f}" if "fp8 channel" in us else "-"
            lines.append(f"| {r['model']} | {r['projection']} | {r['N']} | {r['K']} | {r['M']} | {fl:.1f} | "
                         + " | ".join(cell(k) for k in KERNEL_ARMS)
                         + f" | {over} | {ratio('bf16 cublas', 'fp8 channel')} | "
                         f"{ratio('w8a8 scaled_mm', 'fp8 channel')} | {e('fp8 channel')} | {e('fp8 block128')} | "
                         f"{e('w8a8 triton')} |")
        skipped = sorted({f"{k}: {v}" for r in doc["kernel_rows"] for k, v in r["skipped"].items()})
        if skipped:
            lines += ["", "Not run: " + "; ".join(skipped)]
    e2e = doc.get("end_to_end")
    if e2e:
        lines += ["", (f"## AR decode at batch 1: {e2e['model']} ({e2e['dtype']}), {e2e['prompt_tokens']}-token "
                       f"prompt, {e2e['new_tokens']} new tokens"), "",
                  "| arm | tokens/s | over bf16 | greedy tokens equal its own reference |", "|---|---|---|---|"]
        for k, v in e2e["tokens_per_second"].items():
            same = e2e["tokens_equal_own_reference"].get(k, "(is a reference)")
            lines.append(f"| {k} | {v:.1f} | {e2e['ratio_over_bf16'][k]:.2f}x | {same} |")
        lines += ["", "First differing token: " + ", ".join(f"{k} {v}" for k, v in e2e["first_divergence"].items())
                  + f" (of {e2e['new_tokens']}). Issue 59's target: FP8 AR >= 1.6x BF16 AR."]
    for name, tb in doc.get("errors", {}).items():
        lines += ["", f"Section {name} failed:", "", "```", tb.strip()[-1500:], "```"]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for fp8_kernels.json and fp8_kernels.md")
    ap.add_argument("--commit", help="the commit measured (recorded; default: git's HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="rotated rounds per timing; the fastest is kept")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens per AR decode run (end to end)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["kernels", "end_to_end"], help="sections to leave out")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import Triton
        device, shapes = torch.device("cpu"), SMOKE_SHAPES
    elif not torch.cuda.is_available():
        print("error: fp8_kernels.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    else:
        device, shapes = torch.device("cuda"), SHAPES
    from specpilot.bench.provenance import capture

    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "smoke": args.smoke,
           "commit": args.commit, "rounds": 1 if args.smoke else args.rounds, "errors": {}, "kernel_rows": []}

    def save():
        (args.out / "fp8_kernels.json").write_text(json.dumps(doc, indent=1, default=str))
        write_md(doc, args.out / "fp8_kernels.md")

    try:
        doc["environment"] = capture(device, torch.bfloat16)
        env = doc["environment"]  # the printed lines carry their provenance too (a log may be all that comes back)
        print(f"# fp8_kernels.py on {env.get('gpu') or env.get('cpu') or 'CPU'}, {doc['date']}, commit "
              f"{args.commit or env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}", flush=True)
        bandwidth = copy_bandwidth(device, args.smoke)  # bytes per µs (read + write)
        doc["copy_bandwidth_GBps"] = bandwidth / 1e3
    except Exception:
        doc["errors"]["setup"] = traceback.format_exc()
        save()
        return 1
    if "kernels" not in args.skip:
        for p in shapes:
            try:
                doc["kernel_rows"] += kernel_rows(p, args, device, bandwidth)
            except Exception:
                doc["errors"][f"kernels {p.model} {p.name}"] = traceback.format_exc()
                print(doc["errors"][f"kernels {p.model} {p.name}"], file=sys.stderr)
            save()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "end_to_end" not in args.skip:
        try:
            doc["end_to_end"] = end_to_end(args, device)
            print(json.dumps({k: doc["end_to_end"][k] for k in ("tokens_per_second", "ratio_over_bf16",
                                                                 "tokens_equal_own_reference")}), flush=True)
        except Exception:
            doc["errors"]["end_to_end"] = traceback.format_exc()
            print(doc["errors"]["end_to_end"], file=sys.stderr)
        save()
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
