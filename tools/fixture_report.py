"""Report on the shipped fixture: training, held-out perplexity, samples, acceptance, decode speed.

    python tools/fixture_report.py --out OUT                  # on the GPU: ~3 minutes on an H200
    python tools/fixture_report.py --out OUT --sections training --merge   # add the plot on a CPU
    python tools/fixture_report.py --out OUT --fixture DIR --device cpu --n-prompts 1 --max-new 16

Writes OUT/fixture_report.json (the data), OUT/fixture_report.md (tables rendered from it) and
OUT/loss_curves.png (when matplotlib is installed). Sections (--sections, comma-separated):
- training: stages, steps, tokens, time and loss curves from the fixture's training_log.json;
- heldout: loss and perplexity per corpus source of target and drafter, at 1x and expanded;
- samples: greedy outputs of the 1x target for the first prompts of each benchmark set, and
  whether the expanded target produces the same tokens (bf16 and float32: equal up to rounding);
- acceptance: mean accepted length (tokens committed per target forward) of chain drafting
  (depth 5, top-1) and of the stock tree (the deployment's depth/topk/budget: SGLang's 5/4/8) on
  the first --n-prompts prompts of each set, 1x and expanded deployment, batch 1, EOS honoured;
  plus whether every speculative output equals the AR output;
- decode: ms/token of AR decoding of the expanded target (and 1x target, expanded drafter, and
  speculative decoding) against the byte floor: weight bytes streamed per step / measured
  device-to-device copy bandwidth (read + write bytes per second).
The expanded deployment defaults to deployments/fixture-x16.toml (target x16, drafter x4).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]

import benchmark_prompts
import torch
from fixture_data import windows

from specpilot import env
from specpilot.config import load_deployment
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.models import fixture
from specpilot.models.expand import ModelSize, load_expanded
from specpilot.models.tokenizer import Tokenizer

SECTIONS = ("training", "heldout", "samples", "acceptance", "decode")
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


class Fixture:
    """Paths, tokenizer and loaded models of one fixture directory (or the shipped one)."""

    def __init__(self, root: Path | None, device: torch.device, dtype: torch.dtype):
        self.root = root or fixture.fixture_root()
        self.paths = {r: (root / r if root else fixture.resolve_checkpoint("fixture", r)) for r in fixture.ROLES}
        self.tok = Tokenizer.from_dir(self.paths["target"])
        self.device, self.dtype = device, dtype

    def load(self, role: str, factor: int, dtype: torch.dtype | None = None):
        return load_expanded(self.paths[role], factor, self.device, dtype or self.dtype)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- sections -----------------------------------------------------------------------------
def training_section(fx: Fixture, out: Path) -> dict:
    tlog = fixture.training_log(fx.root)
    res = {"status": tlog.get("status"), "corpus": tlog.get("corpus", {}).get("sources"),
           "decontamination_passed": tlog.get("decontamination", {}).get("passed"),
           "models": {k: v["size"] for k, v in tlog.get("models", {}).items()}, "stages": {}}
    for stage, rec in tlog.get("training", {}).items():
        res["stages"][stage] = {k: rec.get(k) for k in ("steps", "tokens_seen", "seconds", "tokens_per_second",
                                                          "stopped_by", "peak_lr", "epochs")}
        res["stages"][stage]["train_curve"] = rec.get("train_curve", [])
        res["stages"][stage]["heldout_curve"] = rec.get("heldout_curve", [])
    res["final_heldout"] = tlog.get("final_heldout")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        res["plot"] = "matplotlib is not installed here; rerun with --sections training to plot"
        return res
    stages = res["stages"]
    fig, axes = plt.subplots(1, len(stages), figsize=(6 * len(stages), 4), squeeze=False)
    for ax, (stage, rec) in zip(axes[0], stages.items()):
        curve = rec["train_curve"]
        ax.plot([p["tokens"] / 1e6 for p in curve], [p["loss"] for p in curve], label="train loss")
        for key in ("kl", "ce"):
            if curve and key in curve[0]:
                ax.plot([p["tokens"] / 1e6 for p in curve], [p[key] for p in curve], label=f"train {key}", alpha=0.7)
        for source in (rec["heldout_curve"][0]["heldout"] if rec["heldout_curve"] else {}):
            pts = [(e["tokens"] / 1e6, e["heldout"][source]["loss"]) for e in rec["heldout_curve"]]
            ax.plot(*zip(*pts), "o--", label=f"held-out {source}", markersize=3)
        ax.set_title(f"{stage}: {rec['steps']} steps, {rec['seconds']} s")
        ax.set_xlabel("training tokens (M)")
        ax.set_ylabel("nats / token")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "loss_curves.png", dpi=120)
    res["plot"] = "loss_curves.png"
    return res


@torch.no_grad()
def perplexity(model, streams: dict[str, torch.Tensor], seq_len: int, device) -> dict:
    out = {}
    for source, stream in streams.items():
        nll, count = 0.0, 0
        for w in windows(stream, seq_len):
            x = w.to(device)[None]
            logits = model.forward_causal(x[:, :-1]).float()[0]
            nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += x.shape[1] - 1
        out[source] = {"loss": round(nll / count, 4), "ppl": round(math.exp(nll / count), 3), "tokens": count}
    return out


def heldout_section(fx: Fixture, factors: dict[str, int]) -> dict:
    streams = fixture.heldout_tokens(fx.root)
    seq_len = int(fixture.training_log(fx.root).get("settings", {}).get("seq_len", 2048))
    res = {"dtype": str(fx.dtype).removeprefix("torch."), "seq_len": seq_len}
    for role in fixture.ROLES:
        for factor in sorted({1, factors[role]}):
            model = fx.load(role, factor)
            res[f"{role}_x{factor}"] = perplexity(model, streams, seq_len, fx.device)
            log(f"held-out {role} x{factor}: " + ", ".join(f"{s} {v['ppl']:.2f}" for s, v in res[f'{role}_x{factor}'].items()))
            del model
            free(fx.device)
    return res


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def samples_section(fx: Fixture, factor: int, n: int, new_tokens: int) -> dict:
    prompts = {s: benchmark_prompts.prompts(s)[:n] for s in benchmark_prompts.SETS}
    flat = [(s, p) for s, ps in prompts.items() for p in ps]
    ids = [fx.tok.encode(p) for _, p in flat]
    res = {"new_tokens": new_tokens, "expand": factor, "items": []}
    outs = {}
    for dtype in ([fx.dtype, torch.float32] if fx.dtype != torch.float32 else [torch.float32]):
        name = str(dtype).removeprefix("torch.")
        for f in (1, factor):
            model = fx.load("target", f, dtype)
            gen = Generator(model, eos_ids=fx.tok.eos_ids, cuda_graphs=False)
            outs[(name, f)] = [gen.generate([i], new_tokens).outputs[0] for i in ids]
            del model, gen
            free(fx.device)
    base = str(fx.dtype).removeprefix("torch.")
    for k, (s, p) in enumerate(flat):
        item = {"set": s, "prompt": p, "output": fx.tok.decode(outs[(base, 1)][k])}
        for name in {n for n, _ in outs}:
            a, b = outs[(name, 1)][k], outs[(name, factor)][k]
            item[f"x{factor}_equal_{name}"] = a == b
            item[f"x{factor}_common_prefix_{name}"] = common_prefix(a, b)
            item[f"x1_tokens_{name}"] = len(a)
        res["items"].append(item)
    for name in {n for n, _ in outs}:
        res[f"x{factor}_identical_outputs_{name}"] = sum(i[f"x{factor}_equal_{name}"] for i in res["items"])
    res["outputs"] = len(flat)
    log("samples: " + ", ".join(f"{k} {v}/{len(flat)}" for k, v in res.items() if k.startswith(f"x{factor}_identical")))
    return res


def generators(target, drafter, stock, eos_ids) -> dict[str, Generator]:
    """AR, chain (depth, top-1) and the stock tree, each with its own drafter and workspaces."""
    d = stock.depth
    return {
        "ar": Generator(target, eos_ids=eos_ids),
        "chain": Generator(target, {d: DraftModelDrafter(drafter, d, 1, d)}, eos_ids=eos_ids),
        "tree": Generator(target, {d: DraftModelDrafter(drafter, d, stock.topk, stock.tree_budget)}, eos_ids=eos_ids),
    }


def acceptance_section(fx: Fixture, variants: dict, n: int, max_new: int) -> dict:
    res = {"n_prompts": n, "max_new_tokens": max_new, "variants": {}}
    for label, dep in variants.items():
        target, drafter = fx.load("target", dep.target_expand), fx.load("drafter", dep.drafter_expand)
        gens = generators(target, drafter, dep.stock, fx.tok.eos_ids)
        v = {"target_expand": dep.target_expand, "drafter_expand": dep.drafter_expand,
             "stock": {"depth": dep.stock.depth, "topk": dep.stock.topk, "tree_budget": dep.stock.tree_budget},
             "sets": {}}
        for s in benchmark_prompts.SETS:
            prompts = sorted((fx.tok.encode(p) for p in benchmark_prompts.prompts(s)[:n]), key=len)
            row = {}
            ar = [gens["ar"].generate([p], max_new) for p in prompts]
            for mode in ("chain", "tree"):
                runs = [gens[mode].generate([p], max_new) for p in prompts]
                tokens, rounds = sum(r.num_tokens for r in runs), sum(sum(r.rounds) for r in runs)
                row[mode] = {"mean_accepted_length": round(tokens / rounds, 3), "tokens": tokens, "rounds": rounds,
                             "equal_to_ar": sum(r.outputs == a.outputs for r, a in zip(runs, ar))}
            row["ar_tokens"] = sum(a.num_tokens for a in ar)
            v["sets"][s] = row
            log(f"acceptance {label} {s}: chain {row['chain']['mean_accepted_length']}, "
                f"tree {row['tree']['mean_accepted_length']} (equal to AR: {row['chain']['equal_to_ar']}, "
                f"{row['tree']['equal_to_ar']} of {len(prompts)})")
        for mode in ("chain", "tree"):
            vals = [v["sets"][s][mode]["mean_accepted_length"] for s in benchmark_prompts.SETS]
            v[f"{mode}_geomean"] = round(math.exp(sum(map(math.log, vals)) / len(vals)), 3)
        res["variants"][label] = v
        del target, drafter, gens
        free(fx.device)
    return res


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 2**30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - t
    del src, dst
    return 2 * nbytes * reps / seconds


def timed_ms_per_token(gen: Generator, prompt: list[int], tokens: int, reps: int) -> dict:
    gen.generate([prompt], tokens)  # warm-up: captures graphs, compiles
    runs = [gen.generate([prompt], tokens) for _ in range(reps)]
    per = sorted((r.seconds - r.prefill_seconds) / r.num_tokens * 1e3 for r in runs)
    return {"ms_per_token": round(per[len(per) // 2], 4), "all_ms_per_token": [round(x, 4) for x in per],
            "tokens": runs[0].num_tokens, "mean_accepted_length": round(runs[0].mean_accepted_length, 3)}


def decode_section(fx: Fixture, dep, tokens: int, reps: int, compile_ops: bool) -> dict:
    dev = fx.device
    bw = copy_bandwidth(dev) if dev.type == "cuda" else float("nan")
    prompt = fx.tok.encode(benchmark_prompts.prompts("gsm8k")[0])
    os.environ["SPECPILOT_COMPILE"] = "1" if compile_ops else "0"
    res = {"copy_bandwidth_GBps": round(bw / 1e9, 1), "tokens": tokens, "reps": reps, "fused_ops": compile_ops,
           "dtype": str(fx.dtype).removeprefix("torch."), "prompt_tokens": len(prompt), "note":
           "AR without EOS so every run decodes exactly `tokens` tokens; median of reps after a warm-up"}
    for role, factor in (("target", 1), ("drafter", dep.drafter_expand), ("target", dep.target_expand)):
        model = fx.load(role, factor)
        size = ModelSize.of(model.config)
        floor_ms = size.decode_bytes(fx.dtype) / bw * 1e3
        entry = {"params": size.params, "decode_bytes": size.decode_bytes(fx.dtype), "byte_floor_ms": round(floor_ms, 4),
                 "ar": timed_ms_per_token(Generator(model, eos_ids=()), prompt, tokens, reps)}
        entry["ar_vs_floor"] = None if math.isnan(bw) else round(entry["ar"]["ms_per_token"] / floor_ms, 3)
        if role == "target" and factor == dep.target_expand:
            drafter = fx.load("drafter", dep.drafter_expand)
            for mode, gen in generators(model, drafter, dep.stock, ()).items():
                if mode != "ar":
                    entry[mode] = timed_ms_per_token(gen, prompt, tokens, reps)
                    entry[mode]["speedup_vs_ar"] = round(entry["ar"]["ms_per_token"] / entry[mode]["ms_per_token"], 3)
            del drafter
        res[f"{role}_x{factor}"] = entry
        log(f"decode {role} x{factor}: {entry['ar']['ms_per_token']} ms/token, floor {floor_ms:.4f} ms "
            f"({size.decode_bytes(fx.dtype) / 1e9:.2f} GB at {bw / 1e9:.0f} GB/s)")
        del model
        free(dev)
    t = res[f"target_x{dep.target_expand}"]
    d = res[f"drafter_x{dep.drafter_expand}"]
    res["draft_step_over_target_step"] = round(d["ar"]["ms_per_token"] / t["ar"]["ms_per_token"], 3)
    return res


# ---- rendering ----------------------------------------------------------------------------
def render(report: dict) -> str:
    head = f"Device: {report['device']}, dtype {report['dtype']}; expanded deployment `{report['expanded_deployment']}`."
    lines = ["# Fixture report", "", head, ""]
    tr = report.get("training")
    if isinstance(tr, dict) and "stages" in tr:
        lines += ["## Training", "", "| stage | steps | tokens (M) | seconds | tokens/s | stopped by | last train loss |",
                  "|---|---|---|---|---|---|---|"]
        for stage, r in tr["stages"].items():
            last = r["train_curve"][-1]["loss"] if r["train_curve"] else float("nan")
            lines.append(f"| {stage} | {r['steps']} | {r['tokens_seen'] / 1e6:.1f} | {r['seconds']} | "
                         f"{r['tokens_per_second']} | {r['stopped_by']} | {last} |")
        lines += ["", f"Decontamination passed: {tr['decontamination_passed']}. Plot: {tr.get('plot')}.", ""]
    ho = report.get("heldout")
    if isinstance(ho, dict) and "dtype" in ho:
        models = [k for k in ho if k not in ("dtype", "seq_len")]
        sources = list(ho[models[0]])
        lines += ["## Held-out perplexity", "", f"{ho['dtype']}, windows of {ho['seq_len']} tokens.", "",
                  "| model | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]
        lines += [f"| {m} | " + " | ".join(f"{ho[m][s]['ppl']:.2f}" for s in sources) + " |" for m in models]
        lines.append("")
    ac = report.get("acceptance")
    if isinstance(ac, dict) and "variants" in ac:
        what = (f"First {ac['n_prompts']} prompts per set, up to {ac['max_new_tokens']} new tokens, batch 1; "
                "tokens committed per target forward (accepted drafts + 1).")
        lines += ["## Mean accepted length", "", what, "",
                  "| deployment | mode | " + " | ".join(benchmark_prompts.SETS) + " | geomean |",
                  "|---|---|" + "---|" * (len(benchmark_prompts.SETS) + 1)]
        for label, v in ac["variants"].items():
            for mode in ("chain", "tree"):
                cells = [f"{v['sets'][s][mode]['mean_accepted_length']:.2f}" for s in benchmark_prompts.SETS]
                lines.append(f"| {label} (x{v['target_expand']}/x{v['drafter_expand']}) | {mode} | "
                             + " | ".join(cells) + f" | {v[f'{mode}_geomean']:.2f} |")
        lines.append("")
    de = report.get("decode")
    if isinstance(de, dict) and "tokens" in de:
        what = (f"Copy bandwidth {de['copy_bandwidth_GBps']} GB/s (read + write); byte floor = weight bytes "
                f"streamed per step / that bandwidth; fused ops: {de['fused_ops']}.")
        lines += ["## Decode speed", "", what, "",
                  "| model | params | GB/step | floor ms | AR ms/token | AR / floor |", "|---|---|---|---|---|---|"]
        for k, e in de.items():
            if isinstance(e, dict) and "ar" in e:
                lines.append(f"| {k} | {e['params'] / 1e6:.1f}M | {e['decode_bytes'] / 1e9:.3f} | {e['byte_floor_ms']} | "
                             f"{e['ar']['ms_per_token']} | {e['ar_vs_floor']} |")
            for mode in ("chain", "tree"):
                if isinstance(e, dict) and mode in e:
                    lines.append(f"| {k} {mode} | | | | {e[mode]['ms_per_token']} | speedup {e[mode]['speedup_vs_ar']}x |")
        lines += ["", f"Draft step / target step (AR ms): {de.get('draft_step_over_target_step')}", ""]
    sm = report.get("samples")
    if isinstance(sm, dict) and "items" in sm:
        counts = ", ".join(f"{k}: {v}/{sm['outputs']}" for k, v in sm.items() if "identical" in k)
        lines += ["## Samples", "", f"Greedy, 1x target; `=` marks outputs the expanded target reproduces exactly ({counts}).", ""]
        for it in sm["items"]:
            same = " ".join(f"{k.split('_')[-1]} {'=' if v else '≠'}" for k, v in it.items() if "_equal_" in k)
            lines += [f"**{it['set']}** ({same})", "", "```", it["prompt"].rstrip()[-300:] + "⟨|⟩" + it["output"][:600], "```", ""]
    for name, err in report.get("errors", {}).items():
        lines += [f"## {name}: FAILED", "", "```", err[-2000:], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for fixture_report.{json,md} and the plot")
    ap.add_argument("--fixture", type=Path, default=None, help="fixture directory (default: the shipped one)")
    ap.add_argument("--deployment", default="fixture-x16", help="expanded deployment (target/drafter factors, stock)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--device", default=None, help="default: SPECPILOT_DEVICE, else cuda when available")
    ap.add_argument("--n-prompts", type=int, default=5, help="prompts per set for acceptance")
    ap.add_argument("--max-new", type=int, default=256, help="new tokens per acceptance run")
    ap.add_argument("--samples", type=int, default=2, help="sample prompts per set")
    ap.add_argument("--sample-tokens", type=int, default=96, help="new tokens per sample")
    ap.add_argument("--decode-tokens", type=int, default=256, help="tokens per decode timing run")
    ap.add_argument("--decode-reps", type=int, default=3, help="timed decode runs (median reported)")
    ap.add_argument("--compile", action="store_true", help="time decoding with SpecPilot's fused (compiled) ops")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other sections of an existing report in --out (e.g. add the plot on a CPU)")
    a = ap.parse_args(argv)
    sections = [s for s in a.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    os.environ["SPECPILOT_COMPILE"] = "0"  # accuracy sections never need compiled ops
    device = torch.device(a.device) if a.device else env.default_device()
    dtype = env.default_dtype(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 checks stay float32
    fx = Fixture(a.fixture, device, dtype)
    base, wide = load_deployment("fixture"), load_deployment(a.deployment)
    factors = {"target": wide.target_expand, "drafter": wide.drafter_expand}
    a.out.mkdir(parents=True, exist_ok=True)
    previous = a.out / "fixture_report.json"
    kept = json.loads(previous.read_text()) if a.merge and previous.is_file() else {}
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype).removeprefix("torch."), "expanded_deployment": wide.name,
              "fixture": str(fx.root), "settings": vars(a) | {"out": str(a.out), "fixture": str(a.fixture)},
              "errors": {}, "seconds": {}}
    if kept:  # the header stays the original run's; the sections run now replace theirs
        report = kept | {k: v for k, v in report.items() if k not in ("device", "dtype", "settings", "fixture")}
        report["errors"] = {k: v for k, v in kept.get("errors", {}).items() if k not in sections}
        report["seconds"] = kept.get("seconds", {})
    jobs = {
        "training": lambda: training_section(fx, a.out),
        "heldout": lambda: heldout_section(fx, factors),
        "samples": lambda: samples_section(fx, factors["target"], a.samples, a.sample_tokens),
        "acceptance": lambda: acceptance_section(fx, {base.name: base, wide.name: wide}, a.n_prompts, a.max_new),
        "decode": lambda: decode_section(fx, wide, a.decode_tokens, a.decode_reps, a.compile),
    }
    for name in sections:
        t = time.perf_counter()
        log(f"section {name}")
        try:
            report[name] = jobs[name]()
        except Exception as err:  # noqa: BLE001 -- one failed section must not lose the others; it is reported
            report["errors"][name] = "".join(traceback.format_exception(err))
            log(f"section {name} FAILED:\n{report['errors'][name]}")
        report["seconds"][name] = round(time.perf_counter() - t, 1)
        (a.out / "fixture_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (a.out / "fixture_report.md").write_text(render(report))
    log(f"wrote {a.out / 'fixture_report.json'} and {a.out / 'fixture_report.md'}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
