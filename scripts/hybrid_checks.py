"""GPU checks of hybrid Gated DeltaNet targets, in one call on one GPU (about 4-6 minutes).

    python scripts/hybrid_checks.py --out DIR [--commit HASH] [--skip SECTION ...] [--deployment NAME]

Sections (each in try/except: a failure costs only that part), on `fixture-hybrid-x16` in bf16:
- `bandwidth`: device-to-device copy TB/s, counting bytes read + written (the floors' denominator).
- `ar`: AR decode at batch 1 (2 prompts x 256 new tokens, EOS ignored, CUDA graphs, decode time by
  CUDA events) by step configuration (`STEPS`: cuBLAS + SDPA; + the step compiled whole; Triton BF16
  projections + split-KV attention + compiled + PDL; that with the host checking for EOS every 4 steps), each against its byte floor: the weight bytes
  one step streams, the KV cache it reads at the mean context, and the recurrent state and conv
  window of every GDN layer read and written, over the copy bandwidth.
- `ulp`: BF16 tree verification against the exact path computation. A random best-first-like tree of
  N nodes over a real prompt's prefix goes through the target's verify forward; for every GDN layer
  the recurrence's inputs (conv output, a, b, the committed state) are recorded and the layer's
  recurrence is run twice more: in tree mode, and in chain mode over each node's root path (the
  sequential decode of that path). Reported per N: max and share of BF16 ulps between the two
  outputs, and whether the float32 node states are bit-equal. End to end: each node's argmax from the
  tree forward against a one-token-at-a-time decode of its root path.
- `kernels`: `scripts/gdn_kernels.py`'s timing of the GDN kernels against their byte floor and the
  PyTorch reference (its own JSON, copied beside this one).

Writes OUT/hybrid_checks.json and OUT/hybrid_checks.md (tables rendered from the JSON).
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
sys.path.insert(0, str(REPO))

STEPS = {  # name -> System knobs over plain AR
    "cublas+sdpa": {},
    "cublas+sdpa+compiled": {"verify_compile": True},
    "triton_bf16+split_kv+compiled+pdl": {"kernel": "triton", "attention": "split_kv", "verify_compile": True,
                                          "pdl": True},
    # the same, the host checking for EOS every 4 steps: the next steps' graphs are queued before it waits
    "triton_bf16+split_kv+compiled+pdl+sync4": {"kernel": "triton", "attention": "split_kv", "verify_compile": True,
                                                "pdl": True, "sync_every": 4},
}
SECTIONS = ("bandwidth", "ar", "ulp", "kernels")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--commit", default="", help="the source commit, for the record")
    p.add_argument("--deployment", default="fixture-hybrid-x16", help="deployment (default fixture-hybrid-x16)")
    p.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, help="sections to leave out")
    p.add_argument("--tokens", type=int, default=256, help="new tokens per AR prompt (default 256)")
    p.add_argument("--profile", action="store_true", help="profile each AR step kernel by kernel")
    p.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS), help="AR step configurations")
    p.add_argument("--nodes", type=int, nargs="+", default=[16, 32, 64], help="tree sizes of the ulp check")
    return p.parse_args(argv)


def copy_bandwidth() -> float:
    """TB/s of a 1 GiB device-to-device copy, counting bytes read + written (`kernels.timing`)."""
    from specpilot.kernels.timing import copy_bandwidth as bytes_per_us

    return bytes_per_us(torch.device("cuda"), smoke=False) / 1e6


def step_bytes(target, context: float) -> dict:
    """Bytes one AR step must move: weights streamed, KV read, recurrent states read and written."""
    from specpilot.engine.profile import kv_bytes_per_token, state_bytes, streamed_bytes

    per_row, per_node = state_bytes(target)
    return {"weights": streamed_bytes(target), "kv": kv_bytes_per_token(target) * context,
            "states": per_row + per_node}


def step_profile(gen) -> dict:
    """The generator's own AR step (forward, argmax, commit) replayed as a CUDA graph on the state the
    run left, kernel by kernel (`bench.kernel_profile.piece`); an error is recorded, not raised."""
    from specpilot.bench.kernel_profile import piece

    try:
        ws = next(reversed(gen.workspaces.values()))  # its rows are done: a step rewrites the same slot
        with torch.inference_mode():
            return piece(lambda: gen.rounds.step(ws, 0), 20)
    except Exception:
        return {"error": traceback.format_exc(limit=4)}


def ar_section(session, prompts: list[list[int]], tokens: int, bandwidth: float, profile: bool = False,
               steps=tuple(STEPS)) -> dict:
    from specpilot.config import System

    out, outputs = {}, {}
    base = System().plain_ar()
    for name, knobs in STEPS.items():
        if name not in steps:
            continue
        system = base.with_knobs(knobs, name)
        try:
            gen = session.generator(system)
            gen.generate(prompts, 16, stop_at_eos=False)  # capture and compile before timing
            result = gen.generate(prompts, tokens, stop_at_eos=False)
            ms = result.decode_seconds / tokens * 1e3  # the batch's rows step together
            context = sum(len(p) for p in prompts) + tokens / 2 * len(prompts)
            parts = step_bytes(gen.target, context)
            floor_ms = sum(parts.values()) / (bandwidth * 1e12) * 1e3
            out[name] = {"ms_per_step": ms, "floor_ms": floor_ms, "fraction_of_floor": floor_ms / ms,
                         "bytes": parts, "batch": len(prompts)}
            outputs[name] = result.outputs
            if profile:
                out[name]["step"] = step_profile(gen)
        except Exception:
            out[name] = {"error": traceback.format_exc(limit=4)}
        session.forget(system.fingerprint())
        torch.cuda.empty_cache()
    first = next(iter(outputs.values()), None)
    for name, o in outputs.items():
        out[name]["same_tokens_as_first"] = o == first
    return out


def random_tree(N: int, depth: int, seed: int, device, vocab: int) -> "DraftTree":
    """A best-first-like tree: each new node hangs under a recent node (deep paths, some branching)."""
    from specpilot.engine.tree import DraftTree

    g = torch.Generator().manual_seed(seed)
    parents = [-1]
    depths = [0]
    for j in range(1, N):
        open_ = [i for i in range(j) if depths[i] < depth]
        recent = [i for i in open_ if i >= j - 4] or open_  # mostly under a recent node: deep paths
        p = recent[int(torch.randint(0, len(recent), (1,), generator=g))]
        parents.append(p)
        depths.append(depths[p] + 1)
    tokens = torch.randint(1, vocab, (1, N), generator=g)
    return DraftTree(tokens.to(device), torch.tensor([parents], device=device), max_depth=max(depths))


def root_path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in BF16 units in the last place between bf16 tensors (ordered bit patterns)."""
    def ordered(x):
        i = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i >= 0, i, -32768 - i)

    return (ordered(a) - ordered(b)).abs()


def ulp_section(session, prompt: list[int], nodes: list[int]) -> dict:
    """See the module docstring. Each GDN layer's call in the tree forward is recorded (a pre-hook:
    its input, positions, cache and recurrence); its conv input and gates are recomputed once from
    that input, then the conv and recurrence (`kernels.gdn`: the Triton kernels on the GPU) run in
    tree mode over all nodes and in chain mode over each node's root path, from the same committed
    state and window."""
    from specpilot.engine.steps import chunk_forward, prefill, tree_forward
    from specpilot.kernels import gdn as kernels
    from specpilot.models.gdn import GatedDeltaNet

    target = session.target
    dev = target.device
    out = {}
    layers = [m for m in target.modules() if isinstance(m, GatedDeltaNet)]
    for N in nodes:
        tree = random_tree(N, depth=8, seed=N, device=dev, vocab=target.config.vocab_size)
        tree.tokens[0, 0] = prompt[-1]
        cache = target.new_cache(1, len(prompt) + N + 64, nodes=N)
        prefill(target, cache, [prompt])
        prefix = torch.tensor([len(prompt) - 1], device=dev)
        calls = []
        hooks = [m.register_forward_pre_hook(lambda m, args: calls.append((m, args))) for m in layers]
        try:
            with torch.inference_mode():
                logits = tree_forward(target, cache, tree, prefix)
        finally:
            for h in hooks:
                h.remove()
        parents = tree.parents[0].tolist()
        worst, exact, total, states_equal, conv_equal = 0, 0, 0, True, True
        with torch.inference_mode():
            for layer, (x, positions, lcache, rec, *_) in calls:
                c = layer.config
                j, Hk, Hv = layer.index, c.linear_num_key_heads, c.linear_num_value_heads
                xin, _, b, a = layer.in_proj(x).split([c.conv_dim, c.linear_value_dim, Hv, Hv], dim=-1)
                window, state = lcache.window[j], lcache.state[j]
                fresh = positions[:, 0] == 0
                y = kernels.gdn_conv(xin, window, positions, layer.conv_weight, rec.parents, rec.depths)
                node_state = torch.zeros(1, N, *state.shape[1:], device=dev)
                o = kernels.gdn_recurrence(y, a, b, layer.A_log, layer.dt_bias, state.clone(), fresh, Hk,
                                           parents=rec.parents, node_state=node_state)
                for n in range(N):
                    path = root_path(parents, n)
                    sel = lambda t: t[:, path]  # noqa: E731
                    y_path = kernels.gdn_conv(sel(xin), window, sel(positions), layer.conv_weight)
                    conv_equal &= bool(torch.equal(y_path[:, -1], y[:, n]))
                    S = state.clone()
                    o_path = kernels.gdn_recurrence(y_path, sel(a), sel(b), layer.A_log, layer.dt_bias, S, fresh, Hk,
                                                    commit=torch.tensor([len(path) - 1], device=dev))
                    d = ulps(o[0, n].to(torch.bfloat16), o_path[0, -1].to(torch.bfloat16))
                    worst = max(worst, int(d.max()))
                    exact += int((d == 0).sum())
                    total += d.numel()
                    states_equal &= bool(torch.equal(node_state[0, n], S[0]))
        # end to end: the tree's argmax at each node against a chunk forward over its root path
        agree = 0
        with torch.inference_mode():
            for n in range(N):
                toks = prompt[:-1] + tree.tokens[0, root_path(parents, n)].tolist()
                c2 = target.new_cache(1, len(toks) + 64)
                ref = chunk_forward(target, c2, torch.tensor([toks], device=dev), torch.zeros(1, dtype=torch.long,
                                                                                             device=dev))
                agree += int(ref[0, -1].argmax() == logits[0, n].argmax())
        out[N] = {"gdn_layers": len(calls), "max_ulps": worst, "exact_share": exact / max(total, 1),
                  "states_bit_equal": states_equal, "conv_bit_equal": conv_equal, "argmax_agree_share": agree / N}
    return out


def profile_lines(ar: dict) -> list[str]:
    """The profiled steps: wall, kernels, idle and families, then each step's top kernels."""
    from specpilot.bench.kernel_profile import seen

    rows = {n: r["step"] for n, r in ar.items() if isinstance(r.get("step"), dict) and "error" not in r["step"]}
    if not rows:
        return []
    lines = ["Each step (forward, argmax, commit) replayed as a CUDA graph, profiled; µs per step:", "",
             "| step | graph µs | kernels | kernel µs | idle µs | families µs (n) |", "|---|---|---|---|---|---|"]
    for name, p in rows.items():
        k = seen(p)
        fams = ", ".join(f"{f} {v['us']:.0f} ({v['kernels']:.0f})" for f, v in k["families"].items())
        lines.append(f"| {name} | {p['graph_wall_us']:.0f} | {k['kernels_per_call']:.0f} | {k['kernel_us_per_call']:.0f} | "
                     f"{p['idle_us']:.0f} | {fams} |")
    lines.append("")
    for name, p in rows.items():
        lines += [f"Top kernels of `{name}`:", "", "| kernel | family | n | µs |", "|---|---|---|---|"]
        lines += [f"| `{t['name'][:90]}` | {t['family']} | {t['kernels']:.0f} | {t['us']:.1f} |" for t in seen(p)["top"]]
        lines.append("")
    return lines


def render(data: dict) -> str:
    lines = [f"# Hybrid GDN checks on {data['device']}", "",
             f"{data['deployment']}; commit {data['commit'] or 'n/a'}; torch {data['torch']}; "
             f"copy bandwidth {data.get('bandwidth_tb_s', float('nan')):.2f} TB/s", ""]
    ar = data.get("ar", {})
    if ar:
        lines += ["## AR decode, batch 1, against the byte floor", "",
                  "| step | ms/step | floor ms | % of floor | same tokens |", "|---|---|---|---|---|"]
        for name, r in ar.items():
            if "error" in r:
                lines.append(f"| {name} | error | | | |")
                continue
            lines.append(f"| {name} | {r['ms_per_step']:.3f} | {r['floor_ms']:.3f} | "
                         f"{100 * r['fraction_of_floor']:.1f}% | {r.get('same_tokens_as_first')} |")
        lines.append("")
        lines += profile_lines(ar)
    ulp = data.get("ulp", {})
    if ulp and "error" not in ulp:
        lines += ["## BF16 tree verification vs the exact path computation (GDN recurrence)", "",
                  "| nodes | GDN layers | max ulps (outputs) | exact share | fp32 states bit-equal | conv bit-equal "
                  "| argmax vs chunk forward of the path |", "|---|---|---|---|---|---|---|"]
        for n, r in ulp.items():
            lines.append(f"| {n} | {r['gdn_layers']} | {r['max_ulps']} | {100 * r['exact_share']:.2f}% | "
                         f"{r['states_bit_equal']} | {r['conv_bit_equal']} | {100 * r['argmax_agree_share']:.1f}% |")
        lines.append("")
    for name in ("ar", "ulp", "kernels"):
        if isinstance(data.get(name), dict) and "error" in data[name]:
            lines += [f"{name}: error", "```", data[name]["error"], "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from specpilot.config import load_deployment
    from specpilot.engine.session import Session

    data = {"device": torch.cuda.get_device_name(), "deployment": args.deployment, "commit": args.commit,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def save():
        (out / "hybrid_checks.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        (out / "hybrid_checks.md").write_text(render(data) + "\n")

    t0 = time.perf_counter()
    if "bandwidth" not in args.skip:
        data["bandwidth_tb_s"] = copy_bandwidth()
    session = Session.load(load_deployment(args.deployment), device="cuda", dtype=torch.bfloat16)
    data["load_s"] = time.perf_counter() - t0
    prompts = [session.encode_prompt(t) for t in (
        "Question: A baker makes 24 rolls and sells 9 of them. How many rolls are left?\nAnswer:",
        "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")]
    for name, fn in (("ulp", lambda: ulp_section(session, prompts[0], args.nodes)),
                     ("ar", lambda: ar_section(session, prompts[:1], args.tokens, data["bandwidth_tb_s"],
                                              profile=args.profile, steps=args.steps))):
        if name in args.skip:
            continue
        t = time.perf_counter()
        try:
            data[name] = fn()
        except Exception:
            data[name] = {"error": traceback.format_exc(limit=6)}
        data[f"{name}_s"] = time.perf_counter() - t
        save()
        print(f"{name}: {time.perf_counter() - t:.1f} s", flush=True)
    if "kernels" not in args.skip:
        try:
            import importlib.util

            spec = importlib.util.spec_from_file_location("gdn_kernels", REPO / "scripts" / "gdn_kernels.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules["gdn_kernels"] = module  # its dataclasses resolve their module through it
            spec.loader.exec_module(module)
            module.main(["--out", str(out)])
            data["kernels"] = {"written": "gdn_kernels.json"}
        except Exception:
            data["kernels"] = {"error": traceback.format_exc(limit=6)}
    data["total_s"] = time.perf_counter() - t0
    save()
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
