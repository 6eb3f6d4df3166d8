"""`specpilot run`: the SpecPilot loop from the command line.

    specpilot run                                   # a short loop on the default deployment, this device
    specpilot run --deployment deployments/fixture-x16.toml --rounds 4 --budget-minutes 30
    specpilot run --out runs/x16 --resume           # continue a run that was interrupted

Live progress goes to stderr (one line per step, every decision with its numbers); the result
table to stdout; the report (report.md, report.json, trajectory.png, gaps.png, decisions.jsonl)
to `--out`, by default `$SPECPILOT_HOME/runs/loop/<UTC time>-<deployment>`. Defaults depend on
the device: on CPU 2 rounds within 4 minutes with the `quick` timing preset, on GPU 3 rounds
with `scaled` timing and no budget (see `specpilot/loop/config.py`). Flags map 1:1 onto
`LoopConfig` and `RunOptions` fields.

Exit status: 0 when the run ends on its own, 130 when Ctrl-C cut it short (the report of what was
done is still written), 2 for bad input.

Owns: flags, printing the result. Does not own the loop (`specpilot/loop/run.py`).
"""

from __future__ import annotations

import argparse
import sys

HELP = "the SpecPilot loop: find, validate and keep lossless speedups for a deployment"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help=HELP,
        description="Each round: measure the current best system, compute its ceiling and largest gap, let the "
                    "proposer agents produce candidates, gate them with token forcing, time them against the "
                    "incumbent in paired isolated runs, promote, stack small gains, and remember everything in the "
                    "memory. Ends with stock and the final system timed against AR, and a report.")
    add_arguments(p)
    p.set_defaults(func=run_command)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specpilot.control.gate import DEFAULT_GATE
    from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE
    from specpilot.loop.config import SlotPolicy, Timing
    from specpilot.loop.runner import LOOP_RUNNER

    p.add_argument("--deployment", help="deployment file or shipped name (default: fixture)")
    p.add_argument("--rounds", type=int, help="rounds in the run, counting rounds done before a --resume "
                                              "(default: as many as --budget-minutes fits, else 2 on CPU, 3 on GPU)")
    p.add_argument("--agents", nargs="+", help="proposer agents, in order (default: integration knob kernel coding; "
                                               "agents that cannot run here say why and stay off)")
    p.add_argument("--budget-minutes", type=float,
                   help="wall-clock budget of the whole run, final measurement included, not counting a wait for "
                        "another run's timing lock; the loop says before its first round what fits, starts no round "
                        "that would not fit, and skips the final measurement when it would not (default: none; the "
                        "run is sized by --rounds and prints its estimate before the first round)")
    p.add_argument("--out", help="report directory (default: $SPECPILOT_HOME/runs/loop/<UTC time>-<deployment>); "
                                 "one that holds files is refused unless --resume")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (its journal, its round numbers)")
    p.add_argument("--max-candidates", type=int, help="candidates timed per round (default 3)")
    p.add_argument("--slots", choices=[s.value for s in SlotPolicy],
                   help="how a round's candidates are shared among the agents: gaps (default; in proportion to "
                        "what the gaps each agent can close would save, agents without a share not asked) or "
                        "round-robin (every agent every round)")
    p.add_argument("--timing", choices=[t.value for t in Timing],
                   help="how candidates are timed: quick (CPU default), scaled (GPU default), standard (the "
                        "controller's defaults)")
    p.add_argument("--coding-agent", dest="coding_command",
                   help="command template of the external coding agent, e.g. 'claude -p \"$(cat {task_file})\"' "
                        "(default: $SPECPILOT_CODING_AGENT; none = the coding agent is off)")
    p.add_argument("--coding-timeout", dest="coding_timeout_s", type=float, help="seconds per coding-agent run (1800)")
    p.add_argument("--coding-agents", type=int,
                   help="coding-agent processes run at once each round, each in its own worktree with its own brief "
                        "(the gap it targets); at most the slots the coding agent holds that round (default 2)")
    p.add_argument("--kernel-budget", dest="kernel_budget_s", type=float,
                   help="seconds the kernel agent may spend timing kernels per round (60)")
    p.add_argument("--profile-tokens", type=int, help="new tokens per prompt when profiling the incumbent")
    p.add_argument("--final-prompts", type=int, help="prompts per set in the final measurement against AR")
    p.add_argument("--final-tokens", type=int, help="new tokens per prompt in the final measurement")
    p.add_argument("--final-heldout-prompts", type=int,
                   help="prompts of the held-out set (the project's own, never shown to the loop) the final "
                        "measurement also times AR, stock and the final system on, to show whether the gain holds "
                        "outside the deployment's sets (default 8; 0 = none)")
    p.add_argument("--no-final", action="store_true", help="skip the final measurement against AR")
    p.add_argument("--patience", type=int, help="stop after this many rounds in a row with nothing new (2)")
    p.add_argument("--seed", type=int, help="seed of prompt draws, arm order and bootstraps (0)")
    p.add_argument("--controller", action="append", metavar="FIELD=VALUE",
                   help="a ControllerConfig field laid over the timing preset, e.g. blocks=8 (repeatable; see "
                        "`specpilot evaluate --help` for the fields)")
    p.add_argument("--remeasure-noise", action="store_true",
                   help="measure the stock-vs-stock noise floor again instead of reusing the memory's (e.g. after "
                        "the machine got quieter)")
    p.add_argument("--memory", help="memory database (default: $SPECPILOT_MEMORY or $SPECPILOT_HOME/memory.sqlite)")
    p.add_argument("--devices", help="comma-separated devices for the workers (default: every visible GPU, else cpu)")
    add_wait_flags(p)
    p.add_argument("--gate", default=DEFAULT_GATE, help=f"guard gate as module:attr (default: {DEFAULT_GATE})")
    p.add_argument("--prompt-source", default=DEFAULT_PROMPT_SOURCE,
                   help=f"prompt-source factory as module:attr (default: {DEFAULT_PROMPT_SOURCE})")
    p.add_argument("--runner", default=LOOP_RUNNER, help=f"runner factory of the workers (default: {LOOP_RUNNER})")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_wait_flags(p: argparse.ArgumentParser) -> None:
    """--wait-minutes / --no-wait: what to do when another timing run holds the devices or the memory."""
    from specpilot.control.timing_lock import DEFAULT_WAIT_S

    p.add_argument("--wait-minutes", type=float, default=DEFAULT_WAIT_S / 60,
                   help="how long to wait for another timing run on the same devices or memory to finish; after "
                        "that this one times anyway and marks what it times as measured under contention "
                        f"(default: {DEFAULT_WAIT_S / 60:g})")
    p.add_argument("--no-wait", action="store_true",
                   help="do not wait for another timing run: time at once, marked as measured under contention")


# first words of a command template that the shell resolves, not PATH: they are not checked
SHELL_WORDS = frozenset({"!", "{", "(", ".", ":", "cd", "command", "eval", "exec", "export", "for", "if", "set",
                         "source", "time", "until", "while", "case"})
SHELL_SYNTAX = set("$`{}()[]*?;&|<>\\'\"")


def check_coding_command(template: str | None) -> None:
    """`--coding-agent`'s program exists: the template's first word after any NAME=value
    assignments is found on PATH (`shutil.which`), or, as a path, is an executable file; else one
    `ConfigError` line (exit 2) before the run starts. Not checked: a word the shell resolves (a
    builtin or keyword, an expansion, a placeholder) and a relative path with a slash (the command
    runs in its worktree)."""
    import os
    import shlex
    import shutil

    from specpilot.errors import ConfigError

    if not template:
        return
    try:
        words = shlex.split(template)
    except ValueError as err:
        raise ConfigError(f"--coding-agent {template!r}: not a shell command ({err})") from None
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        words.pop(0)
    if not words:
        raise ConfigError(f"--coding-agent {template!r}: names no program")
    word = os.path.expanduser(words[0])
    if word in SHELL_WORDS or SHELL_SYNTAX & set(word) or ("/" in word and not os.path.isabs(word)):
        return
    if "/" in word:
        if not (os.path.isfile(word) and os.access(word, os.X_OK)):
            raise ConfigError(f"--coding-agent: {word} is not an executable file")
    elif shutil.which(word) is None:
        raise ConfigError(f"--coding-agent: no program {word!r} on PATH (install it, or give its full path)")


def wait_seconds(args) -> float:
    return 0.0 if args.no_wait else max(0.0, args.wait_minutes * 60)


def config_from_args(args, device: str):
    from specpilot.loop.config import SlotPolicy, Timing, for_device

    return for_device(
        device, rounds=args.rounds, budget_minutes=args.budget_minutes,
        agents=tuple(a for item in args.agents for a in item.split(",") if a) if args.agents else None,
        max_candidates=args.max_candidates, timing=Timing(args.timing) if args.timing else None,
        slots=SlotPolicy(args.slots) if args.slots else None,
        coding_command=args.coding_command, coding_timeout_s=args.coding_timeout_s, coding_agents=args.coding_agents,
        kernel_budget_s=args.kernel_budget_s,
        profile_tokens=args.profile_tokens, final_prompts=args.final_prompts, final_tokens=args.final_tokens,
        final_heldout_prompts=args.final_heldout_prompts, final=False if args.no_final else None,
        patience=args.patience, seed=args.seed,
        controller=controller_fields(args.controller or []) or None,
    )


def controller_fields(items: list[str]) -> dict:
    """{"blocks": 8, "order": "random"} from ["blocks=8", "order=random"] (values read as JSON when they parse)."""
    import json

    from specpilot.errors import ConfigError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--controller {item!r}: expected FIELD=VALUE")
        try:
            out[key.strip().replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.strip().replace("-", "_")] = value
    return out


def worker_devices(flag: str | None) -> tuple[str, ...]:
    """The --devices list, each checked to be usable here (one `error:` line if not); default: every GPU, else cpu."""
    from specpilot import env
    from specpilot.control.backends.local import visible_devices

    listed = [d.strip() for d in flag.split(",") if d.strip()] if flag else visible_devices()
    for device in listed:
        env.resolve_device(device)
    return tuple(listed)


def loaded_copies(config) -> tuple[int, str]:
    """How many processes of a run hold the deployment's models at once, and which: the loop's own
    and the shared worker its knob-only comparisons run in; a pair of isolated workers when shared
    workers are off, or besides it when the coding agent may bring patched candidates
    (`control.backends.local`). A patched system the memory brings back (integration, seeds) may
    open such a pair without the coding agent: that case is not counted."""
    from specpilot.loop.agents.coding import command_template

    if not config.controller.get("shared_workers", True):
        return 3, "the loop's process and a pair of isolated workers"
    if "coding" in config.agents and command_template(config.coding_command):
        return 4, "the loop's process, its shared worker and a pair of isolated workers for a patched candidate"
    return 2, "the loop's process and its shared worker"


def run_command(args) -> int:
    from specpilot import env
    from specpilot.cli import INTERRUPTED
    from specpilot.cli.outdirs import removed_if_left_empty
    from specpilot.config import load_deployment
    from specpilot.engine.memory_check import check_memory
    from specpilot.loop.config import StopReason
    from specpilot.loop.run import RunOptions, run_loop
    from specpilot.loop.state import default_out

    if args.resume and not args.out:
        from specpilot.errors import ConfigError

        raise ConfigError("--resume continues the run in --out: name it (--out RUN_DIR)")
    check_coding_command(args.coding_command)
    devices = worker_devices(args.devices)
    config = config_from_args(args, "cuda" if devices[0].startswith("cuda") else "cpu")
    deployment = load_deployment(args.deployment)
    check_memory(deployment, devices[0], *loaded_copies(config))  # before a byte is loaded or a directory made
    env.writable_home()  # scratch, locks and worker logs go there whatever --out and --memory say
    out = args.out or str(default_out(deployment.name))
    options = RunOptions(deployment=args.deployment, out=out, resume=args.resume, memory=args.memory,
                         devices=devices, gate=args.gate, prompt_source=args.prompt_source, runner=args.runner,
                         remeasure_noise=args.remeasure_noise, quiet=args.quiet, wait_s=wait_seconds(args))
    with removed_if_left_empty(out):  # a run refused during setup leaves no empty report directory
        result = run_loop(config, options)
    print(summary(result.report))
    return INTERRUPTED if result.stop is StopReason.INTERRUPTED else 0


def summary(report: dict) -> str:
    """The result for stdout: speedups over AR, the promoted changes, where the report is."""
    from specpilot.loop.patches import PatchSummary
    from specpilot.loop.report import (
        format_gain,
        format_speedup,
        heldout_line,
        patch_rows,
    )
    from specpilot.loop.systems import describe

    final, fs = report.get("final"), report["final_system"]
    lines = [f"SpecPilot loop on {report['deployment']['name']} ({report['deployment']['device']}): "
             f"{len(report['rounds'])} round(s), stopped: {report['run']['stop']}"]
    if final:
        over = f", final / stock {format_speedup(final['final_gain'])}" if final["final_gain"] else ""
        if final.get("saturated_gain"):
            over += f" (while every slot was taken: {format_speedup(final['saturated_gain'])})"
        level = ((final.get("bench") or {}).get("levels") or [None])[0]  # a serving run has one level
        how = f"one serving run at concurrency {level['concurrency']}" if level else "one run"
        lines.append(f"  speedup over AR ({how}, 95% CI): stock {format_speedup(final['stock_speedup'])}, "
                     f"final {format_speedup(final['final_speedup'])}{over}")
        held = heldout_line(final)
        if held:
            lines.append(f"  {held}")
    lines.append(f"  final system {fs['name']!r}: {describe(fs['changes_from_stock'], fs.get('patch_summary'))}")
    for p in report["promotions"]:
        what = describe(p["changes"], p.get("patch_summary"))
        lines.append(f"  promoted in {p['round'] or '-'}: {p['name']} ({what}) "
                     f"{format_gain(p['gain'], p['gain_lower'], p['gain_upper'])}")
    for e in patch_rows(report):
        if e["verdict"] != "promote":
            lines.append(f"  patch not promoted in round {e['round']}: {e['candidate']} "
                         f"({PatchSummary.from_dict(e['patch_summary']).line()}) {e['verdict']} "
                         f"({', '.join(e['reasons'])}) {format_gain(e['gain'], e['gain_lower'], e['gain_upper'])}")
    for r, e in likely_gains(report):
        lines.append(f"  undecided in round {r}: {e['candidate']} ({describe(e['changes'], e.get('patch_summary'))}) "
                     f"{format_gain(e['gain'], e['gain_lower'], e['gain_upper'])} over {e['incumbent']}; "
                     f"{why_undecided(e)}: a later round (--resume) may time it again")
    lines += [f"  {error}" for error in report["run"].get("errors", [])]
    lines.append(f"  report: {report['run']['out']}")
    return "\n".join(lines)


def why_undecided(e: dict) -> str:
    """Why an undecided candidate was not promoted, from the controller's recorded reasons: a bound
    that cleared the bar alone but not the round's multiplicity correction (`control.multiplicity`),
    else its lower bound against the bar."""
    from specpilot.control.rule import Reason

    bound, bar = f"lower bound {e['lower_bound']:+.1%}", f"bar {e['threshold']:+.1%}"
    if Reason.NOT_SIGNIFICANT.value in e.get("reasons", ()):
        adjusted = f" (adjusted p {e['adjusted_p']:.3f})" if e.get("adjusted_p") is not None else ""
        return f"{bound} clears the {bar} alone, not after correcting for the round's other candidates{adjusted}"
    if e["lower_bound"] < e["threshold"]:
        return f"{bound} < {bar}"
    return f"{bound} >= {bar}, undecided ({', '.join(e.get('reasons', ()))})"


def likely_gains(report: dict, most: int = 3) -> list[tuple[int, dict]]:
    """(round, evaluation) of the undecided candidates whose whole interval lies above 0 (a gain the
    timing has not certified: the bar is 1% plus twice the noise), largest gain first, at most `most`."""
    found = [(r["index"], e) for r in report.get("rounds", []) for e in r.get("evaluations", [])
             if e.get("verdict") == "need-more-data" and (e.get("gain_lower") or 0) > 0
             and e.get("threshold") is not None and e.get("lower_bound") is not None]
    return sorted(found, key=lambda x: -x[1]["gain"])[:most]


def main(argv: list[str] | None = None) -> int:
    """`specpilot run` without typing `specpilot` (same parsing and error handling)."""
    from specpilot.cli import main as specpilot_main

    return specpilot_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
