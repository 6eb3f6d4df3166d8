"""The loop's journal: every decision as a structured record (JSON lines) and one human line.

Each record is an `Event`: its kind, the round, seconds since the run started, a UTC timestamp,
its numbers (plain JSON data built from the dataclasses' `to_dict`, never parsed back from text),
and the human line that was printed for it. `decisions.jsonl` in the run directory holds them in
order, one per line, flushed and fsynced as they happen, so a killed run keeps every decision it
took; `--resume` appends to the same file.

Owns: `EventKind`, `Event`, `Journal` (write, read back, print). Does not own what is decided, nor
what each record says (`reporter.py`).
"""

from __future__ import annotations

import enum
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

JOURNAL_FILE = "decisions.jsonl"


class EventKind(enum.Enum):
    START = "start"  # the run's settings, deployment, device, and where it resumed from
    AGENT = "agent"  # an agent is on or off, and why (once per run)
    NOISE = "noise"  # the stock-vs-stock noise floor: measured, or reused from the memory
    SEED = "seed"  # a system validated on a similar deployment, offered here (or why it is not)
    MEASURE = "measure"  # the incumbent's cost table (ceiling, gaps)
    SLOTS = "slots"  # how the round's candidate slots are split over the agents, by gap
    PROPOSALS = "proposals"  # what each agent proposed, or how it failed
    REUSED = "reused"  # a proposal the memory already judged: not timed again, its verdict reused
    SELECTED = "selected"  # the candidates the round times
    EVALUATION = "evaluation"  # one candidate's verdict with every number behind it
    PROMOTION = "promotion"  # a new incumbent
    ROUND_END = "round-end"
    STOP = "stop"  # why the loop stopped
    FINAL = "final"  # stock and final system against AR, measured in one run
    REPORT = "report"  # files written


@dataclass(frozen=True)
class Event:
    kind: EventKind
    round: int  # 0 outside rounds
    seconds: float  # since the run (or this resumed part of it) started
    at: str  # UTC, ISO 8601
    text: str  # the human line
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "round": self.round, "seconds": round(self.seconds, 3), "at": self.at,
                "text": self.text, **self.data}

    @classmethod
    def from_dict(cls, d: dict) -> Event:
        d = dict(d)
        kind, rnd, sec, at, text = (d.pop(k) for k in ("kind", "round", "seconds", "at", "text"))
        return cls(EventKind(kind), rnd, sec, at, text, d)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


class Journal:
    """Appends events to `path` (if given) and prints their human lines to `stream`."""

    def __init__(self, path: Path | None, stream: TextIO | None = None, quiet: bool = False):
        self.path = path
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.start = time.monotonic()
        self.events: list[Event] = []
        self._lock = threading.RLock()  # agents' and sessions' threads print too

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def emit(self, kind: EventKind, text: str, round: int = 0, **data) -> Event:
        event = Event(kind, round, self.elapsed(), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      text, plain_json(data))
        with self._lock:
            self.events.append(event)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(event.to_dict(), allow_nan=False) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            self.say(text)
        return event

    def say(self, text: str) -> None:
        """A human line without a record (progress)."""
        if self.quiet:
            return
        prefix = f"[{_clock(self.elapsed())}] "
        pad = " " * len(prefix)
        lines = text.splitlines() or [""]
        with self._lock:
            self.stream.write(prefix + lines[0] + "\n" + "".join(pad + line + "\n" for line in lines[1:]))
            self.stream.flush()

    def acknowledge(self, text: str) -> None:
        """A line answering the user (Ctrl-C), printed even when quiet: unprefixed then."""
        if not self.quiet:
            self.say(text)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def of(self, kind: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]

    @staticmethod
    def read(path: Path) -> list[Event]:
        """The events of an earlier run (a torn last line, from a kill mid-write, is skipped)."""
        out = []
        if not path.is_file():
            return out
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(Event.from_dict(json.loads(line)))
            except (ValueError, KeyError):
                continue
        return out


def plain_json(obj):
    """JSON-safe data: NaN and infinities become null, tuples lists, enums their values."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj
