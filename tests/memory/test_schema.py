"""Schema version, WAL, migrations from an older database, refusal of newer or foreign files."""

import sqlite3

import pytest

from memory_fixtures import CONFIG, evaluation, fingerprint, spec
from specpilot.memory import schema
from specpilot.memory.schema import MemoryStoreError
from specpilot.memory.store import Memory


def test_fresh_database_is_current_and_in_wal_mode(tmp_path):
    with Memory(tmp_path / "sub" / "m.sqlite") as m:
        assert m.schema_version == schema.SCHEMA_VERSION
    conn = sqlite3.connect(tmp_path / "sub" / "m.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    history = conn.execute("SELECT version, name FROM schema_history ORDER BY version").fetchall()
    assert [v for v, _ in history] == [m.version for m in schema.MIGRATIONS]


def test_version_1_database_is_migrated_with_its_data(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    assert schema.migrate(conn, upto=1) == 1
    conn.execute("INSERT INTO deployments VALUES ('f', 'old', '{}', 'then')")
    conn.close()
    with Memory(path) as m:
        assert m.schema_version == schema.SCHEMA_VERSION
        assert m.export()["deployments"][0]["name"] == "old"
        m.store_hash("/x", 1, 2, "h")  # the v2 table exists
        assert m.cached_hash("/x", 1, 2) == "h" and m.cached_hash("/x", 1, 3) is None
        m.record_evaluation(fingerprint(), evaluation(spec("s", depth=6)), CONFIG)


def test_newer_database_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    Memory(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(MemoryStoreError, match="newer than this SpecPilot"):
        Memory(path)


def test_foreign_file_is_refused_with_one_line(tmp_path):
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(MemoryStoreError, match="not a usable SpecPilot memory database"):
        Memory(path)
