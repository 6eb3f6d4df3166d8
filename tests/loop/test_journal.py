"""The journal: records written as they happen, read back, printed once; data made JSON-safe."""

import enum
import io
import json

from specpilot.loop.journal import EventKind, Journal, plain_json


class Color(enum.Enum):
    RED = "red"


def test_records_are_appended_and_read_back_and_torn_lines_are_skipped(tmp_path):
    path = tmp_path / "decisions.jsonl"
    stream = io.StringIO()
    journal = Journal(path, stream)
    journal.emit(EventKind.NOISE, "noise 1%\nsecond line", 0, noise=0.01, interval=(0.0, float("nan")))
    journal.emit(EventKind.EVALUATION, "x", 2, verdict=Color.RED)
    with open(path, "a") as f:
        f.write('{"kind": "measure", "round"')  # a kill in the middle of a write
    events = Journal.read(path)
    assert [(e.kind, e.round) for e in events] == [(EventKind.NOISE, 0), (EventKind.EVALUATION, 2)]
    assert events[0].data == {"noise": 0.01, "interval": [0.0, None]} and events[1].data["verdict"] == "red"
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("] noise 1%") and lines[1].strip() == "second line" and lines[1].startswith(" ")
    assert json.loads(path.read_text().splitlines()[0])["text"] == "noise 1%\nsecond line"
    assert Journal.read(tmp_path / "missing.jsonl") == []


def test_plain_json():
    assert plain_json({1: (float("inf"), Color.RED, [1.5])}) == {"1": [None, "red", [1.5]]}
