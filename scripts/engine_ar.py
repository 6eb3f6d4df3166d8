"""GPU benchmark of the engine on a Qwen3-8B-shaped model with random bf16 weights (issue 2).

Measures, in one run on one GPU:
- device-to-device copy bandwidth (the byte-floor denominator);
- AR decode at batch 1 with CUDA graphs: ms/token vs the byte floor (weight bytes / copy bandwidth);
- a breakdown: the projections alone (cuBLAS, M=1, all layers + lm_head, graph-replayed) vs the
  whole step, and each projection's achieved bandwidth;
- transformers `generate` (eager, greedy) on the same weights, and whether its tokens match ours;
- the verify-cost curve: one target forward over N tree nodes, N = 1..64, relative to an AR step;
- AR decode with our Triton kernels vs cuBLAS, batch 1, 8, 32, if available: BF16 weights, W12
  decoder-layer projections (the converter's default), and W12 with the lm_head as well;
- AR decode at batch 1 by attention kernel (torch's SDPA vs the split-KV kernel, `attention =
  "split_kv"`) under cuBLAS and Triton BF16 projections, at the default prompt and a long one;
- the step's configurations (`STEPS`: projections x attention x the AR step compiled whole, as
  `verify_compile` runs it x our kernels launched with programmatic dependent launch, PDL): ms/step against the all-parameter BF16 floor and against the bytes
  that configuration streams (W12's planes), tokens against cuBLAS + SDPA eager, and the step
  profiled kernel by kernel (families, device idle) as a CUDA graph replay.

Writes engine_ar.json and engine_ar.md under --out (numbers from this run only).
Usage: python scripts/engine_ar.py --out DIR [--commit HASH] [--skip SECTION ...] [--steps NAME ...]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.models.kv_cache import KVCache  # noqa: E402
from specpilot.engine.state import DecodeState  # noqa: E402
from specpilot.engine.steps import ar_step, tree_forward  # noqa: E402
from specpilot.engine.tree import DraftTree  # noqa: E402
from specpilot.kernels.timing import graph_time_us  # noqa: E402
from specpilot.models.config import ModelConfig  # noqa: E402
from specpilot.models.transformer import Transformer  # noqa: E402

QWEN3_8B = dict(
    family="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
    num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
    tie_word_embeddings=False, qk_norm=True, eos_token_ids=(),
)


def timed(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of fn() with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """TB/s of a 4 GiB device-to-device copy, counting bytes read + written."""
    n = 1 << 31
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), reps=10)
    del src, dst
    return 2 * n * 2 / (ms * 1e-3) / 1e12


def build_model(max_positions: int) -> Transformer:
    cfg = ModelConfig(**QWEN3_8B)
    torch.set_default_dtype(torch.bfloat16)  # parameters born in bf16; RoPE tables stay float32
    try:
        with torch.device("cuda"):
            model = Transformer(cfg, max_positions=max_positions)
    finally:
        torch.set_default_dtype(torch.float32)
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model.eval().requires_grad_(False)


def weight_bytes(model: Transformer) -> dict:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.embed_tokens.weight
    row = embed.shape[1] * embed.element_size()
    return {"all_parameters": total, "streamed_per_token": total - embed.numel() * embed.element_size() + row}


def ar_decode(model, prompt_len, new_tokens, batch=1, repeats=3, compiled=False, keep=False, pdl=False) -> dict:
    """AR decode with CUDA graphs: median ms/step of `repeats` runs (`compiled`: the AR step under
    torch.compile, as `verify_compile` runs it; `pdl`: the system knob); with `keep`, the generator too."""
    gen = Generator(model, eos_ids=(), cuda_graphs=True, sync_every=8, verify_compile=compiled, pdl=pdl)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    gen.generate(prompts, 8)  # capture + compile
    runs = []
    for _ in range(repeats):
        r = gen.generate(prompts, new_tokens)
        runs.append((r.seconds - r.prefill_seconds) / new_tokens * 1e3)
    runs.sort()
    out = {"batch": batch, "ms_per_step": runs[len(runs) // 2], "tokens_per_second": batch * 1e3 / runs[len(runs) // 2],
           "outputs": r.outputs}
    if keep:
        out["generator"] = gen
    return out


def projections_only(model, batch=1) -> dict:
    """Graph of every projection at M=batch (cuBLAS via the model's own modules)."""
    C = model.config.hidden_size
    xs = {}
    mods = []
    for layer in model.layers:
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            mods.append(m)
    mods.append(model.lm_head)
    for m in mods:
        k = m.weight.shape[1] if hasattr(m, "weight") else C
        xs.setdefault(k, torch.randn(batch, k, device="cuda", dtype=torch.bfloat16))

    def run():
        for m in mods:
            m(xs[m.weight.shape[1]])

    graph = torch.cuda.CUDAGraph()
    run()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        run()
    ms = timed(graph.replay)
    per = {}
    layer = model.layers[0]
    for name, m in (("qkv", layer.self_attn.qkv_proj), ("o", layer.self_attn.o_proj),
                    ("gate_up", layer.mlp.gate_up_proj), ("down", layer.mlp.down_proj), ("lm_head", model.lm_head)):
        ws = [torch.randn_like(m.weight) * 0.02 for _ in range(4)]  # rotate so L2 does not serve
        x = xs[m.weight.shape[1]]
        # one graph of the four calls back to back, as the decode step runs them: eager launches
        # would time the launch too (8B o: 27.0 µs eager in the 2c66317 run, 13.46 graph-timed in
        # bench/results/w12/w12_kernels.md, in git history)
        us = graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in ws])
        per[name] = {"shape": list(m.weight.shape), "us": us, "timing": "cuda graph",
                     "tb_per_s": m.weight.numel() * 2 / (us * 1e-6) / 1e12}
        del ws
    return {"ms": ms, "per_projection": per}


def ar_step_at(model, cache, context: int) -> float:
    """ms of one full AR step (forward, argmax, commit) at `context` cached tokens, graph-replayed."""
    state = DecodeState.allocate(1, cache.capacity, 64, "cuda")
    state.reset([[1] * (context + 1)], eos_ids=(), max_new=1 << 30)  # root at slot `context`
    fn = lambda: ar_step(model, cache, state)  # noqa: E731 (each replay advances one token: fine)
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay)


def verify_curve(model, nodes=(1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64), context=512) -> dict:
    cache = KVCache.allocate(model.config, 1, 1024, "cuda", torch.bfloat16)
    prefix = torch.tensor([context], device="cuda")
    out = {}
    ar_ms = ar_step_at(model, cache, context)
    g = torch.Generator().manual_seed(2)
    for n in nodes:
        # a best-first-shaped tree: root, then nodes hung under random earlier nodes
        parents = [-1] + [int(torch.randint(0, max(j, 1), (1,), generator=g)) for j in range(1, n)]
        tokens = torch.randint(0, model.config.vocab_size, (1, n), device="cuda")
        tree = DraftTree(tokens, torch.tensor([parents], device="cuda"), max_depth=n)
        tree.ancestors()
        fn = lambda: tree_forward(model, cache, tree, prefix)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        out[n] = timed(graph.replay)
        del graph
    return {"ms": out, "relative_to_1": {n: v / out[1] for n, v in out.items()}, "context": context,
            "ar_step_ms": ar_ms, "relative_to_ar_step": {n: v / ar_ms for n, v in out.items()}}


def transformers_generate(model, prompt, new_tokens) -> dict:
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = model.config
    cfg = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                      rope_theta=c.rope_theta, max_position_embeddings=4096, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta})
    with torch.device("meta"):
        hf = Qwen3ForCausalLM(cfg)
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=cfg, device="cuda")
    H, Hkv, D, I = c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    sd = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.lm_head.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.self_attn.qkv_proj.weight.split([H * D, Hkv * D, Hkv * D])
        gt, up = layer.mlp.gate_up_proj.weight.split([I, I])
        sd.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
                   p + "self_attn.o_proj.weight": layer.self_attn.o_proj.weight,
                   p + "self_attn.q_norm.weight": layer.self_attn.q_norm.weight,
                   p + "self_attn.k_norm.weight": layer.self_attn.k_norm.weight,
                   p + "mlp.gate_proj.weight": gt, p + "mlp.up_proj.weight": up,
                   p + "mlp.down_proj.weight": layer.mlp.down_proj.weight,
                   p + "input_layernorm.weight": layer.input_layernorm.weight,
                   p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight})
    hf.load_state_dict({k: v.contiguous() for k, v in sd.items()}, assign=True, strict=False)
    still_meta = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if still_meta:
        raise RuntimeError(f"transformers model has tensors left on meta: {still_meta[:4]}")
    hf.eval()
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():  # same weights, same input: logits agree up to bf16 kernel rounding
        ref = hf(ids).logits[0].float()
        ours = model.forward_causal(ids)[0].float()
    parity = {"max_abs_logit_diff": float((ref - ours).abs().max()), "max_abs_logit": float(ref.abs().max()),
              "argmax_agreement": float((ref.argmax(-1) == ours.argmax(-1)).float().mean()),
              "hf_rope_theta": float(getattr(hf.config, "rope_parameters", {}).get("rope_theta", float("nan")))}
    hf.generate(ids, max_new_tokens=4, do_sample=False)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    del hf
    return {"version": transformers.__version__, "tokens_per_second": new_tokens / dt,
            "tokens": out[0, len(prompt):].tolist(), "logit_parity": parity}


def kernel_variants(model, prompt_len, new_tokens, batches) -> dict:
    import copy

    from specpilot.models.linear import swap_projections

    out = {}
    variants = {}
    # w12: the decoder layers' projections (what `specpilot w12 convert` converts by default);
    # w12_lm_head: those and the lm_head (`--lm-head`), the largest matrix of the step
    for name, w12, lm_head in (("triton_bf16", False, False), ("w12", True, False), ("w12_lm_head", True, True)):
        memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
        clone = copy.deepcopy(model, memo)
        swap_projections(clone, w12=w12, lm_head=lm_head)
        variants[name] = clone
    for b in batches:
        row = {"cublas": ar_decode(model, prompt_len, new_tokens, b)}
        for name, m in variants.items():
            row[name] = ar_decode(m, prompt_len, new_tokens, b)
            row[name]["same_tokens_as_cublas"] = row[name].pop("outputs") == row["cublas"]["outputs"]
        row["cublas"].pop("outputs")
        out[b] = row
    return out


def attention_variants(model, prompt_lens, new_tokens) -> dict:
    """AR decode, batch 1, per (prompt length, projections, attention kernel); tokens compared with
    cuBLAS + SDPA at the same prompt length (the baseline of each block, run first)."""
    import copy

    from specpilot.config import AttentionKernel
    from specpilot.models.linear import swap_projections
    from specpilot.models.transformer import use_attention

    models = {}
    for proj in ("cublas", "triton_bf16"):
        for attention in AttentionKernel:
            memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
            clone = copy.deepcopy(model, memo)
            if proj == "triton_bf16":
                swap_projections(clone)
            use_attention(clone, attention)
            models[f"{proj}+{attention.value}"] = clone
    out = {}
    for n in prompt_lens:
        row = {}
        for name, m in models.items():
            row[name] = ar_decode(m, n, new_tokens)
            row[name]["same_tokens_as_baseline"] = row[name]["outputs"] == row["cublas+sdpa"]["outputs"]
        for r in row.values():
            r.pop("outputs")
        out[n] = row
    return out


# (projections, attention, AR step compiled, our kernels launched with PDL): the step configurations
# the `steps` section runs, the first one the baseline of the token comparison
STEPS = (("cublas", "sdpa", False, False), ("cublas", "sdpa", True, False), ("cublas", "split_kv", True, False),
         ("cublas", "split_kv", True, True), ("triton_bf16", "split_kv", False, False),
         ("triton_bf16", "split_kv", True, False), ("triton_bf16", "split_kv", True, True),
         ("w12", "split_kv", True, False), ("w12", "split_kv", True, True))


def step_name(proj: str, attention: str, compiled: bool, pdl: bool) -> str:
    return f"{proj}+{attention}" + ("+compiled" if compiled else "") + ("+pdl" if pdl else "")


def step_variants(model, prompt_len, new_tokens, bandwidth, reps=20, done=None, only=()) -> dict:
    """AR decode at batch 1 per `STEPS` configuration, each against its streamed bytes, and its
    step (the generator's own: forward, argmax, commit) profiled on the state the run left;
    `done(rows so far)` after each configuration (a run cut short keeps what it finished)."""
    import copy

    from specpilot.bench.kernel_profile import piece
    from specpilot.config import AttentionKernel
    from specpilot.engine.profile import streamed_bytes
    from specpilot.models.linear import swap_projections
    from specpilot.models.transformer import use_attention

    out = {}
    clones = {}  # projections -> the model with them (weights shared; W12 encoded once)
    for proj, attention, compiled, pdl in STEPS:
        name = step_name(proj, attention, compiled, pdl)
        if only and name not in only:
            continue
        if proj not in clones:
            memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
            clones[proj] = copy.deepcopy(model, memo)
            if proj != "cublas":
                swap_projections(clones[proj], w12=proj == "w12")
        clone = clones[proj]
        use_attention(clone, AttentionKernel(attention))
        t = time.perf_counter()
        row = ar_decode(clone, prompt_len, new_tokens, compiled=compiled, keep=True, pdl=pdl)
        row["setup_s"] = time.perf_counter() - t
        gen = row.pop("generator")
        row["streamed_bytes"] = streamed_bytes(clone)
        row["own_floor_ms"] = row["streamed_bytes"] / (bandwidth * 1e12) * 1e3
        ws = next(reversed(gen.workspaces.values()))  # its rows are done: a step rewrites the same slot
        with torch.inference_mode():
            row["step"] = piece(lambda: gen.rounds.step(ws, 0), reps)  # the generator's own step (compiled or not)
        row["same_tokens_as_baseline"] = row["outputs"] == next(iter(out.values()), row)["outputs"]
        out[name] = row
        del gen
        torch.cuda.empty_cache()
        if done is not None:
            done({k: {f: v for f, v in r.items() if f != "outputs"} for k, r in out.items()})
    for row in out.values():
        row.pop("outputs")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--hf-tokens", type=int, default=32)
    ap.add_argument("--skip", nargs="*", default=[], help="sections to skip: hf, curve, kernels, attention, steps")
    ap.add_argument("--long-prompt", type=int, default=1536, help="the attention section's long prompt")
    ap.add_argument("--steps", nargs="*", default=[], choices=[step_name(*s) for s in STEPS],
                    help="the steps section's configurations to run (default: all; the first one run is the "
                         "baseline of the token comparison)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": a.commit,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "model": "Qwen3-8B shapes, random bf16 weights (normal std 0.02)", "errors": {}}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass

    def save():
        (a.out / "engine_ar.json").write_text(json.dumps(res, indent=1, default=str))

    def section(name, fn):
        t = time.perf_counter()
        try:
            res[name] = fn()
        except Exception:  # a failed section must not lose the others
            res["errors"][name] = traceback.format_exc()
            print(f"[{name}] FAILED\n{res['errors'][name]}", flush=True)
        print(f"[{name}] {time.perf_counter() - t:.1f}s", flush=True)
        save()

    section("copy_tb_per_s", copy_bandwidth)
    model = build_model(max_positions=4096)
    res["weight_bytes"] = weight_bytes(model)
    bw = res.get("copy_tb_per_s") or 4.23
    res["floor_ms"] = {k: v / (bw * 1e12) * 1e3 for k, v in res["weight_bytes"].items()}
    section("ar", lambda: ar_decode(model, a.prompt_len, a.new_tokens))
    ours = res.get("ar", {}).pop("outputs", [[]])[0]
    section("projections_only", lambda: projections_only(model))
    if "curve" not in a.skip:
        section("verify_curve", lambda: verify_curve(model))
    if "hf" not in a.skip:
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, model.config.vocab_size, (a.prompt_len,), generator=g).tolist()

        def hf():
            r = transformers_generate(model, prompt, a.hf_tokens)
            toks = r.pop("tokens")
            r["tokens_equal_ours"] = sum(x == y for x, y in zip(toks, ours[: len(toks)]))
            r["tokens_compared"] = len(toks)
            return r

        section("transformers", hf)
    if "kernels" not in a.skip:
        section("kernels", lambda: kernel_variants(model, a.prompt_len, a.new_tokens, (1, 8, 32)))
    if "attention" not in a.skip:
        section("attention", lambda: attention_variants(model, (a.prompt_len, a.long_prompt), a.new_tokens))
    if "steps" not in a.skip:
        def keep_steps(rows):
            res["steps"] = rows
            save()

        section("steps", lambda: step_variants(model, a.prompt_len, a.new_tokens, bw, done=keep_steps, only=a.steps))
    (a.out / "engine_ar.md").write_text(render(res))
    print(render(res))


def render(res: dict) -> str:
    L = [f"# Engine benchmark — {res['model']}", "",
         f"{res['date']} · {res['gpu']} · torch {res['torch']} · triton {res.get('triton', '-')} · commit {res['commit']}", ""]
    bw = res.get("copy_tb_per_s")
    if bw:
        L.append(f"Device-to-device copy: **{bw:.2f} TB/s** (read + write).")
    fl = res.get("floor_ms", {})
    ar = res.get("ar")
    if ar and fl:
        L += ["", "| AR decode, batch 1, CUDA graphs | ms/token | tok/s | % of floor (all params) | % of floor (streamed bytes) |",
              "|---|---|---|---|---|",
              f"| ours (cuBLAS projections) | {ar['ms_per_step']:.3f} | {ar['tokens_per_second']:.1f} | "
              f"{100 * fl['all_parameters'] / ar['ms_per_step']:.1f}% | {100 * fl['streamed_per_token'] / ar['ms_per_step']:.1f}% |"]
        L.append(f"\nByte floor: {fl['all_parameters']:.3f} ms (all {res['weight_bytes']['all_parameters'] / 1e9:.2f} GB of "
                 f"parameters), {fl['streamed_per_token']:.3f} ms (bytes a token must stream: embedding table excluded).")
    hf = res.get("transformers")
    if hf and ar:
        lp = hf.get("logit_parity", {})
        L.append(f"\ntransformers {hf['version']} `generate` (eager, greedy): {hf['tokens_per_second']:.1f} tok/s → "
                 f"ours is {ar['tokens_per_second'] / hf['tokens_per_second']:.1f}× faster; "
                 f"{hf['tokens_equal_ours']}/{hf['tokens_compared']} greedy tokens equal ours. Same weights, one "
                 f"forward over the prompt: max |logit difference| {lp.get('max_abs_logit_diff', float('nan')):.4f} "
                 f"(max |logit| {lp.get('max_abs_logit', float('nan')):.2f}), argmax agreement "
                 f"{100 * lp.get('argmax_agreement', float('nan')):.1f}% of positions.")
    po = res.get("projections_only")
    if po and ar:
        L += ["", f"Breakdown: projections alone (cuBLAS, graph) {po['ms']:.3f} ms of the {ar['ms_per_step']:.3f} ms step; "
              f"the other {ar['ms_per_step'] - po['ms']:.3f} ms is attention, norms, RoPE, residuals, argmax and launch gaps.",
              "", "| projection (cuBLAS, one layer's, CUDA graph, 4 rotating weights) | [N, K] | µs | TB/s |",
              "|---|---|---|---|"]
        for k, v in po["per_projection"].items():
            L.append(f"| {k} | {v['shape']} | {v['us']:.1f} | {v['tb_per_s']:.2f} |")
    vc = res.get("verify_curve")
    if vc:
        L += ["", f"Verify-cost curve: one target forward over N tree nodes at context {vc['context']} (cache of 1024 "
              f"slots), graph-replayed, against a full AR step (forward + argmax + commit) at the same context and "
              f"cache: {vc['ar_step_ms']:.3f} ms.", "",
              "| N | ms | × AR step, same context | × forward of 1 node |", "|---|---|---|---|"]
        for n, ms in vc["ms"].items():
            L.append(f"| {n} | {ms:.3f} | {vc['relative_to_ar_step'][n]:.3f} | {vc['relative_to_1'][n]:.3f} |")
    kv = res.get("kernels")
    if kv:
        L += ["", "AR decode ms/step by projection kernel (W12: the decoder layers' projections; W12 + lm_head: "
              "those and the lm_head):", "",
              "| batch | cuBLAS | Triton BF16 | W12 | W12 speedup vs cuBLAS | W12 + lm_head | its speedup | "
              "same tokens as cuBLAS (bf16 / w12 / w12 + lm_head) |", "|---|---|---|---|---|---|---|---|"]
        for b, row in kv.items():
            cu = row["cublas"]["ms_per_step"]
            cells = []
            for name in ("w12", "w12_lm_head"):  # runs before w12_lm_head existed have only "w12"
                ms = row.get(name, {}).get("ms_per_step")
                cells += [f"{ms:.3f}", f"{cu / ms:.3f}×"] if ms else ["-", "-"]
            same = " / ".join(str(row.get(n, {}).get("same_tokens_as_cublas", "-")) for n in ("triton_bf16", "w12", "w12_lm_head"))
            L.append(f"| {b} | {cu:.3f} | {row['triton_bf16']['ms_per_step']:.3f} | {cells[0]} | {cells[1]} | "
                     f"{cells[2]} | {cells[3]} | {same} |")
    att = res.get("attention")
    if att and fl:
        names = list(next(iter(att.values())))
        L += ["", "AR decode ms/step at batch 1 by projections + attention kernel (sdpa: torch's; split_kv: "
              "`specpilot.kernels.attention`), % of the all-parameter byte floor in brackets; last column: tokens "
              "equal to cuBLAS + SDPA's at that prompt:", "",
              "| prompt tokens | " + " | ".join(names) + " | same tokens |", "|---|" + "---|" * (len(names) + 1)]
        for n, row in att.items():
            cells = [f"{row[k]['ms_per_step']:.3f} ({100 * fl['all_parameters'] / row[k]['ms_per_step']:.1f}%)"
                     for k in names]
            same = " / ".join(str(row[k]["same_tokens_as_baseline"]) for k in names[1:])
            L.append(f"| {n} | " + " | ".join(cells) + f" | {same} |")
    steps = res.get("steps")
    if steps and fl:
        from specpilot.bench.kernel_profile import FAMILIES, seen

        fams = [f for f, _ in FAMILIES] + ["other"]
        L += ["", "AR decode at batch 1 by step configuration (projections + attention, `compiled`: the AR step under "
              "torch.compile as `verify_compile` runs it, `pdl`: the Triton kernels launched with programmatic "
              "dependent launch, the `pdl` knob). % of the all-parameter BF16 byte floor, and of the bytes "
              "this configuration streams per token (W12: its packed planes). Step: the generator's own step "
              "(forward, argmax, commit) replayed as a CUDA graph on the state the run left, profiled, µs per call "
              "(kernels):", "",
              "| configuration | ms/step | % of BF16 floor | % of own floor | same tokens | step µs | kernels | idle µs | "
              + " | ".join(f"{f} µs (n)" for f in fams) + " |", "|---|---|---|---|---|---|---|---|" + "---|" * len(fams)]
        for name, row in steps.items():
            f = row["step"]
            k = seen(f)
            cells = " | ".join(f"{k['families'][x]['us']:.0f} ({k['families'][x]['kernels']:.0f})"
                               if x in k["families"] else "-" for x in fams)
            ms = row["ms_per_step"]
            L.append(f"| {name} | {ms:.3f} | {100 * fl['all_parameters'] / ms:.1f}% | {100 * row['own_floor_ms'] / ms:.1f}% "
                     f"| {row['same_tokens_as_baseline']} | {f['graph_wall_us']:.0f} | {k['kernels_per_call']:.0f} | "
                     f"{f['idle_us']:.0f} | {cells} |")
    if res.get("errors"):
        L += ["", "Sections that failed: " + ", ".join(res["errors"])]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
