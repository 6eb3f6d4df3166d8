"""Where a run lives and where it starts from: run directories, resuming, the incumbent's chain.

A run writes its report and its journal (`decisions.jsonl`) to one directory — by default
`$SPECPILOT_HOME/runs/loop/<UTC time>-<deployment>`, or `--out`. A directory that already holds a
run is never overwritten: it is refused, unless `--resume` asks to continue that run, in which
case its journal is appended and its round numbering continues (a round that was interrupted
before its end is run again under the same number). Worktrees, coding-agent tasks and logs go to
a scratch directory under `$SPECPILOT_HOME/scratch`, not into the report directory.

Resuming needs no state of its own: the memory is the state. The incumbent of any run — fresh or
resumed — is the best validated system for the deployment's fingerprint (`Memory.best_validated`:
the largest compounded gain over stock along its chain of promotions), with its patch re-applied
in a fresh worktree; a proposal the memory already judged is never timed again (`recall.py`). So
a run killed mid-round loses only the unfinished round's timing.

Owns: `RunPaths`, `prepare_run`, `ResumePoint`, `resume_point`, `promotion_chain`. Does not own
the memory or the journal's format.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from specpilot import env
from specpilot.config import System
from specpilot.control.rule import Outcome
from specpilot.errors import ConfigError, SpecPilotError
from specpilot.loop.journal import JOURNAL_FILE, Event, EventKind, Journal
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import Checkout, WorktreeError
from specpilot.memory.records import MemoryRecord
from specpilot.memory.store import Memory


@dataclass(frozen=True)
class RunPaths:
    out: Path  # report files and the journal
    scratch: Path  # worktrees, agent tasks and logs
    run_id: str  # the out directory's name: prefix of every round label

    @property
    def journal(self) -> Path:
        return self.out / JOURNAL_FILE


def default_out(deployment_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return env.home() / "runs" / "loop" / f"{stamp}-{deployment_name}"


def prepare_run(out: str | Path | None, deployment_name: str, resume: bool) -> RunPaths:
    """The run's directories, created; refuses to reuse one that holds files unless resuming it."""
    path = Path(out) if out else default_out(deployment_name)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} exists and is not a directory")
    holds_files = path.is_dir() and any(path.iterdir())
    if resume:
        if not (path / JOURNAL_FILE).is_file():
            raise ConfigError(f"--resume: {path} holds no loop run ({JOURNAL_FILE} is missing)")
    elif holds_files:
        raise ConfigError(f"--out {path} already holds files; pass --resume to continue the run there, "
                          "or choose another directory")
    path.mkdir(parents=True, exist_ok=True)
    path = path.resolve()
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    scratch = env.home() / "scratch" / f"{path.name}-{tag}"
    scratch.mkdir(parents=True, exist_ok=True)
    return RunPaths(path, scratch, path.name)


@dataclass(frozen=True)
class ResumePoint:
    incumbent: Incumbent
    next_round: int  # 1-based number of the next round of this run
    rounds_done: int  # completed rounds of this run before now
    previous: tuple[Event, ...]  # the journal of this run before now (empty for a fresh run)
    note: str  # one line for the log


def round_label(run_id: str, index: int) -> str:
    return f"{run_id}/r{index}"


def resume_point(paths: RunPaths, memory: Memory, digest: str, stock: System, checkout: Checkout | None,
                 resume: bool) -> ResumePoint:
    """Round numbering from the journal (when resuming); the incumbent from the memory."""
    previous = tuple(Journal.read(paths.journal)) if resume else ()
    check_memory_holds(previous, memory, paths)
    started = [e.round for e in previous if e.kind is EventKind.MEASURE]
    ended = [e.round for e in previous if e.kind is EventKind.ROUND_END]
    next_round = max(started, default=0) + 1
    if started and max(started) not in ended:
        next_round = max(started)  # that round was cut short: run it again
    best = memory.best_validated(digest)
    stock_candidate = Candidate(stock)
    if best is None:
        inc = Incumbent(stock_candidate, lineage=frozenset())
        note = "no validated system for this deployment in the memory: starting from stock"
    else:
        r = best.record
        knobs = {k: v for k, v in r.candidate.knobs.items() if k != "name"}
        system = stock.with_knobs(knobs, r.candidate.name)
        workdir = None
        if r.candidate.patch:
            if checkout is None:
                raise ConfigError(f"the best validated system {r.candidate.name!r} (memory entry {r.id}) carries a "
                                  "code patch, but this package is not a git checkout to apply it in")
            try:
                wt = checkout.create(paths.scratch / f"incumbent-{r.candidate.hash[:8]}-{int(time.time())}")
                wt.apply(r.candidate.patch)
            except WorktreeError as err:
                raise ConfigError(f"cannot re-apply the patch of the best validated system (entry {r.id}): "
                                  f"{err}") from None
            workdir = str(wt.path)
        inc = Incumbent(Candidate(system, r.candidate.patch, workdir), r.id, best.cumulative_gain, r.round)
        ancestors = [x.incumbent for x in promotion_chain(memory, digest, inc)]
        inc = Incumbent(inc.candidate, inc.entry_id, inc.cumulative_gain, inc.round,
                        frozenset(ancestors) | {stock_candidate.hash})
        note = (f"resuming from the memory: incumbent {r.candidate.name!r} (entry {r.id}, round {r.round or '-'}), "
                f"{best.cumulative_gain:+.1%} over stock along its promotions")
    return ResumePoint(inc, next_round, len(set(ended)), previous, note)


def check_memory_holds(previous, memory: Memory, paths: RunPaths) -> None:
    """ConfigError unless `memory` holds every evaluation the resumed run's journal recorded (same
    entry, same system): resumed against another memory (another $SPECPILOT_HOME, a fresh
    machine), the run would restart from stock under the old round numbers without saying so."""
    missing = []
    for e in previous:
        entry, system = e.data.get("entry_id"), e.data.get("hash")
        if e.kind is not EventKind.EVALUATION or entry is None:
            continue
        try:
            held = memory.get(entry).candidate.hash
        except SpecPilotError:
            held = None
        if held != system:
            missing.append(entry)
    if missing:
        recorded = next((e.data.get("memory") for e in reversed(previous) if e.kind is EventKind.START), None)
        where = (f"; they were written to {recorded}: pass --memory {recorded}, or import its export into this one "
                 f"(specpilot memory import)" if recorded else "")
        raise ConfigError(f"the run in {paths.out} recorded memory entries {', '.join(map(str, missing))}, which "
                          f"{memory.path} does not hold{where}")


def promotion_chain(memory: Memory, digest: str, incumbent: Incumbent) -> list[MemoryRecord]:
    """The promotions that lead from stock to `incumbent`, oldest first (empty for stock)."""
    promoted = {}
    for r in sorted(memory.entries(deployment=digest, verdict=Outcome.PROMOTE), key=lambda r: r.id):
        if r.deployment == digest:
            promoted[r.candidate.hash] = r  # a system promoted twice counts by its latest measurement
    chain, seen = [], set()
    h = incumbent.candidate.hash
    while h in promoted and h not in seen:
        seen.add(h)
        chain.append(promoted[h])
        h = promoted[h].incumbent
    return chain[::-1]

