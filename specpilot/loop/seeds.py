"""Seeds: what similar deployments validated, rebuilt on this one and offered first.

A run on a deployment the memory has not seen (another `max_new_tokens`, a software version bump,
another GPU) would otherwise start from stock and find again, round by round, what a similar
deployment already validated. Before the first round, for each of the `SEED_LIMIT` most similar
other deployments (`Memory.similar_deployments`, at least `MIN_SIMILARITY` alike; versions lower
the score, they do not block) that has a validated system (`Memory.best_validated`, the end of its
chain of promotions):

1. its change over *its* stock — the knob diff from the first incumbent of the chain to the best
   system, and the best system's patch — is laid over *this* deployment's stock (knobs this
   version does not have are dropped, and said so);
2. a patch must still apply: it is applied in a fresh worktree of this checkout (`git apply
   --check` first) and carried on as that worktree's diff against this checkout's baseline (so a
   later `--resume` re-applies it here). A patch that does not apply, or one where there is no git
   checkout, is left out with the reason: the knob change is still offered on its own when there
   is one, else the seed is skipped;
3. what is left is a proposal of the pseudo-agent `memory`, offered in the run's first round
   ahead of the agents' (`rounds.py`): it is guarded and timed against the incumbent like any
   candidate, never adopted untimed, and one the memory already judged here is not timed again.

Every seed, offered or skipped, is one journal line, e.g. "seeded from deployment fx-512
(similarity 0.93: same target and drafter, max_new_tokens 256 vs 512, specpilot 0.1.1 vs 0.1.0):
depth 5 -> 6 (entry 12, +4.8% over its stock)".

Owns: `Seed`, `find_seeds`. Does not own similarity (`memory.fingerprint`) or timing (controller).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from specpilot.config import System
from specpilot.control.rule import Outcome
from specpilot.errors import ConfigError
from specpilot.loop.agents.base import Proposal
from specpilot.loop.patches import summarize
from specpilot.loop.systems import Candidate, describe
from specpilot.loop.worktree import Checkout, WorktreeError, remove
from specpilot.memory.fingerprint import DeploymentFingerprint
from specpilot.memory.records import MemoryRecord, knob_diff
from specpilot.memory.store import Memory

AGENT = "memory"  # the `Proposal.agent` of a seed
SEED_LIMIT = 2  # similar deployments seeded from, most similar first
MIN_SIMILARITY = 0.7  # same target architecture at least (fingerprint.similarity's weights)


@dataclass(frozen=True)
class Seed:
    source: str  # the similar deployment's name
    digest: str  # its fingerprint digest
    similarity: float
    differences: str  # DeploymentFingerprint.differences, in words
    entry_id: int  # its best validated system's memory entry
    gain: float  # that system's compounded gain over its own stock
    proposal: Proposal | None  # None: skipped
    skipped: str = ""  # why it is not offered

    def line(self) -> str:
        head = f"deployment {self.source} (similarity {self.similarity:.2f}: {self.differences})"
        if self.proposal is None:
            return f"not seeded from {head}: {self.skipped}"
        return f"seeded from {head}: {self.proposal.rationale}"

    def to_dict(self) -> dict:
        return {"source": self.source, "digest": self.digest, "similarity": self.similarity,
                "differences": self.differences, "entry_id": self.entry_id, "gain": self.gain,
                "offered": self.proposal is not None, "skipped": self.skipped,
                "candidate": self.proposal.candidate.name if self.proposal else None,
                "hash": self.proposal.hash if self.proposal else None,
                "changes": self.proposal.details.get("changes") if self.proposal else None,
                "has_patch": bool(self.proposal and self.proposal.candidate.patch),
                "patch_summary": self.proposal.details.get("patch_summary") if self.proposal else None,
                "patch_dropped": self.proposal.details.get("patch_dropped", "") if self.proposal else ""}


def find_seeds(memory: Memory, fp: DeploymentFingerprint, stock: System, checkout: Checkout | None,
               scratch: Path, limit: int = SEED_LIMIT, min_similarity: float = MIN_SIMILARITY) -> list[Seed]:
    """Seeds from the `limit` most similar deployments with a validated system (see the docstring)."""
    out = []
    for sim, digest, other in memory.similar_deployments(fp, min_similarity):
        if len(out) == limit:
            break
        best = memory.best_validated(digest)
        if best is None:
            continue
        out.append(_seed(memory, fp, sim, digest, other, best.record, best.cumulative_gain, stock, checkout, scratch))
    return out


def _seed(memory, fp, sim, digest, other, record: MemoryRecord, gain: float, stock: System,
          checkout: Checkout | None, scratch: Path) -> Seed:
    def skip(why: str) -> Seed:
        return Seed(other.name, digest, sim, fp.differences(other), record.id, gain, None, why)

    base = stock.knobs()
    root = _root_incumbent(memory, digest, record)
    best = {k: v for k, v in record.candidate.knobs.items() if k != "name"}
    diff = knob_diff(root, best)
    unknown = sorted(k for k in diff if k not in base)
    changes = {k: new for k, (_, new) in diff.items() if k in base and base[k] != new}
    patch = record.candidate.patch
    if not changes and not patch:
        return skip("nothing to transfer (its validated change is stock here)"
                    + (f"; knobs unknown here: {', '.join(unknown)}" if unknown else ""))
    try:
        system = System.from_dict({**base, **changes}, name=f"seed-{other.name}")
    except ConfigError as err:
        return skip(f"its knobs are not valid here: {err}")
    workdir, dropped = None, ""
    if patch:
        patch, workdir, dropped = _apply(patch, checkout, scratch / f"seed-{digest[:8]}-{record.candidate.hash[:8]}-"
                                                               f"{time.time_ns()}")
        if dropped and not changes:
            return skip(dropped)
    shown = {k: [base[k], v] for k, v in changes.items()}
    summary = summarize(patch)
    what = describe(shown, summary) if shown or summary else "no knob change"
    why = (f"{what} (entry {record.id}, {gain:+.1%} over its stock)"
           + (f"; knobs unknown here dropped: {', '.join(unknown)}" if unknown else "")
           + (f"; without its patch: {dropped}" if dropped else ""))
    proposal = Proposal(AGENT, Candidate(system, patch, workdir), why, None, None,
                        {"source": other.name, "source_digest": digest, "source_entry": record.id,
                         "similarity": sim, "differences": fp.differences(other), "changes": shown,
                         "patch_summary": summary.to_dict() if summary else None, "patch_dropped": dropped})
    return Seed(other.name, digest, sim, fp.differences(other), record.id, gain, proposal)


def _apply(patch: str, checkout: Checkout | None, path: Path) -> tuple[str | None, str | None, str]:
    """(the patch as a diff against this checkout's baseline, its worktree, '') when it applies here;
    (None, None, why not) when it does not."""
    if checkout is None:
        return None, None, "it carries a code patch and this package is not a git checkout to apply it in"
    try:
        wt = checkout.create(path)
    except WorktreeError as err:
        return None, None, f"no worktree for its patch: {err}"
    if not wt.applies(patch):
        remove(checkout.root, wt.path)
        return None, None, (f"its patch no longer applies here (`git apply --check` fails on {checkout.head[:12]}, "
                            f"files {', '.join(_files(patch)[:4])})")
    try:
        wt.apply(patch)
        return wt.diff() or None, str(wt.path), ""
    except WorktreeError as err:
        remove(checkout.root, wt.path)
        return None, None, f"its patch no longer applies here: {err}"


def _root_incumbent(memory: Memory, digest: str, record: MemoryRecord) -> dict:
    """Knobs (without the name) of the first incumbent on `record`'s chain of promotions: that
    deployment's stock, when the chain starts there."""
    promoted = {}
    for r in sorted(memory.entries(deployment=digest, verdict=Outcome.PROMOTE), key=lambda r: r.id):
        if r.deployment == digest:
            promoted[r.candidate.hash] = r
    r, seen = record, {record.candidate.hash}
    while r.incumbent in promoted and r.incumbent not in seen:
        seen.add(r.incumbent)
        r = promoted[r.incumbent]
    knobs = dict(r.detail["evaluation"]["incumbent"]["system"])
    knobs.pop("name", None)
    return knobs


def _files(patch: str) -> list[str]:
    return [line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git ") and " b/" in line]
