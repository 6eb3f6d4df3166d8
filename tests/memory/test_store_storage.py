"""A memory database that cannot be written — read-only, on a full disk, or not openable — is one
`StorageError` naming it; the failed write stores nothing, and every record stored before stays."""

import sqlite3

import pytest

from memory_fixtures import CONFIG, evaluation, fingerprint, noise_floor, spec
from specpilot.errors import StorageError
from specpilot.memory.store import Memory


@pytest.fixture
def memory(tmp_path):
    with Memory(tmp_path / "m.sqlite") as m:
        yield m


def test_a_read_only_database_is_named(memory):
    fp = fingerprint()
    memory.record_noise(fp, noise_floor())
    memory._conn.execute("PRAGMA query_only = ON")  # SQLite's read-only: what a read-only file or mount gives
    with pytest.raises(StorageError, match=f"cannot write the memory database {memory.path}: attempt to write a "
                                           "readonly database; make it writable"):
        memory.record_evaluation(fp, evaluation(spec("deeper", depth=8)), CONFIG)
    assert len(memory.noise_floors(fp.digest, noise_floor().procedure)) == 1 and memory.entries() == []


def test_a_full_disk_loses_nothing_stored_before(memory):
    """The database may not grow past its pages (SQLite's full disk): the write that needs one more is
    refused whole, the records before it stay, and the connection works again once there is room."""
    fp = fingerprint()
    noise_id = memory.record_noise(fp, noise_floor())
    first = memory.record_evaluation(fp, evaluation(spec("c0", depth=2)), CONFIG)
    pages = memory._conn.execute("PRAGMA page_count").fetchone()[0]
    memory._conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StorageError, match="database or disk is full; free some space there"):
        for depth in range(3, 40):
            memory.record_evaluation(fp, evaluation(spec(f"c{depth}", depth=depth)), CONFIG)
    kept = [r.id for r in memory.entries()]
    assert kept[-1] == first and memory.noise_floor(fp.digest, noise_floor().procedure)[0] == noise_id
    memory._conn.execute("PRAGMA max_page_count = 1000000")
    later = memory.record_evaluation(fp, evaluation(spec("later", depth=99)), CONFIG)
    assert [r.id for r in memory.entries()] == [later, *kept]


def test_a_database_that_cannot_be_opened_is_named(tmp_path, monkeypatch):
    def connect(*args, **kwargs):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(sqlite3, "connect", connect)
    with pytest.raises(StorageError, match=f"cannot write the memory database {tmp_path / 'm.sqlite'}: unable to"):
        Memory(tmp_path / "m.sqlite")

