"""DFlash training recipes side by side on one GPU: acceptance on the benchmark sets per recipe.

    python scripts/dflash_recipe.py --out DIR [--minutes 2] [--bench-eval 3] [--variant NAME ...]

The one-call GPU run (issue 57; H100, run tool timeout_s 420 for margin):

    python scripts/dflash_recipe.py --out $OUT/recipe

trains the DEFAULT variants: base (the shipped recipe), window128 (anchors among the first 128
generated tokens), mix-window128 (+ half the rows from train-split questions formatted as the
benchmark formats its prompts, no loss past EOS) and mix-window128-distill (+ KL from the
target). Time, from the shipped run (8155 sequences generated in 105 s, 3 minutes of training):
corpus + questions + model ~20 s, generating DATA_ARGS' 6144 sequences ~80 s, then the 4
variants side by side (each ~10 s start-up, --minutes 2 = 120 s of training at ~1/4 of the GPU,
then its held-out and benchmark engine checks ~30 s), then every variant's positions
(`dflash_positions.py`) at once ~20 s: ~280 s in all. The variants are compared with each other
at equal wall-clock, not trained to the end: train the chosen one alone afterwards
(`tools/train_dflash.py --out OUT <its flags>`, 3.5 minutes by default).

Generates the training sequences once (`tools/train_dflash.py --data-only` with DATA_ARGS: corpus
windows and formatted questions in one file; each variant's --prompt-mix picks its rows), then
trains every variant at the same time from them (each `tools/train_dflash.py --data ...
--bench-eval N`, so they share the GPU and each gets fewer steps than alone), and collects each run's held-out
simulated acceptance and its engine acceptance on N prompts per benchmark set (chain, DDTree at
budgets 32 and 64) and its accuracy per block offset (`dflash_positions.py`). Writes
DIR/dflash_recipe.json and .md; every drafter stays in DIR/<variant>/dflash.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specpilot.bench.provenance import capture  # noqa: E402

VARIANTS = {  # name -> extra arguments of tools/train_dflash.py
    "base": [],
    "window128": ["--anchor-window", "128"],
    "layers4": ["--layers", "4"],
    "layers4-window128": ["--layers", "4", "--anchor-window", "128"],
    "distill": ["--distill", "0.5"],  # half CE on the target's token, half KL from its distribution
    "distill1": ["--distill", "1.0"],
    # half the rows from train-split questions formatted as the benchmark's prompts (question_prompts.py)
    "mix": ["--prompt-mix", "0.5", "--stop-at-eos"],
    "mix-window128": ["--prompt-mix", "0.5", "--stop-at-eos", "--anchor-window", "128"],
    "mix-window128-distill": ["--prompt-mix", "0.5", "--stop-at-eos", "--anchor-window", "128", "--distill", "0.5"],
    # variable prefix: up to 7 real tokens after a block's root, loss past them (dflash_objective.py block_loss)
    "mix-window128-prefix": ["--prompt-mix", "0.5", "--stop-at-eos", "--anchor-window", "128", "--prefix-max", "7"],
}
DEFAULT = ("base", "window128", "mix-window128", "mix-window128-distill")  # one ~5-minute GPU call
DATA_ARGS = ["--prompts", "4096", "--questions", "2048"]  # ~80 s of generation on an H100


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=2.0, help="training minutes per variant")
    p.add_argument("--bench-eval", type=int, default=3, help="prompts per benchmark set")
    p.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                   help="repeat for several (default: DEFAULT, which share the GPU and each get fewer steps)")
    p.add_argument("--smoke", action="store_true", help="a random tiny target on CPU, no benchmark sets (tests)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tool = [sys.executable, str(ROOT / "tools" / "train_dflash.py")] + (["--smoke"] if args.smoke else [])
    if args.smoke:
        args.bench_eval = 0
    data = out / "sequences.pt"
    t0 = time.time()
    data_args = ["--questions", "6"] if args.smoke else DATA_ARGS
    subprocess.run(tool + ["--out", str(out / "data"), "--data", str(data), "--data-only"] + data_args, check=True)
    names = args.variant or list(DEFAULT)
    procs = {}
    for name in names:
        cmd = tool + ["--out", str(out / name), "--data", str(data), "--minutes", str(args.minutes),
                      "--bench-eval", str(args.bench_eval)] + VARIANTS[name]
        with open(out / f"{name}.log", "w") as log:  # the child keeps its own copy of the descriptor
            procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    rows, positions = [], {}
    for name, proc in procs.items():
        rc = proc.wait()
        rec = {"variant": name, "args": VARIANTS[name], "rc": rc}
        file = out / name / "training_log.json"
        if rc == 0 and file.is_file():
            trained = json.loads(file.read_text())
            rec.update(steps=trained["training"]["steps"], heldout_simulated_acc_len=trained["heldout_simulated_acc_len"],
                       heldout_engine=trained["engine_check"], bench=trained["bench_check"])
            if not args.smoke:  # per-offset accuracy on the benchmark text, every variant at once
                positions[name] = subprocess.Popen(
                    [sys.executable, str(ROOT / "scripts" / "dflash_positions.py"), "--out", str(out / name / "positions"),
                     "--drafter", str(out / name / "dflash")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows.append(rec)
    for rec in rows:
        if rec["variant"] in positions:
            positions[rec["variant"]].wait()
            file = out / rec["variant"] / "positions" / "dflash_positions.json"
            if file.is_file():
                d = json.loads(file.read_text())
                rec["positions"] = {k: d[k] for k in ("all", "fresh", "looping", "root_ablated")}
    data.unlink(missing_ok=True)  # hundreds of MB; regenerated by the next run
    doc = {"benchmark": "DFlash training recipes side by side", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "provenance": capture(torch.device("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16), "minutes_per_variant": args.minutes, "bench_prompts_per_set": args.bench_eval,
           "seconds": time.time() - t0, "variants": rows}
    (out / "dflash_recipe.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# DFlash training recipes, side by side on one GPU", "",
             f"{args.minutes} training minutes each, all at once from one set of sequences; acceptance = mean "
             f"accepted length per round on {args.bench_eval} prompts per benchmark set (128 new tokens).", "",
             "| variant | steps | held-out simulated | chain-15 | DDTree-32 | DDTree-64 | identical to AR |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("bench"):
            lines.append(f"| {r['variant']} | " + (f"{r['steps']} | {r['heldout_simulated_acc_len']:.2f} | | | | |"
                                                      if r["rc"] == 0 else f"failed (rc {r['rc']}) | | | | | |"))
            continue
        b = r["bench"]
        same = min(v["identical_to_ar"] for v in b.values())
        lines.append(f"| {r['variant']} | {r['steps']} | {r['heldout_simulated_acc_len']:.2f} | "
                     + " | ".join(f"{b[k]['mean_accepted_length']:.2f}" for k in ("chain-15", "best_first-32", "best_first-64"))
                     + f" | {same}/{b['chain-15']['prompts']} |")
    (out / "dflash_recipe.md").write_text("\n".join(lines) + "\n\nWritten by `scripts/dflash_recipe.py`.\n")
    print("\n".join(lines))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
