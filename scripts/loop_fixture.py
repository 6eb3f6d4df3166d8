"""The SpecPilot loop on a GPU, in one bounded call: `specpilot run` sized for a ~10-minute job.

    python scripts/loop_fixture.py --dry-run                       # check the plan; loads no model
    python scripts/loop_fixture.py --deployment fixture-x16 --out results/loop/fixture-x16 \\
        --budget-minutes 8.5

Runs the loop (`specpilot.loop.run.run_loop`) on the deployment with the GPU defaults (timing preset
`scaled`: 10 paired blocks x 2 requests x 256 new tokens, 12 noise blocks; agents integration,
knob, kernel, and coding when SPECPILOT_CODING_AGENT is set), then times AR, stock and the final
system in one benchmark run (5 prompts x 5 sets x 512 new tokens). It is budget-aware: a round
starts only if it and the final measurement fit in what is left of --budget-minutes; should the
budget be overrun anyway, an alarm at budget + 45 s — or SIGINT / SIGTERM from an outer `timeout`
— kills this run's workers, interrupts the work and the report is still written (without the
final benchmark if that was what ran over). Under `timeout --signal=INT --kill-after=20 S`, keep
--budget-minutes at most (S - 60) / 60.

Devices: with three or more GPUs the loop keeps cuda:0 for itself (profiles, the guard's scorer,
kernel tuning, the final benchmark) and times candidates on the others, one GPU per comparison
(`alternate` placement, so up to N - 1 candidates are timed at once); with one or two GPUs every
GPU is used (comparisons then run one at a time, so nothing overlaps the timing). --devices and
--placement override this.

Writes into --out, flat (6 files, each well under 16 MB): report.md, report.json, decisions.jsonl,
trajectory.png, gaps.png and memory.json (the memory's entries for this run's deployment); and,
when a worker died, a 7th: workers.tar.gz, the output of this run's dead workers (kept under
$SPECPILOT_HOME/workers, which a GPU call's machine does not keep). The
memory database itself stays in $SPECPILOT_HOME (default ~/.specpilot). An --out that holds files
is refused unless --resume (continue that run). To continue on another machine (a later GPU call),
bring OUT there and pass `--out OUT --resume`: the run first merges OUT/memory.json into the memory
(`specpilot memory import`: its entries and the kernel tables its systems name). A run
spread over several calls passes --no-final to all but the last, whose final measurement covers the
whole run: the time of the others' finals goes to rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

GRACE_S = 45  # after the budget, the alarm interrupts whatever still runs


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment", default="fixture-x16", help="deployment file or shipped name (default fixture-x16)")
    p.add_argument("--out", default=str(REPO / "results" / "loop" / "fixture-x16"), help="report folder")
    p.add_argument("--rounds", type=int, help="rounds (default: with --budget-minutes, as many as the budget fits; "
                   "else the device's default)")
    p.add_argument("--budget-minutes", type=float, default=8.5, help="wall clock of the whole run (default 8.5)")
    p.add_argument("--agents", nargs="+", default=["integration", "knob", "kernel", "coding"],
                   help="proposer agents (default: integration knob kernel coding)")
    p.add_argument("--max-candidates", type=int, default=3, help="candidates timed per round (default 3)")
    p.add_argument("--timing", default="scaled", choices=["quick", "scaled", "standard"], help="timing preset")
    p.add_argument("--placement", choices=["auto", "alternate", "side-by-side"], default=None,
                   help="arms on one GPU each (alternate, default) or side by side on two")
    p.add_argument("--devices", help="comma-separated worker devices (default: see the module docstring)")
    p.add_argument("--final-prompts", type=int, default=5, help="prompts per set in the final measurement (>= 5: an interval needs them)")
    p.add_argument("--final-tokens", type=int, default=512, help="new tokens per prompt in the final measurement")
    p.add_argument("--final-heldout-prompts", type=int, default=8,
                   help="held-out prompts (never shown to the loop) the final measurement adds (0 = none)")
    p.add_argument("--no-final", action="store_true",
                   help="no final measurement: its time goes to rounds (a call that a later --resume continues)")
    p.add_argument("--controller", action="append", metavar="FIELD=VALUE", default=[],
                   help="a ControllerConfig field over the timing preset, e.g. noise_blocks=30 (repeatable)")
    p.add_argument("--memory", help="memory database (default: $SPECPILOT_MEMORY or $SPECPILOT_HOME/memory.sqlite)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--no-compile", action="store_true", help="SPECPILOT_COMPILE=0: no torch.compile (faster start)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and check the inputs; load no model")
    return p.parse_args(argv)


def worker_devices(args) -> tuple[str, ...]:
    import torch

    if args.devices:
        return tuple(d.strip() for d in args.devices.split(",") if d.strip())
    n = torch.cuda.device_count()
    if n == 0:
        return ("cpu",)
    gpus = [f"cuda:{i}" for i in range(n)]
    return tuple(gpus[1:] if n >= 3 else gpus)


def plan(args):
    from specpilot.config import load_deployment
    from specpilot.cli.run import controller_fields
    from specpilot.loop.config import Timing, controller_config, for_device
    from specpilot.loop.run import RunOptions

    devices = worker_devices(args)
    device = "cuda" if devices[0].startswith("cuda") else "cpu"
    controller = {"placement": args.placement or ("alternate" if len(devices) != 2 else "auto"),
                  **controller_fields(args.controller)}
    config = for_device(device, rounds=args.rounds, budget_minutes=args.budget_minutes, agents=tuple(args.agents),
                        max_candidates=args.max_candidates, timing=Timing(args.timing),
                        final=not args.no_final, final_prompts=args.final_prompts, final_tokens=args.final_tokens,
                        final_heldout_prompts=args.final_heldout_prompts,
                        controller=controller)
    deployment = load_deployment(args.deployment)
    ccfg = controller_config(config, deployment)  # validates the settings
    options = RunOptions(deployment=args.deployment, out=args.out, resume=args.resume, memory=args.memory,
                         devices=devices)
    return deployment, config, ccfg, options


def main(argv=None) -> int:
    from specpilot import env

    args = parse_args(argv)
    os.environ.update(env.WORKER_MULTICAST_OFF)  # workers get it anyway; this process too
    if args.no_compile:
        os.environ["SPECPILOT_COMPILE"] = "0"
    from specpilot.errors import SpecPilotError

    try:
        deployment, config, ccfg, options = plan(args)
    except SpecPilotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from specpilot.loop.config import rounds_text

    print(f"plan: {deployment.name} (target x{deployment.target_expand}, drafter x{deployment.drafter_expand}, "
          f"batch {deployment.regime.batch}); workers on {', '.join(options.devices)} ({ccfg.placement.value}); "
          f"{rounds_text(config.rounds)} within {config.budget_minutes} min, {config.max_candidates} candidates per round, "
          f"agents {', '.join(config.agents)}; timing {config.timing.value}: {ccfg.blocks} blocks x "
          f"{ccfg.requests_per_block} requests x {ccfg.max_new_tokens} tokens (+{ccfg.extra_blocks} extra), "
          f"{ccfg.noise_blocks} noise blocks; "
          + (f"final: {config.final_prompts} prompts/set x {config.final_tokens} tokens, "
             f"{config.final_heldout_prompts} held-out prompts" if config.final else
             "no final measurement (a later --resume measures it)") + f"; out {options.out}")
    if args.dry_run:
        out = Path(options.out)
        if out.is_dir() and any(out.iterdir()) and not args.resume:
            print(f"error: --out {out} already holds files (pass --resume or choose another)", file=sys.stderr)
            return 2
        return 0
    from specpilot.cli.run import summary
    from specpilot.loop.run import run_loop

    if args.resume:
        try:
            imported = import_memory(Path(options.out) / "memory.json", options.memory)
        except SpecPilotError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if imported:
            print(imported)

    def stop(signum, frame):
        kill_own_workers()  # timed comparisons in other threads fail fast instead of running to their end
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # the alarm (budget overrun) and SIGINT/SIGTERM (an outer `timeout`) both end the work quickly and
    # leave time to write the report
    for sig in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    signal.alarm(int(config.budget_s + GRACE_S))
    started = time.time()
    try:
        result = run_loop(config, options)
    except SpecPilotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        signal.alarm(0)
    export_memory(result, Path(result.paths.out) / "memory.json")
    packed = pack_worker_logs(Path(result.paths.out), started)
    print(summary(result.report))
    if packed is not None:
        print(f"  the output of the workers that died: {packed}")
    return 0


def pack_worker_logs(out: Path, since: float) -> Path | None:
    """The logs of this run's dead workers (those `env.worker_logs()` still holds, written since
    `since`) as `out`/workers.tar.gz; None when no worker died."""
    from specpilot import env

    logs = sorted(p for p in env.worker_logs().glob("*/*.log") if p.stat().st_mtime >= since)
    if not logs:
        return None
    path = out / "workers.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for log in logs:
            tar.add(log, arcname=f"{log.parent.name}/{log.name}")
    return path


def kill_own_workers() -> None:
    """SIGKILL this process's own controller workers (children running worker_main.py), by pid."""
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "")
        if ppid == me and b"worker_main.py" in cmdline:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def import_memory(path: Path, memory: str | None) -> str:
    """Merge the run's memory.json (written by an earlier call, maybe on another machine) into the
    memory database, kernel tables included; what was added, or "" without a memory.json. Importing
    what the database holds already adds nothing."""
    from specpilot import env
    from specpilot.errors import SpecPilotError
    from specpilot.memory.store import Memory

    if not path.is_file():
        return ""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SpecPilotError(f"{path}: cannot be read as a memory export ({err})") from None
    db = Path(memory) if memory else env.memory_path()
    with Memory(db) as m:
        added = m.import_export(data)
    return (f"memory: {path} merged into {db}: {added['evaluations']} evaluation(s), {added['noise_floors']} noise "
            f"floor(s), {added['systems']} system(s), {added['kernel_tables']} kernel table file(s) added "
            f"({added['held']} row(s) already held)")


def export_memory(result, path: Path) -> None:
    """The memory's evaluations of this deployment (and its noise floors, and the kernel tables
    their systems name), as JSON."""
    from specpilot.memory.store import Memory

    digest = result.report["deployment"]["fingerprint"]
    with Memory(result.report["run"]["memory"]) as memory:
        data = memory.export()
    data["evaluations"] = [e for e in data["evaluations"] if e["deployment"] == digest]
    data["noise_floors"] = [n for n in data["noise_floors"] if n["deployment"] == digest]
    hashes = {e["candidate"] for e in data["evaluations"]} | {e["incumbent"] for e in data["evaluations"]}
    data["systems"] = [s for s in data["systems"] if s["hash"] in hashes]
    data["deployments"] = [d for d in data["deployments"] if d["fingerprint"] == digest]
    named = {s["knobs"].get("kernel_table", "") for s in data["systems"]}
    data["kernel_tables"] = [t for t in data["kernel_tables"] if t["table"] in named]
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
