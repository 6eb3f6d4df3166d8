"""Live progress of the controller's work, without touching the controller.

The controller runs a round as one call (`Controller.evaluate_round`) and reports nothing until it
returns. `ObservedBackend` wraps the evaluation backend: every worker pair it opens is wrapped
in turn, so the loop sees workers come up, the guard's outputs being generated and timed blocks
go by, and prints a short line for each (`Journal.say`, not a record: the numbers that decide
arrive as `EVALUATION` records). Every call is passed through unchanged; the wrapper adds no work
inside a timed span (the line is printed after a block returns, never between its requests).

Owns: `ObservedBackend`, `ObservedSession`. Does not own sessions or timing.
"""

from __future__ import annotations

import itertools
import math
import threading
import time

from specpilot.loop.journal import Journal


class ObservedSession:
    def __init__(self, inner, label: str, journal: Journal, blocks_expected: int):
        self._inner = inner
        self._label = label
        self._journal = journal
        self._blocks = 0
        self._expected = blocks_expected
        self._every = max(1, math.ceil(blocks_expected / 3))
        self._gate_said = False

    def generate(self, arm, prompts, max_new_tokens, **seeds):
        out = self._inner.generate(arm, prompts, max_new_tokens, **seeds)  # `seeds=` only under a sampled regime
        if not self._gate_said and arm.name == "INCUMBENT":
            self._gate_said = True
            self._journal.say(f"  {self._label}: guard outputs generated ({len(prompts)} prompts), judging")
        return out

    def run_block(self, plan):
        result = self._inner.run_block(plan)
        self._blocks += 1
        if self._blocks % self._every == 0:
            self._journal.say(f"  {self._label}: {self._blocks} paired blocks timed (first look at {self._expected})")
        return result

    def close(self) -> None:
        self._inner.close()


class ObservedBackend:
    """Passes everything to `inner`; prints a line as each session's work goes by."""

    def __init__(self, inner, journal: Journal):
        self.inner = inner
        self.journal = journal
        self.name = inner.name
        self.placement = inner.placement
        self.parallelism = inner.parallelism
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open(self, incumbent, candidate, config, warmup=()):
        with self._lock:
            n = next(self._ids)
        same = incumbent.fingerprint() == candidate.fingerprint()
        label = f"[{n}] {candidate.name}" + (" (noise: stock vs stock)" if same else "")
        start = time.monotonic()
        session = self.inner.open(incumbent, candidate, config, warmup)
        self.journal.say(f"  {label}: workers up in {time.monotonic() - start:.1f} s")
        return ObservedSession(session, label, self.journal, config.blocks + config.warmup_blocks)

    def device_name(self) -> str:
        return self.inner.device_name()

    def close(self) -> None:
        self.inner.close()
