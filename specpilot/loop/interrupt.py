"""Ctrl-C during a loop run, acknowledged at once.

A Ctrl-C stops a run by the KeyboardInterrupt Python raises in the main thread; the run then winds
down what is under way (a round's threads finish their requests, workers close) before it says
so in the journal, which can take seconds. `acknowledged_interrupts` says it at once: the first
Ctrl-C prints one line, then raises KeyboardInterrupt exactly as Python's own handler does, so
what the run does with it is unchanged.

Owns: the acknowledgement and its line. Does not own stopping (`run.py`).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

INTERRUPT_LINE = ("Ctrl-C: stopping; the work under way winds down and the report is written "
                  "(this can take several seconds)")


@contextmanager
def acknowledged_interrupts(say: Callable[[str], None], line: str = INTERRUPT_LINE) -> Iterator[None]:
    """While the block runs, the first Ctrl-C calls `say(line)` at once, then raises
    KeyboardInterrupt as Python's own handler does (every Ctrl-C raises it: what the block does
    with it is unchanged). Only where Python's handler is SIGINT's, in the main thread: an
    ignored or custom handler is left alone. The previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    said = []

    def handler(signum, frame):
        if not said:
            said.append(True)
            try:
                say(line)
            except Exception:  # e.g. the stream was mid-write when the signal came: the stop matters more
                pass
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
