"""What the loop remembers at the start of a round: a read-only snapshot of the memory.

Agents run in parallel threads and must agree on what has been tried, so each round takes one
snapshot of the memory (`Recall`) instead of letting every agent query the database:

- `evaluations`: every evaluation of this deployment (fingerprint), newest first;
- `similar`: promoted entries of other deployments, most similar deployment first (what to try
  first here, `Memory.similar_validated`);
- `verdict(hash)`: the latest evaluation of a system when it is final — the loop reuses it
  instead of timing the same system again. Not final (`unsettled`): a need-more-data verdict, or
  one timed under contention (another timing run, `control.timing_lock`) unless the candidate was
  disqualified (guard, outputs, a failing worker: no timing involved). Such a system is timed
  again, up to `MAX_RETIMES` more times; after that its latest verdict stands;
- `undecided_against(system, incumbent)`: this system's undecided verdicts against that incumbent
  (need more data with the budget spent, `Reason.UNDECIDED`). Each makes its next retime against
  the same incumbent more powerful (`retime_factor`: twice the blocks at every look after one,
  four times after two), since a retime with the same power would likely end undecided again;
- `promotable_changes(...)`: changes measured as gains on some incumbent (promoted, significant
  but not selected, or positive but below the bar), the integration agent's material;
- `slower_changes(...)`: knob changes last measured as clear losses on some incumbent, which the
  knob agent's exploratory moves do not repeat on the next one;
- `parent_patch(record)`: the patch of the incumbent a record's candidate was measured against, so
  what a patch added over it can be shown (`patches.py`: the coding agents' briefs).

Owns: the snapshot and its queries. Does not own writing (`specpilot.memory.store`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.control.rule import DISQUALIFYING, Outcome, Reason
from specpilot.memory.fingerprint import DeploymentFingerprint
from specpilot.memory.records import MemoryRecord
from specpilot.memory.store import Memory

MAX_RETIMES = 2  # a system whose verdicts stay unsettled is timed at most 1 + this many times
MAX_POWER = 4  # the largest factor a retime multiplies the blocks by (`retime_factor`)


def retime_factor(undecided: int) -> int:
    """The blocks factor of a timing after `undecided` undecided verdicts against the same incumbent
    (`Recall.undecided_against`): 1, 2, then 4 (`MAX_POWER`)."""
    return min(2 ** max(undecided, 0), MAX_POWER)


def unsettled(record: MemoryRecord) -> str | None:
    """Why an evaluation is not a final verdict on its system, or None when it is."""
    if DISQUALIFYING & set(record.reasons):
        return None
    if record.verdict is Outcome.NEED_MORE_DATA:
        return "need more data"
    if record.contended:
        return "timed under contention"
    return None


def change_key(changes: dict) -> frozenset:
    """A knob change set (knob -> new value, JSON values) as a hashable key (lists as tuples)."""
    return frozenset((k, tuple(v) if isinstance(v, list) else v) for k, v in changes.items())


@dataclass(frozen=True)
class Recall:
    deployment: str  # fingerprint digest
    evaluations: tuple[MemoryRecord, ...]  # this deployment, newest first
    similar: tuple[tuple[float, MemoryRecord], ...]  # other deployments' promoted entries
    patches: dict = field(default_factory=dict, compare=False)  # system hash -> patch, for incumbents

    @classmethod
    def snapshot(cls, memory: Memory, fp: DeploymentFingerprint, similar_limit: int = 20) -> Recall:
        own = tuple(r for r in memory.entries(deployment=fp.digest) if r.deployment == fp.digest)
        similar = tuple(memory.similar_validated(fp, limit=similar_limit))
        patches = {r.candidate.hash: r.candidate.patch for r in own}
        for r in (*own, *(r for _, r in similar)):
            if r.incumbent not in patches:
                stored = memory.system(r.incumbent)
                patches[r.incumbent] = stored.patch if stored is not None else None
        return cls(fp.digest, own, similar, patches)

    def parent_patch(self, record: MemoryRecord) -> str | None:
        """The patch of the incumbent `record`'s candidate was measured against (None: none, or unknown)."""
        return self.patches.get(record.incumbent)

    def verdict(self, system_hash: str) -> MemoryRecord | None:
        """The latest evaluation of this system on this deployment when it is final; None (time it
        again) when there is none, or the latest is unsettled and the system has been timed no more
        than `MAX_RETIMES` times so far."""
        mine = [r for r in self.evaluations if r.candidate.hash == system_hash]
        if not mine or (unsettled(mine[0]) and len(mine) <= MAX_RETIMES):
            return None
        return mine[0]

    def undecided_against(self, system_hash: str, incumbent_hash: str) -> tuple[MemoryRecord, ...]:
        """This deployment's evaluations of the system against that incumbent that ended undecided
        (need more data, `Reason.UNDECIDED`; not void by contamination, not disqualified), newest first."""
        return tuple(r for r in self.evaluations
                     if r.candidate.hash == system_hash and r.incumbent == incumbent_hash
                     and r.verdict is Outcome.NEED_MORE_DATA and Reason.UNDECIDED in r.reasons
                     and not DISQUALIFYING & set(r.reasons))

    @property
    def known(self) -> frozenset[str]:
        return frozenset(r.candidate.hash for r in self.evaluations)

    def slower_changes(self, below: float) -> dict[frozenset, MemoryRecord]:
        """Knob changes (no patch) whose latest measurement on some incumbent of this deployment was
        a loss of at least `below` (gain <= -below), keyed by change set (knob -> new value); changes
        measured only as gains, or never timed, are absent."""
        latest: dict[frozenset, MemoryRecord] = {}
        for r in self.evaluations:  # newest first
            if r.candidate.patch or not r.candidate.diff:
                continue
            key = change_key({k: new for k, (_, new) in r.candidate.diff.items()})
            latest.setdefault(key, r)
        return {k: r for k, r in latest.items() if r.gain is not None and r.gain <= -below}

    def promoted(self) -> tuple[MemoryRecord, ...]:
        return tuple(r for r in self.evaluations if r.verdict is Outcome.PROMOTE)

    def promotable_changes(self, min_gain: float = 0.0) -> list[MemoryRecord]:
        """Evaluations whose candidate beat its incumbent by more than `min_gain` (point estimate)
        and was not disqualified; for each system only its latest evaluation. Largest gain first."""
        seen, out = set(), []
        for r in self.evaluations:
            if r.candidate.hash in seen:
                continue
            seen.add(r.candidate.hash)
            if r.gain is None or r.gain <= min_gain or DISQUALIFYING & set(r.reasons):
                continue
            if r.guard_passed is False:
                continue
            out.append(r)
        out.sort(key=lambda r: (-r.gain, r.id))
        return out
