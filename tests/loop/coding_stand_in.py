"""Stands in for a coding-agent CLI (Claude Code, Codex, aider) in the loop's tests.

    python coding_stand_in.py MODE TASK_FILE        (run by the coding agent in its worktree)

It checks it was given its brief (as a file, on stdin, and in SPECPILOT_TASK_FILE), then edits
the worktree it runs in:

    note        appends a comment to pkg/a.py (a harmless change, for the agent's own tests)
    fault       makes verification trust the drafter: every node's "target token" becomes its first
                child's, so the drafter's greedy path is always accepted — the classic speculative-
                decoding reward hack, fast and lossy; the guard must reject it
    nothing     changes nothing
    rendezvous  waits (up to 30 s) until every agent of the round (SPECPILOT_AGENTS) has started,
                then appends its own line to pkg/a.py; run one after another instead of at once,
                the first one gives up and changes nothing
    speedup     a real speedup: removes the sleep of the engine's `delay` fault (the deliberate
                slowdown of the test deployment's stock) from specpilot/engine/faults.py; nothing
                when it is gone already (the patch is in the worktree). Agent 2 of a round writes
                the lossy `fault` patch instead, unless its brief shows the guard rejected it before.
"""

import os
import sys
import time
from pathlib import Path

FAULT = '''

# "optimisation" by a coding agent: trust the drafter's first child at every node (lossy on purpose)
_checked_greedy_accept = greedy_accept


def greedy_accept(tree, target_argmax, accept_unverified=False, forced=None):
    trusted = target_argmax.clone()
    for j in range(tree.num_nodes - 1, 0, -1):  # the first child of a node writes last: it wins
        trusted.scatter_(1, tree.parents[:, j : j + 1], tree.tokens[:, j : j + 1])
    return _checked_greedy_accept(tree, trusted, accept_unverified, forced)
'''
SLEEP = "        time.sleep(fault.value / 1e3)\n"
NO_SLEEP = "        pass  # the sleep bought nothing: removed by a coding agent\n"


def fault() -> None:
    path = Path("specpilot/engine/verify.py")
    path.write_text(path.read_text() + FAULT)


def rendezvous(task_file: str) -> None:
    me, n = os.environ["SPECPILOT_AGENT"], int(os.environ["SPECPILOT_AGENTS"])
    here = Path(task_file).parent
    (here / f"started-{me}").write_text("")
    deadline = time.monotonic() + 30
    while len(list(here.glob("started-*"))) < n:
        if time.monotonic() > deadline:
            print("stand-in: the other agents never started: giving up")
            return
        time.sleep(0.05)
    path = Path("pkg/a.py")
    path.write_text(path.read_text() + f"# agent {me} on {os.environ['SPECPILOT_GAP']}\n")


def speedup(task: str) -> None:
    if os.environ["SPECPILOT_AGENT"] == "2":
        if "guard-failed" in task and "greedy_accept" in task:
            print("stand-in: the brief says the guard rejected the fault patch: nothing")
            return
        fault()
        return
    path = Path("specpilot/engine/faults.py")
    text = path.read_text()
    if SLEEP not in text:
        print("stand-in: the delay is gone already")
        return
    path.write_text(text.replace(SLEEP, NO_SLEEP))


def main(mode: str, task_file: str) -> int:
    task = Path(task_file).read_text()
    assert task.startswith("# SpecPilot coding task") and sys.stdin.read() == task
    assert os.environ["SPECPILOT_TASK_FILE"] == task_file
    assert Path(os.environ["SPECPILOT_WORKDIR"]).resolve() == Path.cwd().resolve()
    if mode == "note":
        path = Path("pkg/a.py")
        path.write_text(path.read_text() + "# faster now\n")
    elif mode == "fault":
        fault()
    elif mode == "rendezvous":
        rendezvous(task_file)
    elif mode == "speedup":
        speedup(task)
    print(f"stand-in: {mode} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
