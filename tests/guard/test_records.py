"""The JSONL outputs format and pairing records by prompt."""

from __future__ import annotations

import pytest

from specpilot.errors import SpecPilotError
from specpilot.guard.records import OutputRecord, match_prompts, read_records, records_from_outputs, write_records


def test_round_trip_and_no_silent_overwrite(tmp_path):
    recs = records_from_outputs([[1, 2], [3]], [[4, 5, 0], []])
    path = tmp_path / "out.jsonl"
    write_records(path, recs)
    assert read_records(path, vocab_size=6) == recs
    with pytest.raises(SpecPilotError, match="already exists"):
        write_records(path, recs)
    write_records(path, recs[:1], overwrite=True)
    assert read_records(path) == recs[:1]


@pytest.mark.parametrize("text, message", [
    ("", "no records"),
    ("not json\n", "expected"),
    ('{"prompt_ids": [1]}\n', "expected"),
    ('{"prompt_ids": [1], "output_ids": [1.5]}\n', "list of integers"),
    ('{"prompt_ids": [true], "output_ids": []}\n', "list of integers"),
    ('{"prompt_ids": [], "output_ids": [2]}\n', "empty"),
    ('{"prompt_ids": [1], "output_ids": [9]}\n', "outside the vocabulary"),
])
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(SpecPilotError, match=message):
        read_records(path, vocab_size=8)


def test_match_prompts():
    a = [(1,), (2, 3), (1,)]
    assert match_prompts(a, [(2, 3), (1,), (1,)]) == ([0, 2, 1], [1, 2, 0])
    assert match_prompts(a, [(1,), (2, 3)]) is None
    assert match_prompts(a, [(1,), (2, 3), (2, 3)]) is None
    assert records_from_outputs([[1]], [[2]]) == [OutputRecord((1,), (2,))]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_records_file_gets_the_mode_of_the_users_umask(tmp_path, umask):
    """Written through a private temporary file, the records file still gets 0o666 & ~umask."""
    import os
    import stat

    before = os.umask(umask)
    try:
        write_records(tmp_path / "out.jsonl", [OutputRecord((1, 2), (3,))])
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "out.jsonl").stat().st_mode) == 0o666 & ~umask
