"""The memory's tables, their version and the migrations between versions.

The schema version is SQLite's `PRAGMA user_version`; `schema_history` records when each
migration ran. A migration is a list of statements applied in one `BEGIN IMMEDIATE` transaction
together with the version bump, so a process killed half-way leaves the database at the previous
version, intact, and the next opener applies it again. Migrations only ever append: released
ones are never edited. A database newer than this code is refused, not downgraded.

Tables (JSON columns hold plain dicts written by the dataclasses' `to_dict`):

    deployments   fingerprint (digest) -> name, components (model file hashes, GPU, regime, versions)
    systems       hash -> name, knobs, patch (+ sha256), parent hash, diff against the parent
    noise_floors  stock-vs-stock noise per (deployment, procedure): value, A/A gain and interval
    evaluations   every evaluated candidate: deployment, candidate, incumbent, round, stage, verdict,
                  reasons, gain + interval, threshold, noise, p-value, blocks, guard numbers, detail
    file_hashes   sha256 cache of model files keyed by (path, size, mtime_ns)  [v2]

`noise_floors.load` and `evaluations.load` [v3]: the machine load the numbers were measured under
(`control.load.Load.to_dict`: others' CPU share, load average, other timing runs, contended); NULL
for rows stored before v3, whose load is unknown.

Owns: DDL and `migrate`. Does not own queries (`store.py`).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone

from specpilot.errors import SpecPilotError


class MemoryStoreError(SpecPilotError):
    """The memory database is unusable (not SQLite, or written by a newer SpecPilot)."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS = (
    Migration(1, "tables", (
        """CREATE TABLE schema_history (
            version INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            applied_at TEXT NOT NULL)""",
        """CREATE TABLE deployments (
            fingerprint TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            components TEXT NOT NULL,
            created_at TEXT NOT NULL)""",
        """CREATE TABLE systems (
            hash TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            knobs TEXT NOT NULL,
            patch TEXT,
            patch_sha256 TEXT,
            parent TEXT,
            diff TEXT NOT NULL,
            created_at TEXT NOT NULL)""",
        """CREATE TABLE noise_floors (
            id INTEGER PRIMARY KEY,
            deployment TEXT NOT NULL REFERENCES deployments(fingerprint),
            procedure TEXT NOT NULL,
            noise REAL NOT NULL,
            gain REAL NOT NULL,
            gain_lower REAL NOT NULL,
            gain_upper REAL NOT NULL,
            blocks INTEGER NOT NULL,
            detail TEXT NOT NULL,
            created_at TEXT NOT NULL)""",
        """CREATE TABLE evaluations (
            id INTEGER PRIMARY KEY,
            deployment TEXT NOT NULL REFERENCES deployments(fingerprint),
            candidate TEXT NOT NULL REFERENCES systems(hash),
            incumbent TEXT NOT NULL REFERENCES systems(hash),
            round TEXT NOT NULL,
            stage TEXT NOT NULL,
            verdict TEXT NOT NULL CHECK (verdict IN ('promote', 'reject', 'need-more-data')),
            reasons TEXT NOT NULL,
            gain REAL,
            gain_lower REAL,
            gain_upper REAL,
            threshold REAL,
            noise REAL,
            noise_id INTEGER REFERENCES noise_floors(id),
            p_value REAL,
            blocks INTEGER NOT NULL,
            guard_passed INTEGER,
            guard TEXT NOT NULL,
            detail TEXT NOT NULL,
            created_at TEXT NOT NULL)""",
    )),
    Migration(2, "query indexes and the model-file hash cache", (
        "CREATE INDEX evaluations_by_deployment ON evaluations(deployment, verdict, created_at)",
        "CREATE INDEX evaluations_by_candidate ON evaluations(candidate)",
        "CREATE INDEX noise_by_deployment ON noise_floors(deployment, procedure, created_at)",
        """CREATE TABLE file_hashes (
            path TEXT NOT NULL,
            size INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            PRIMARY KEY (path, size, mtime_ns))""",
    )),
    Migration(3, "the machine load of each noise floor and evaluation", (
        "ALTER TABLE noise_floors ADD COLUMN load TEXT",
        "ALTER TABLE evaluations ADD COLUMN load TEXT",
    )),
)

SCHEMA_VERSION = MIGRATIONS[-1].version


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, upto: int = SCHEMA_VERSION) -> int:
    """Bring the database to version `upto` (default: current), one transaction; returns the version."""
    conn.execute("BEGIN IMMEDIATE")  # one migrator at a time; the others wait, then find nothing to do
    try:
        current = version(conn)
        if current > SCHEMA_VERSION:
            raise MemoryStoreError(f"memory database schema version {current} is newer than this SpecPilot's "
                                   f"({SCHEMA_VERSION}); upgrade SpecPilot")
        for m in MIGRATIONS:
            if current < m.version <= upto:
                for statement in m.statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_history (version, name, applied_at) VALUES (?, ?, ?)",
                             (m.version, m.name, now()))
                conn.execute(f"PRAGMA user_version = {m.version}")
                current = m.version
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite rolls back by itself on some errors (a full disk): keep the first error
            conn.execute("ROLLBACK")
        raise
    return current
