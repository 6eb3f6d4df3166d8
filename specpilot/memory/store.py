"""`Memory`: the SQLite database of every evaluated candidate, and its queries.

Durability and concurrency: WAL journal, `synchronous = FULL`, foreign keys on, a 30 s busy
timeout. Every write is one `BEGIN IMMEDIATE ... COMMIT` transaction (writers queue on the
database lock instead of failing), so concurrent writers from many processes interleave whole
records, and a writer killed mid-transaction (even by SIGKILL) leaves nothing behind: SQLite
discards the uncommitted WAL frames on the next open. One connection per `Memory`, shared
across threads behind a lock.

A database that cannot be written (a read-only file or directory, a full disk) is a one-line
`StorageError` naming it, on opening or on the write that meets it; the failed transaction is
rolled back, and every record stored before it stays.

Queries: `entries` (filtered list), `get`, `system` (a stored system by hash, patch included),
`deployments` (every stored deployment with its counts), `noise_floor` (latest for a deployment + procedure),
`noise_floors` (the recent ones, with the load each was measured under), `best_validated`
(largest estimated gain over stock along the chain of promotions), `similar_deployments` (other
deployments by similarity), `similar_validated` (promoted entries of other deployments, most
similar first — what to try first on a new deployment),
`export` (everything as plain JSON data) and `import_export` (merge such a document, another
machine's, into this one). Promotions timed under contention (another timing run,
see `control.timing_lock`) count for neither `best_validated` nor `similar_validated`.

Owns: connections, transactions and SQL. Does not own the schema's text (`schema.py`) or what a
fingerprint contains (`fingerprint.py`).
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

from specpilot.control.config import ControllerConfig, Stage
from specpilot.control.controller import Evaluation
from specpilot.control.load import Load
from specpilot.control.rule import Reason, Outcome
from specpilot.control.stats import NoiseFloor
from specpilot.errors import SpecPilotError, storage_error, writing
from specpilot.memory import schema
from specpilot.memory.fingerprint import DeploymentFingerprint
from specpilot.memory.records import (MemoryRecord, StoredNoise, SystemRecord, Validated, knob_diff, patch_sha256,
                                      system_hash)
from specpilot.memory.schema import MemoryStoreError, now

# the tables an export holds, in the order an import stores them (what an evaluation names first),
# and their JSON columns
JSON_COLUMNS = {"deployments": ("components",), "systems": ("knobs", "diff"), "noise_floors": ("detail", "load"),
                "evaluations": ("reasons", "guard", "detail", "load")}


WHAT = "the memory database"  # how a `StorageError` names the file


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) and migrate the database at `path`."""
    with writing(path, WHAT):
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        schema.migrate(conn)
    except sqlite3.DatabaseError as err:
        conn.close()
        unwritable = storage_error(err, path, WHAT)
        raise unwritable or MemoryStoreError(f"{path}: not a usable SpecPilot memory database ({err})") from None
    except BaseException:
        conn.close()
        raise
    return conn


class Memory:
    def __init__(self, path: str | Path | None = None):
        if path is None:
            from specpilot import env

            path = env.memory_path()
        self.path = Path(path)
        self._conn = connect(self.path)
        self._lock = threading.RLock()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def schema_version(self) -> int:
        return schema.version(self._conn)

    @contextmanager
    def transaction(self):
        """One write transaction (BEGIN IMMEDIATE): all of it is stored, or none of it (a failed
        COMMIT included); an unwritable or full database is a `StorageError`."""
        with self._lock, writing(self.path, WHAT):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # SQLite may have rolled back already (a full disk)
                    self._conn.execute("ROLLBACK")
                raise

    def _rows(self, sql: str, args=()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._conn.execute(sql, args)
            names = [c[0] for c in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    # ---- the model-file hash cache (fingerprint.HashCache) ------------------------------------
    def cached_hash(self, path: str, size: int, mtime_ns: int) -> str | None:
        rows = self._rows("SELECT sha256 FROM file_hashes WHERE path = ? AND size = ? AND mtime_ns = ?",
                          (path, size, mtime_ns))
        return rows[0]["sha256"] if rows else None

    def store_hash(self, path: str, size: int, mtime_ns: int, sha256: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO file_hashes VALUES (?, ?, ?, ?)", (path, size, mtime_ns, sha256))

    # ---- writes --------------------------------------------------------------------------------
    def _deployment(self, c, fp: DeploymentFingerprint) -> str:
        c.execute("INSERT OR IGNORE INTO deployments VALUES (?, ?, ?, ?)",
                  (fp.digest, fp.name, json.dumps(fp.to_dict(), sort_keys=True), now()))
        return fp.digest

    def _system(self, c, knobs: dict, patch: str | None, parent: dict | None, parent_hash: str | None) -> str:
        h = system_hash(knobs, patch)
        diff = knob_diff(parent, knobs) if parent is not None else {}
        c.execute("INSERT OR IGNORE INTO systems VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                  (h, str(knobs.get("name", "unnamed")), json.dumps(knobs, sort_keys=True), patch,
                   patch_sha256(patch), parent_hash, json.dumps(diff, sort_keys=True), now()))
        return h

    def record_noise(self, fp: DeploymentFingerprint, noise: NoiseFloor, load: Load | None = None) -> int:
        """Store a noise floor with the machine load it was measured under; returns its id."""
        e = noise.estimate
        with self.transaction() as c:
            self._deployment(c, fp)
            cur = c.execute(
                "INSERT INTO noise_floors (deployment, procedure, noise, gain, gain_lower, gain_upper, blocks, detail, "
                "created_at, load) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (fp.digest, noise.procedure, noise.value, e.gain, e.lower, e.upper, e.n,
                 json.dumps(noise.to_dict()), now(), _load_json(load)))
            return cur.lastrowid

    def record_evaluation(self, fp: DeploymentFingerprint, evaluation: Evaluation, config: ControllerConfig, *,
                          round: str = "", patch: str | None = None, incumbent_patch: str | None = None,
                          noise_id: int | None = None, commit: str = "", load: Load | None = None) -> int:
        """Store one evaluation (with its deployment, both systems and the load it was timed under)
        atomically; returns its id."""
        e, d = evaluation, evaluation.decision
        est = e.estimate
        detail = {"evaluation": e.to_dict(), "config": config.to_dict(), "commit": commit, "host": socket.gethostname()}
        with self.transaction() as c:
            self._deployment(c, fp)
            inc = self._system(c, e.incumbent.system, incumbent_patch, None, None)
            cand = self._system(c, e.candidate.system, patch, e.incumbent.system, inc)
            cur = c.execute(
                "INSERT INTO evaluations (deployment, candidate, incumbent, round, stage, verdict, reasons, gain, "
                "gain_lower, gain_upper, threshold, noise, noise_id, p_value, blocks, guard_passed, guard, detail, "
                "created_at, load) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (fp.digest, cand, inc, round, e.stage.value, d.verdict.value, json.dumps([r.value for r in d.reasons]),
                 est.gain if est else None, est.lower if est else None, est.upper if est else None,
                 d.threshold, e.noise.value if e.noise else None, noise_id, d.p_value, est.n if est else 0,
                 None if e.gate is None else int(e.gate.passed), json.dumps(e.gate.to_dict() if e.gate else {}),
                 json.dumps(detail), now(), _load_json(load)))
            return cur.lastrowid

    def tag_load(self, entry_ids: list[int], load: Load) -> None:
        """Give evaluations stored without a load (a loop round's, stored as they were decided) the
        load of the window they were timed in; entries that have one keep it."""
        with self.transaction() as c:
            c.executemany("UPDATE evaluations SET load = ? WHERE id = ? AND load IS NULL",
                          [(_load_json(load), i) for i in entry_ids])

    # ---- reads ---------------------------------------------------------------------------------
    _SELECT = ("SELECT e.*, d.name AS deployment_name, s.name AS s_name, s.knobs AS s_knobs, s.patch AS s_patch, "
               "s.parent AS s_parent, s.diff AS s_diff, s.created_at AS s_created_at FROM evaluations e "
               "JOIN deployments d ON d.fingerprint = e.deployment JOIN systems s ON s.hash = e.candidate")

    @staticmethod
    def _record(row: dict) -> MemoryRecord:
        system = SystemRecord(row["candidate"], row["s_name"], json.loads(row["s_knobs"]), row["s_patch"],
                              row["s_parent"], json.loads(row["s_diff"]), row["s_created_at"])
        return MemoryRecord(
            id=row["id"], deployment=row["deployment"], deployment_name=row["deployment_name"], candidate=system,
            incumbent=row["incumbent"], round=row["round"], stage=Stage(row["stage"]), verdict=Outcome(row["verdict"]),
            reasons=tuple(Reason(r) for r in json.loads(row["reasons"])), gain=row["gain"],
            gain_lower=row["gain_lower"], gain_upper=row["gain_upper"], threshold=row["threshold"],
            noise=row["noise"], p_value=row["p_value"], blocks=row["blocks"],
            guard_passed=None if row["guard_passed"] is None else bool(row["guard_passed"]),
            guard=json.loads(row["guard"]), detail=json.loads(row["detail"]), created_at=row["created_at"],
            load=Load.from_dict(json.loads(row["load"]) if row["load"] else None))

    def get(self, entry_id: int) -> MemoryRecord:
        rows = self._rows(self._SELECT + " WHERE e.id = ?", (entry_id,))
        if not rows:
            raise SpecPilotError(f"no memory entry {entry_id} in {self.path}")
        return self._record(rows[0])

    def system(self, system_hash: str) -> SystemRecord | None:
        """The stored system with this hash (its knobs and patch), or None."""
        rows = self._rows("SELECT * FROM systems WHERE hash = ?", (system_hash,))
        if not rows:
            return None
        r = rows[0]
        return SystemRecord(r["hash"], r["name"], json.loads(r["knobs"]), r["patch"], r["parent"],
                            json.loads(r["diff"]), r["created_at"])

    def deployments(self) -> list[tuple[str, DeploymentFingerprint, int, int]]:
        """(digest, fingerprint, evaluations, promotions) of every stored deployment, oldest first."""
        rows = self._rows(
            "SELECT d.fingerprint, d.components, COUNT(e.id) AS n, "
            "COALESCE(SUM(e.verdict = 'promote'), 0) AS promoted FROM deployments d "
            "LEFT JOIN evaluations e ON e.deployment = d.fingerprint GROUP BY d.fingerprint ORDER BY d.rowid")
        return [(r["fingerprint"], DeploymentFingerprint.from_dict(json.loads(r["components"])), r["n"],
                 r["promoted"]) for r in rows]

    def entries(self, deployment: str | None = None, verdict: Outcome | None = None,
                limit: int | None = None) -> list[MemoryRecord]:
        """Newest first; `deployment` matches a fingerprint prefix or a deployment name."""
        where, args = [], []
        if deployment:
            where.append("(e.deployment LIKE ? OR d.name = ?)")
            args += [deployment + "%", deployment]
        if verdict is not None:
            where.append("e.verdict = ?")
            args.append(verdict.value)
        sql = self._SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY e.id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._record(r) for r in self._rows(sql, args)]

    def noise_floor(self, deployment: str, procedure: str) -> tuple[int, NoiseFloor] | None:
        rows = self._rows("SELECT id, detail FROM noise_floors WHERE deployment = ? AND procedure = ? "
                          "ORDER BY id DESC LIMIT 1", (deployment, procedure))
        return (rows[0]["id"], NoiseFloor.from_dict(json.loads(rows[0]["detail"]))) if rows else None

    def noise_floors(self, deployment: str, procedure: str, limit: int = 20) -> list[StoredNoise]:
        """The latest `limit` noise floors of a deployment and procedure, newest first, with their loads."""
        rows = self._rows("SELECT id, detail, load, created_at FROM noise_floors WHERE deployment = ? AND "
                          "procedure = ? ORDER BY id DESC LIMIT ?", (deployment, procedure, int(limit)))
        return [StoredNoise(r["id"], NoiseFloor.from_dict(json.loads(r["detail"])),
                            Load.from_dict(json.loads(r["load"]) if r["load"] else None), r["created_at"])
                for r in rows]

    def best_validated(self, deployment: str) -> Validated | None:
        """The promoted system with the largest estimated gain over stock for `deployment` (digest);
        promotions timed under contention do not count."""
        entries = self.entries(deployment=deployment, verdict=Outcome.PROMOTE)
        chain = self._chains([r for r in entries if r.deployment == deployment and not r.contended])
        return max(chain, key=lambda v: (v.cumulative_gain, v.record.id)) if chain else None

    def similar_deployments(self, fp: DeploymentFingerprint,
                            min_similarity: float = 0.5) -> list[tuple[float, str, DeploymentFingerprint]]:
        """(similarity, stored digest, fingerprint) of the *other* deployments at least `min_similarity`
        alike, most similar first (then by digest)."""
        out = []
        for row in self._rows("SELECT fingerprint, components FROM deployments WHERE fingerprint != ?", (fp.digest,)):
            other = DeploymentFingerprint.from_dict(json.loads(row["components"]))
            sim = fp.similarity(other)
            if sim >= min_similarity:
                out.append((sim, row["fingerprint"], other))
        out.sort(key=lambda x: (-x[0], x[1]))
        return out

    def similar_validated(self, fp: DeploymentFingerprint, limit: int = 10,
                          min_similarity: float = 0.5) -> list[tuple[float, MemoryRecord]]:
        """Promoted entries of *other* deployments, most similar deployment first, then largest gain."""
        out = []
        for sim, digest, _ in self.similar_deployments(fp, min_similarity):
            out += [(sim, r) for r in self.entries(deployment=digest, verdict=Outcome.PROMOTE)
                    if r.deployment == digest and not r.contended]
        out.sort(key=lambda x: (-x[0], -(x[1].gain or 0.0), -x[1].id))
        return out[:limit]

    @staticmethod
    def _chains(promoted: list[MemoryRecord]) -> list[Validated]:
        """Cumulative gain over stock of each promoted system: (1 + gain) times its incumbent's."""
        latest = {}
        for r in sorted(promoted, key=lambda r: r.id):
            latest[r.candidate.hash] = r  # a system promoted twice counts by its latest measurement

        def cumulative(h: str, seen: frozenset) -> float:
            r = latest.get(h)
            if r is None or h in seen:
                return 1.0  # stock, or a base that was never promoted here
            return (1 + r.gain) * cumulative(r.incumbent, seen | {h})

        return [Validated(r, cumulative(h, frozenset()) - 1) for h, r in latest.items()]

    def export(self) -> dict:
        """Every table as plain JSON data (JSON columns decoded), and the tuned kernel tables the
        systems name (`kernel_table`), which live in files of this machine's home
        (`user_cache.bundle`)."""
        def table(name: str, json_cols: tuple[str, ...]) -> list[dict]:
            rows = self._rows(f"SELECT * FROM {name} ORDER BY rowid")
            for r in rows:
                for col in json_cols:
                    r[col] = json.loads(r[col]) if r[col] is not None else None
            return rows

        from specpilot.kernels import user_cache

        tables = {name: table(name, cols) for name, cols in JSON_COLUMNS.items()}
        named = (s["knobs"].get("kernel_table", "") for s in tables["systems"] if isinstance(s["knobs"], dict))
        return {
            "schema_version": self.schema_version,
            "exported_at": now(),
            **tables,
            "kernel_tables": user_cache.bundle(named),  # the files the systems' `kernel_table` knobs name
        }

    def import_export(self, data: dict) -> dict[str, int]:
        """Merge an `export` document into this memory, all of it in one transaction or none of it:
        deployments and systems by their digest and hash; noise floors and evaluations by what
        they record (deployment, procedure or candidate, incumbent, round and stage, and when), so
        importing the same document twice adds nothing; their ids kept where free here (a run's
        journal names its entries: `--resume` on another machine), renumbered otherwise. Returns
        the rows added per table and `held` (rows already here). The kernel tables it carries are
        written into this home where no file lies (`kernel_tables`: how many). Refused whole
        (`MemoryStoreError`) for a document that is not an export, comes from a newer schema, has
        an evaluation naming a system or deployment that neither it nor this memory holds, or
        carries a kernel table that is not one."""
        tables = tuple(JSON_COLUMNS)
        if not isinstance(data, dict) or not all(isinstance(data.get(t), list) for t in tables):
            raise MemoryStoreError("not a memory export (needs lists: " + ", ".join(tables) + ")")
        if int(data.get("schema_version", 0)) > schema.SCHEMA_VERSION:
            raise MemoryStoreError(f"the export's schema version {data['schema_version']} is newer than this "
                                   f"SpecPilot's ({schema.SCHEMA_VERSION}); upgrade SpecPilot")
        from specpilot.kernels import user_cache

        try:
            kernel_tables = user_cache.checked_bundle(data.get("kernel_tables", []))
        except ValueError as err:
            raise MemoryStoreError(f"the export's {err}") from None
        same = {"noise_floors": ("deployment", "procedure", "created_at"),
                "evaluations": ("deployment", "candidate", "incumbent", "round", "stage", "created_at")}
        added = dict.fromkeys(tables, 0) | {"held": 0}
        noise_ids: dict[int, int] = {}
        with self.transaction() as c:
            for table in tables:
                columns = [r[1] for r in c.execute(f"PRAGMA table_info({table})")]
                for n, row in enumerate(data[table]):
                    try:
                        values = {k: row[k] for k in columns if k != "id" and k in row}
                        for col in JSON_COLUMNS[table]:
                            if values.get(col) is not None:
                                values[col] = json.dumps(values[col], sort_keys=True)
                        if table == "evaluations" and row.get("noise_id") is not None:
                            values["noise_id"] = noise_ids.get(row["noise_id"])
                        stored, new = _import_row(c, table, values, same.get(table), row.get("id"))
                    except (KeyError, TypeError, sqlite3.DatabaseError) as err:
                        refused = MemoryStoreError(f"the export's {table}[{n}] cannot be stored: {err}")
                        raise storage_error(err, self.path, WHAT) or refused from None  # a full disk is ours
                    added[table if new else "held"] += 1
                    if table == "noise_floors":
                        noise_ids[row.get("id")] = stored
        added["kernel_tables"] = user_cache.unbundle(kernel_tables)
        return added


def _import_row(c, table: str, values: dict, key: tuple[str, ...] | None, row_id: int | None) -> tuple[int, bool]:
    """(its id here, whether it was added) of one exported row: a row recording the same `key`
    columns is the one held; otherwise inserted, under `row_id` where that id is free (a keyed
    table), and a row whose primary key is held already (deployments, systems) is ignored."""
    if key:
        found = c.execute(f"SELECT id FROM {table} WHERE " + " AND ".join(f"{k} = ?" for k in key),
                          [values[k] for k in key]).fetchone()
        if found is not None:
            return found[0], False
        if row_id is not None and c.execute(f"SELECT 1 FROM {table} WHERE id = ?", (row_id,)).fetchone() is None:
            values = {**values, "id": row_id}  # kept where free: a run's journal names its entries
    names = list(values)
    cur = c.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                    [values[k] for k in names])
    return cur.lastrowid, bool(cur.rowcount)


def _load_json(load: Load | None) -> str | None:
    return json.dumps(load.to_dict()) if load is not None else None
