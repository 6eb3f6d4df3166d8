"""Stands in for a coding-agent CLI (Claude Code, Codex, aider) in the loop's tests.

    python coding_stand_in.py MODE TASK_FILE        (run by the coding agent in its worktree)

It checks it was given the task (as a file and on stdin), then edits the worktree it runs in:

    note      appends a comment to pkg/a.py (a harmless change, for the agent's own tests)
    fault     makes verification trust the drafter: every node's "target token" becomes its first
              child's, so the drafter's greedy path is always accepted — the classic speculative-
              decoding reward hack, fast and lossy; the guard must reject it
    nothing   changes nothing
"""

import sys
from pathlib import Path

FAULT = '''

# "optimisation" by a coding agent: trust the drafter's first child at every node (lossy on purpose)
_checked_greedy_accept = greedy_accept


def greedy_accept(tree, target_argmax, accept_unverified=False):
    trusted = target_argmax.clone()
    for j in range(tree.num_nodes - 1, 0, -1):  # the first child of a node writes last: it wins
        trusted.scatter_(1, tree.parents[:, j : j + 1], tree.tokens[:, j : j + 1])
    return _checked_greedy_accept(tree, trusted, accept_unverified)
'''


def main(mode: str, task_file: str) -> int:
    task = Path(task_file).read_text()
    assert task.startswith("# SpecPilot coding task") and sys.stdin.read() == task
    if mode == "note":
        path = Path("pkg/a.py")
        path.write_text(path.read_text() + "# faster now\n")
    elif mode == "fault":
        path = Path("specpilot/engine/verify.py")
        path.write_text(path.read_text() + FAULT)
    print(f"stand-in: {mode} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
