"""GPU checks of the Gemma and mixture-of-experts decoders at memory-bound sizes, in one call.

    python scripts/families_checks.py --out DIR [--commit HASH] [--smoke]

No trained Gemma or MoE fixture ships yet, so these run random-weight decoders (norms near 1,
projections ~1/sqrt(fan-in), BF16, on the GPU) whose byte counts are a deployment's:
- `moe`: a Qwen3-MoE-like decoder (hidden 2048, 12 layers, 64 experts of 768, top-8, 4 dense
  layers' worth of attention, vocabulary 8192; ~3.7B parameters, ~0.7B touched per token).
- `gemma`: a Gemma-3-like decoder (hidden 3072, 12 layers, 5 sliding (window 512) : 1 global,
  MLP 12288, vocabulary 8192; ~1.9B parameters), at a context past its window, so its sliding
  layers read their ring (`models.ring_cache`).
For each: AR decode at batch 1 (4 prompts of 900 random tokens, 256 new tokens, CUDA graphs) by
`engine.profile.profile`, and by step configuration (`--steps`, `hybrid_checks.STEPS`: the same
System knobs over plain AR, e.g. Triton projections + split-KV attention + compiled + PDL with a
host sync every 4 steps; tokens compared with the first configuration's), against the cost model's AR floor (`CostTable.verify_floor_ms(1)`: the
weight bytes a token reads -- an MoE layer's k routed experts, not all E -- plus the KV cache,
over the measured copy bandwidth); and the verify curve (a target forward over N chain nodes,
N = 1..128) measured beside the cost model's floor at each N. For the MoE decoder the floor uses
the union of experts N tokens route to, measured from its routers on its own decoded text
(`engine.experts`), printed beside the uniform-routing expectation. Random routers route close to
uniformly: a trained model's routing is more skewed and its union smaller.

Writes OUT/families_checks.json and OUT/families_checks.md. `--smoke`: tiny sizes on any device.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from hybrid_checks import STEPS  # noqa: E402  (the AR step configurations, shared with the hybrid checks)

from specpilot.config import System  # noqa: E402
from specpilot.engine.experts import expected_experts_read  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.engine.profile import profile  # noqa: E402
from specpilot.engine.session import system_generator, system_target  # noqa: E402
from specpilot.kernels import launch  # noqa: E402
from specpilot.loop.cost_model import analyze  # noqa: E402
from specpilot.models.config import ModelConfig  # noqa: E402
from specpilot.models.registry import family  # noqa: E402

S, F = "sliding_attention", "full_attention"
CONFIGS = {
    "moe": dict(family="qwen3_moe", vocab_size=8192, hidden_size=2048, intermediate_size=6144, num_layers=12,
                num_heads=16, num_kv_heads=4, head_dim=128, qk_norm=True, num_experts=64, num_experts_per_tok=8,
                moe_intermediate_size=768, norm_topk_prob=True, max_position_embeddings=4096, eos_token_ids=(0,)),
    "gemma": dict(family="gemma3", vocab_size=8192, hidden_size=3072, intermediate_size=12288, num_layers=12,
                  num_heads=16, num_kv_heads=8, head_dim=256, qk_norm=True, layer_types=(S, S, S, S, S, F) * 2,
                  sliding_window=512, sliding_rope_theta=1e4, rope_theta=1e6, query_pre_attn_scalar=256.0,
                  zero_centered_norms=True, tie_word_embeddings=True, max_position_embeddings=4096,
                  eos_token_ids=(0,)),
}
SMOKE = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
             vocab_size=512)
CURVE = (1, 2, 4, 8, 16, 32, 64, 128)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--commit", default="", help="the source commit, for the record")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, any device (checks the code paths)")
    p.add_argument("--only", nargs="*", choices=list(CONFIGS), default=list(CONFIGS), help="which decoders")
    p.add_argument("--steps", nargs="*", choices=list(STEPS), default=["cublas+sdpa", "triton_bf16+split_kv+compiled+pdl+sync4"],
                   help="AR step configurations timed beside the profile (none: skip)")
    p.add_argument("--kernels", action="store_true", help="also the top CUDA kernels of 16 eager AR steps "
                   "(torch.profiler): where a step's time goes")
    return p.parse_args(argv)


def random_decoder(config: ModelConfig, device, dtype, seed: int = 0):
    """The family's decoder with random weights made on `device`."""
    with torch.device("meta"):
        model = family(config).model(config, max_positions=config.max_position_embeddings)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((0.1 if config.zero_centered_norms else 1.0) + 0.05 * torch.randn(p.shape, generator=g,
                                                                                             device=device))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g, device=device))
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device) / p.shape[-1] ** 0.5)
        own = getattr(model, "rope_buffers", None)
        if own is not None:
            for name, table in own(config.max_position_embeddings).items():
                setattr(model, name, table.to(device))
        else:
            from specpilot.models.loading import rope_tables

            model.rope_cos, model.rope_sin = (t.to(device) for t in rope_tables(config, config.max_position_embeddings))
    return model.to(dtype).eval().requires_grad_(False)


def top_kernels(model, prompt: list[int], steps: int = 16, top: int = 15) -> list[dict]:
    """The CUDA kernels of `steps` eager AR steps (prefill included) by total device time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    gen = Generator(model, cuda_graphs=False)
    gen.generate([prompt], 4)  # warm
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        gen.generate([prompt], steps)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -e.self_device_time_total)
    return [{"name": e.key[:90], "calls": e.count, "total_us": e.self_device_time_total,
             "us_per_call": e.self_device_time_total / max(1, e.count)} for e in rows[:top]]


def ar_steps(model, prompt: list[int], tokens: int, floor_ms: float, steps: list[str]) -> dict:
    """AR decode of `prompt` by step configuration (EOS ignored; a warm-up run first): ms per step,
    the fraction of `floor_ms`, and whether its tokens equal the first configuration's. A
    configuration's failure is recorded, not raised."""
    out, first = {}, None
    for name in steps:
        system = System().plain_ar().with_knobs(STEPS[name], name)
        try:
            with launch.knob_scope(system.pdl):
                gen = system_generator(system_target(model, system), system)
            gen.generate([prompt], 16, stop_at_eos=False)  # capture and compile before timing
            result = gen.generate([prompt], tokens, stop_at_eos=False)
            ms = result.decode_seconds / tokens * 1e3
            first = result.outputs if first is None else first
            out[name] = {"ms_per_step": ms, "fraction_of_floor": floor_ms / ms, "same_tokens_as_first": result.outputs == first}
        except Exception:
            out[name] = {"error": traceback.format_exc(limit=4)}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def check(name: str, smoke: bool, device, kernels: bool = False, steps: tuple[str, ...] = ()) -> dict:
    fields = {**CONFIGS[name], **(SMOKE if smoke else {})}
    if smoke and name == "moe":
        fields.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    if smoke and name == "gemma":
        fields.update(sliding_window=16, layer_types=(S, F))
    config = ModelConfig(**fields)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = random_decoder(config, device, dtype)
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(1)
    plen, new = (40, 24) if smoke else (900, 256)
    prompts = [torch.randint(1, config.vocab_size, (plen,), generator=g).tolist() for _ in range(4)]
    gen = Generator(model, cuda_graphs=device.type == "cuda")
    curve = CURVE[:4] if smoke else CURVE
    p = profile(gen, prompts[:1], new, curve_nodes=curve)  # batch 1
    table = analyze(p, None, "ar")
    out = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()},
           "params": config.num_params, "load_s": load_s, "bandwidth_gb_s": p.bandwidth_gbps,
           "context": p.context, "ar_ms_per_token": p.ms_per_token, "ar_floor_ms": table.verify_floor_ms(1),
           "target_bytes": p.target_bytes, "weight_bytes_at_1": p.weight_bytes(1)}
    out["ar_fraction_of_floor"] = out["ar_floor_ms"] / out["ar_ms_per_token"]
    out["curve"] = [{"nodes": n, "measured_ms": p.verify_curve_ms[n], "floor_ms": table.verify_floor_ms(n),
                     "experts_read": p.experts_read(n) if p.num_experts else None,
                     "uniform_experts": expected_experts_read(p.num_experts, p.experts_per_token, n)
                     if p.num_experts else None}
                    for n in curve if n in p.verify_curve_ms]
    if steps:
        out["steps"] = ar_steps(model, prompts[0], new, out["ar_floor_ms"], list(steps))
    if kernels and device.type == "cuda":
        out["kernels"] = top_kernels(model, prompts[1])
    if hasattr(gen.workspaces, "values"):
        ws = next(reversed(gen.workspaces.values()))
        out["cache_bytes"] = ws.cache.nbytes()
        out["ring"] = getattr(ws.cache, "ring", None) is not None
    return out


def render(data: dict) -> str:
    lines = [f"# Gemma and MoE decoders on {data['device']} (random weights, BF16)", "",
             f"{data['date']}, commit {data['commit']}; torch {data['torch']}; written by `scripts/families_checks.py`",
             ""]
    for name, r in data["checks"].items():
        if "error" in r:
            lines += [f"## {name}: error", "```", r["error"][-2000:], "```", ""]
            continue
        lines += [f"## {name}: {r['params'] / 1e9:.2f}B parameters, {r['weight_bytes_at_1'] / 1e9:.2f} GB read per "
                  f"token (of {r['target_bytes'] / 1e9:.2f} GB), mean context {r['context']:.0f}"
                  + (", sliding layers on a ring" if r.get("ring") else ""), "",
                  f"AR at batch 1: {r['ar_ms_per_token']:.3f} ms/token against a floor of {r['ar_floor_ms']:.3f} ms: "
                  f"**{r['ar_fraction_of_floor']:.1%} of the byte floor** (copy bandwidth {r['bandwidth_gb_s']:.0f} GB/s).",
                  "", "| nodes | measured ms | cost-model floor ms | measured / floor | experts read (measured) | "
                  "uniform routing |", "|---|---|---|---|---|---|"]
        if r.get("steps"):
            lines[-2:-2] = ["AR at batch 1 by step configuration (System knobs over plain AR, the same new tokens, EOS ignored):", "",
                            "| step | ms/step | % of floor | same tokens |", "|---|---|---|---|",
                            *(f"| {k} | error |  |  |" if "error" in v else f"| {k} | {v['ms_per_step']:.3f} | "
                              f"{v['fraction_of_floor']:.1%} | {v['same_tokens_as_first']} |" for k, v in r["steps"].items()), ""]
        for c in r["curve"]:
            ex = "" if c["experts_read"] is None else f"{c['experts_read']:.1f}"
            un = "" if c["uniform_experts"] is None else f"{c['uniform_experts']:.1f}"
            lines.append(f"| {c['nodes']} | {c['measured_ms']:.3f} | {c['floor_ms']:.3f} | "
                         f"{c['measured_ms'] / c['floor_ms']:.2f} | {ex} | {un} |")
        if r.get("kernels"):
            lines += ["", "Top CUDA kernels of 16 eager AR steps after a 900-token prefill (torch.profiler):", "",
                      "| kernel | calls | total us | us per call |", "|---|---|---|---|"]
            lines += [f"| `{k['name']}` | {k['calls']} | {k['total_us']:.0f} | {k['us_per_call']:.1f} |"
                      for k in r["kernels"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
            "commit": args.commit, "torch": torch.__version__, "smoke": args.smoke,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "checks": {}}
    for name in args.only:
        t0 = time.perf_counter()
        try:
            data["checks"][name] = check(name, args.smoke, device, args.kernels, tuple(args.steps))
        except Exception:  # one decoder's failure costs only its part
            data["checks"][name] = {"error": traceback.format_exc()}
        data["checks"][name]["seconds"] = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.empty_cache()
        (out / "families_checks.json").write_text(json.dumps(data, indent=1))
        (out / "families_checks.md").write_text(render(data))
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
