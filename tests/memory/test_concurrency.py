"""Several processes: persistence, concurrent writers, and writers killed (SIGKILL) mid-transaction."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from memory_fixtures import CONFIG, evaluation, fingerprint, spec
from specpilot.memory import schema
from specpilot.memory.store import Memory

HERE = Path(__file__).resolve().parent


def python(code: str, *args, wait=True):
    prelude = f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
    cmd = [sys.executable, "-c", prelude + textwrap.dedent(code), *map(str, args)]
    if wait:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


WRITER = """
    from memory_fixtures import CONFIG, evaluation, fingerprint, spec
    from specpilot.memory.store import Memory
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Memory(path) as m:
        for i in range(n):
            m.record_evaluation(fingerprint(), evaluation(spec(f"{tag}-{i}", variant=f"{tag}-{i}"), passed=False),
                                CONFIG, round=tag)
"""


def integrity(path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_entries_persist_across_processes(tmp_path):
    path = tmp_path / "m.sqlite"
    r = python(WRITER, path, "child", 3)
    assert r.returncode == 0, r.stderr
    with Memory(path) as m:
        assert sorted(x.candidate.name for x in m.entries()) == ["child-0", "child-1", "child-2"]
        m.record_evaluation(fingerprint(), evaluation(spec("parent", depth=9)), CONFIG)
    r = python("""
        from specpilot.memory.store import Memory
        with Memory(sys.argv[1]) as m:
            print(len(m.entries()), m.entries()[0].candidate.name)
    """, path)
    assert r.stdout.split() == ["4", "parent"]


def test_concurrent_writers_interleave_whole_records(tmp_path):
    path = tmp_path / "m.sqlite"
    Memory(path).close()
    procs = [python(WRITER, path, f"w{k}", 12, wait=False) for k in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with Memory(path) as m:
        entries = m.entries()
        assert len(entries) == 48 and len({e.id for e in entries}) == 48
        assert {e.round for e in entries} == {"w0", "w1", "w2", "w3"}
        assert len(m.export()["systems"]) == 49  # 48 candidates + the shared incumbent
    assert integrity(path) == "ok"


def test_writer_killed_inside_a_transaction_leaves_nothing(tmp_path):
    path = tmp_path / "m.sqlite"
    with Memory(path) as m:
        m.record_evaluation(fingerprint(), evaluation(spec("before", depth=2)), CONFIG)
    r = python("""
        import os, signal
        from memory_fixtures import CONFIG, evaluation, fingerprint, spec
        from specpilot.memory.store import Memory
        m = Memory(sys.argv[1])
        with m.transaction() as c:
            for i in range(50):
                c.execute("INSERT INTO deployments VALUES (?, 'half', '{}', 'now')", (f"partial{i}",))
            c.execute("INSERT INTO systems VALUES ('h', 'half', '{}', NULL, NULL, NULL, '{}', 'now')")
            os.kill(os.getpid(), signal.SIGKILL)
    """, path)
    assert r.returncode == -signal.SIGKILL
    assert integrity(path) == "ok"
    with Memory(path) as m:
        data = m.export()
        assert [d["name"] for d in data["deployments"]] == ["fx"] and len(data["systems"]) == 2
        m.record_evaluation(fingerprint(), evaluation(spec("after", depth=3)), CONFIG)
        assert [e.candidate.name for e in m.entries()] == ["after", "before"]


def test_killed_lock_holder_releases_waiting_writers(tmp_path):
    """A writer SIGKILLed while holding the write lock does not wedge the others."""
    path = tmp_path / "m.sqlite"
    Memory(path).close()
    holder = python("""
        import time
        from specpilot.memory.store import Memory
        m = Memory(sys.argv[1])
        with m.transaction() as c:
            c.execute("INSERT INTO deployments VALUES ('held', 'held', '{}', 'now')")
            print("holding", flush=True)
            time.sleep(60)
    """, path, wait=False)
    assert holder.stdout.readline().strip() == "holding"
    waiter = python(WRITER, path, "waiter", 1, wait=False)
    time.sleep(0.5)
    assert waiter.poll() is None  # blocked on the lock
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    with Memory(path) as m:
        assert [e.candidate.name for e in m.entries()] == ["waiter-0"]
        assert [d["fingerprint"] for d in m.export()["deployments"]] == [fingerprint().digest]


def test_migration_killed_half_way_is_redone(tmp_path):
    path = tmp_path / "m.sqlite"
    r = python("""
        import os, signal, sqlite3
        from specpilot.memory import schema
        conn = sqlite3.connect(sys.argv[1], isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in schema.MIGRATIONS[0].statements[:3]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        os.kill(os.getpid(), signal.SIGKILL)
    """, path)
    assert r.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] == 0
    conn.close()
    with Memory(path) as m:
        assert m.schema_version == schema.SCHEMA_VERSION
        m.record_evaluation(fingerprint(), evaluation(spec("s", depth=6)), CONFIG)
    assert integrity(path) == "ok"
