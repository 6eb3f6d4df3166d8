"""A one-line progress bar on stderr (no tqdm dependency).

Owns drawing progress of a known number of steps with elapsed time and a linear estimate of the
time left. On a terminal the line redraws in place; otherwise (a log file, CI) it prints a plain
line at every 10% so logs stay short. Does not own what a step is (`runner.py` reports them).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


class Progress:
    """`step(label)` after each unit of work; `close()` at the end (or use as a context manager)."""

    def __init__(self, total: int, title: str = "", stream: TextIO | None = None, width: int = 24,
                 enabled: bool = True):
        self.total = max(total, 1)
        self.title = title
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = enabled
        self.done = 0
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_decile = -1

    def line(self, label: str = "") -> str:
        frac = min(self.done / self.total, 1.0)
        filled = int(round(frac * self.width))
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        eta = _clock(left) if self.done else "--:--"
        bar = "#" * filled + "." * (self.width - filled)
        head = f"{self.title} " if self.title else ""
        return f"{head}[{bar}] {self.done}/{self.total} {frac:4.0%} {_clock(elapsed)} elapsed, ~{eta} left  {label}"

    def step(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[K" + self.line(label))
            self.stream.flush()
            return
        decile = int(10 * self.done / self.total)
        if decile != self._last_decile:
            self._last_decile = decile
            self.stream.write(self.line(label) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
