"""The controller's durable state: SQLite in WAL mode under the state directory.

Tables: ``jobs`` (one row per hpcorch job, keyed by its Slurm job id), ``decisions`` (every
action the controller took or meant to take, written before it acts: the intent log that
makes restarts safe), ``samples`` (throughput and progress the jobs reported, which the
models are fitted on) and ``cycles`` (per-cycle timings and Slurm call counts). The rows
as Python values are in hpcorch/controller/rows.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from hpcorch.controller.rows import (
    ACTIVE_PHASES,
    CYCLE_BUCKETS,
    DECISION_BUCKETS,
    FINAL_PHASES,
    TOTALS_KEY,
    CycleStats,
    Decision,
    JobRecord,
    Sample,
    add_to_totals,
)
from hpcorch.errors import HpcorchError

__all__ = [
    "ACTIVE_PHASES",
    "CYCLE_BUCKETS",
    "DECISION_BUCKETS",
    "FINAL_PHASES",
    "SCHEMA_VERSION",
    "TOTALS_KEY",
    "CycleStats",
    "Decision",
    "JobRecord",
    "Sample",
    "StateError",
    "Store",
    "add_to_totals",
    "job_row",
]

SCHEMA_VERSION = 11

_ADDED_COLUMNS: dict[int, tuple[tuple[str, str], ...]] = {
    2: (
        ("jobs", "mode TEXT NOT NULL DEFAULT 'managed'"),
        ("jobs", "mode_detected INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "resumable INTEGER NOT NULL DEFAULT 1"),
        ("jobs", "predictable INTEGER NOT NULL DEFAULT 1"),
        ("jobs", "needs_ckpt INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "checkpoints INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "lost_steps INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "kills INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "stop_grace_s REAL NOT NULL DEFAULT 0"),
        ("jobs", "cpus_per_gpu INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "target_cpus INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "min_cpus INTEGER NOT NULL DEFAULT 1"),
        ("samples", "cpus_per_gpu INTEGER NOT NULL DEFAULT 0"),
        ("samples", "data_wait REAL"),
    ),
    3: (
        ("jobs", "time_budget_s REAL NOT NULL DEFAULT 0"),
        ("jobs", "max_relaunches INTEGER NOT NULL DEFAULT -1"),
        ("jobs", "time_relaunches INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "run_total_s REAL NOT NULL DEFAULT 0"),
    ),
    4: (("jobs", "node_gpus TEXT NOT NULL DEFAULT ''"),),
    5: (
        ("jobs", "uid INTEGER NOT NULL DEFAULT -1"),
        ("jobs", "start_failures INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "retry_at REAL NOT NULL DEFAULT 0"),
        ("jobs", "forced_at REAL NOT NULL DEFAULT 0"),
    ),
    6: (
        ("jobs", "ready_at REAL NOT NULL DEFAULT 0"),
        ("samples", "epoch INTEGER NOT NULL DEFAULT 0"),
    ),
    7: (
        ("jobs", "fingerprint TEXT NOT NULL DEFAULT ''"),
        ("jobs", "model_bytes INTEGER NOT NULL DEFAULT 0"),
    ),
    8: (("jobs", "slurm_launch INTEGER NOT NULL DEFAULT 0"),),
    9: (
        ("jobs", "gpu_types TEXT NOT NULL DEFAULT ''"),
        ("jobs", "gpu_type TEXT NOT NULL DEFAULT ''"),
        ("jobs", "target_type TEXT NOT NULL DEFAULT ''"),
        ("samples", "gpu_type TEXT NOT NULL DEFAULT ''"),
    ),
    10: (
        ("jobs", "breach TEXT NOT NULL DEFAULT ''"),
        ("jobs", "checkpoint_misses INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "launch_checkpoints INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "trained_step INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "requeue_fixed_at REAL NOT NULL DEFAULT 0"),
        ("jobs", "time_limit_min INTEGER NOT NULL DEFAULT 0"),
        ("jobs", "limit_cut TEXT NOT NULL DEFAULT ''"),
        ("jobs", "moved TEXT NOT NULL DEFAULT ''"),
    ),
    11: (("cycles", "full INTEGER NOT NULL DEFAULT 1"),),
}
"""Columns each schema version added (table, definition): an older database gains them on
open."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
    slurm_id INTEGER PRIMARY KEY,
    job_key TEXT NOT NULL, name TEXT NOT NULL, user TEXT NOT NULL, job_dir TEXT NOT NULL,
    app TEXT NOT NULL, min_gpus INTEGER NOT NULL, max_gpus INTEGER NOT NULL,
    batch INTEGER NOT NULL, max_batch INTEGER NOT NULL, max_micro INTEGER NOT NULL,
    submit_time REAL NOT NULL, phase TEXT NOT NULL, phase_since REAL NOT NULL,
    gpus INTEGER NOT NULL DEFAULT 0, nodes INTEGER NOT NULL DEFAULT 0,
    node_list TEXT NOT NULL DEFAULT '', target_gpus INTEGER NOT NULL DEFAULT 0,
    target_placement TEXT NOT NULL DEFAULT '{}', global_batch INTEGER NOT NULL DEFAULT 0,
    micro_batch INTEGER NOT NULL DEFAULT 0, accum_steps INTEGER NOT NULL DEFAULT 1,
    launches INTEGER NOT NULL DEFAULT 0, resizes INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0, started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0, gpu_seconds REAL NOT NULL DEFAULT 0,
    run_seconds REAL NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '',
    metrics_offset INTEGER NOT NULL DEFAULT 0, progress REAL NOT NULL DEFAULT 0,
    samples_per_s REAL NOT NULL DEFAULT 0, exit_code INTEGER NOT NULL DEFAULT 0,
    signalled_at REAL NOT NULL DEFAULT 0, epoch INTEGER NOT NULL DEFAULT 0,
    epochs INTEGER NOT NULL DEFAULT 0, steps_per_epoch REAL NOT NULL DEFAULT 0,
    target_batch INTEGER NOT NULL DEFAULT 0, ready INTEGER NOT NULL DEFAULT 0,
    slurm_restarts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS decisions(
    id INTEGER PRIMARY KEY, time REAL NOT NULL, slurm_id INTEGER NOT NULL,
    action TEXT NOT NULL, from_gpus INTEGER NOT NULL, to_gpus INTEGER NOT NULL,
    global_batch INTEGER NOT NULL, detail TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'pending', done_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS decisions_job ON decisions(slurm_id);
CREATE TABLE IF NOT EXISTS samples(
    slurm_id INTEGER NOT NULL, time REAL NOT NULL, gpus INTEGER NOT NULL,
    nodes INTEGER NOT NULL, micro_batch INTEGER NOT NULL, accum_steps INTEGER NOT NULL,
    global_batch INTEGER NOT NULL, step_time REAL NOT NULL, samples_per_s REAL NOT NULL,
    loss REAL, noise_scale REAL, step INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS samples_job ON samples(slurm_id);
CREATE TABLE IF NOT EXISTS cycles(
    id INTEGER PRIMARY KEY, time REAL NOT NULL, seconds REAL NOT NULL,
    decision_s REAL NOT NULL, slurm_calls INTEGER NOT NULL, jobs INTEGER NOT NULL,
    actions INTEGER NOT NULL
);
"""


WAL_PAGES = 128
"""The controller's write-ahead log is folded into its database every this many pages."""
WAL_BYTES = 1 << 20
"""... and cut back to this size after (SQLite's ``journal_size_limit``)."""


class StateError(HpcorchError):
    """The state database cannot be used."""


_JOB_FIELDS = [f.name for f in fields(JobRecord)]
_JOB_COLUMNS = ",".join(_JOB_FIELDS)
_JOB_MARKS = ",".join("?" * len(_JOB_FIELDS))
_PUT_JOB = f"INSERT OR REPLACE INTO jobs({_JOB_COLUMNS}) VALUES({_JOB_MARKS})"
_SAMPLE_FIELDS = [f.name for f in fields(Sample)]
_ADD_SAMPLE = (
    f"INSERT INTO samples({','.join(_SAMPLE_FIELDS)}) VALUES({','.join('?' * len(_SAMPLE_FIELDS))})"
)


def job_row(rec: JobRecord) -> tuple[Any, ...]:
    """The record's values in column order (what :meth:`Store.put_job` writes)."""
    return tuple(getattr(rec, k) for k in _JOB_FIELDS)


def _sample_row(s: Sample) -> tuple[Any, ...]:
    return tuple(getattr(s, k) for k in _SAMPLE_FIELDS)


def _job(row: sqlite3.Row) -> JobRecord:
    """A record from a row; columns an older database lacks keep their defaults (a
    read-only reader does not migrate)."""
    have = set(row.keys())
    return JobRecord(**{k: row[k] for k in _JOB_FIELDS if k in have})


class Store:
    """Typed access to the state database. One writer (the controller); readers any."""

    def __init__(
        self, path: Path, readonly: bool = False, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.clock = clock
        """Time of decisions (the simulator passes its simulated clock)."""
        if readonly:
            try:
                with open(path, "rb"):
                    pass
            except FileNotFoundError:
                raise StateError(f"no controller state at {path}") from None
            except OSError as exc:
                raise StateError(
                    f"cannot read the controller's state {path}: {exc.strerror} (it belongs to "
                    "the controller's user; an admin can let you read it)"
                ) from None
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            else:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
                fresh = not path.exists()
                self.db = sqlite3.connect(path, timeout=10, isolation_level=None)
                if fresh:
                    os.chmod(path, 0o640)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                # the write-ahead log folded into the database every WAL_PAGES pages and cut
                # back to WAL_BYTES after: SQLite's defaults let it reach 4 MB, in 200 s of
                # one-second cycles, beside a database of a few pages
                self.db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
                self.db.execute(f"PRAGMA journal_size_limit={WAL_BYTES}")
            self.db.row_factory = sqlite3.Row
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            if not readonly:
                self.db.executescript(_SCHEMA)
                self._check_version()
        except sqlite3.DatabaseError as exc:
            raise StateError(
                f"state database {path} is unreadable or corrupt ({exc}); it was left as it is: "
                "move it aside to start afresh (running jobs are adopted from Slurm)"
            ) from exc

    def _check_version(self) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self._migrate(0)
            self.db.execute("INSERT INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) < SCHEMA_VERSION:
            self._migrate(int(row[0]))
            self.db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StateError(
                f"state database {self.path} has schema {row[0]}; this hpcorch uses "
                f"{SCHEMA_VERSION}"
            )

    def _migrate(self, version: int) -> None:
        # Every version's columns are checked (each is added only where missing), so a
        # store whose number was set by another line of development gains what it lacks.
        del version
        for v in range(1, SCHEMA_VERSION + 1):
            for table, column in _ADDED_COLUMNS.get(v, ()):
                have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
                if column.split()[0] not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    def backup(self, dest: Path) -> None:
        """A consistent copy of the whole database at ``dest`` (replaced if there)."""
        dest.unlink(missing_ok=True)
        out = sqlite3.connect(dest)
        try:
            self.db.backup(out)
        finally:
            out.close()

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- meta ---------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES(?, ?)", (key, value))

    # --- jobs ---------------------------------------------------------------------------
    def jobs(self, active_only: bool = False) -> list[JobRecord]:
        sql = "SELECT * FROM jobs"
        if active_only:
            sql += f" WHERE phase IN ({','.join('?' * len(ACTIVE_PHASES))})"
        rows = self.db.execute(sql + " ORDER BY slurm_id", ACTIVE_PHASES if active_only else ())
        return [_job(r) for r in rows]

    def job(self, slurm_id: int) -> JobRecord | None:
        r = self.db.execute("SELECT * FROM jobs WHERE slurm_id=?", (slurm_id,)).fetchone()
        return None if r is None else _job(r)

    def put_job(self, rec: JobRecord) -> None:
        self.db.execute(_PUT_JOB, job_row(rec))

    def put_jobs(self, records: Sequence[JobRecord]) -> None:
        self.db.executemany(_PUT_JOB, [job_row(r) for r in records])

    # --- decisions ----------------------------------------------------------------------
    def add_decision(
        self, slurm_id: int, action: str, from_gpus: int, to_gpus: int, batch: int, detail: str
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO decisions(time, slurm_id, action, from_gpus, to_gpus, global_batch,"
            " detail) VALUES(?,?,?,?,?,?,?)",
            (self.clock(), slurm_id, action, from_gpus, to_gpus, batch, detail),
        )
        return int(cur.lastrowid or 0)

    def finish_decision(self, decision_id: int, status: str = "done") -> None:
        self.db.execute(
            "UPDATE decisions SET status=?, done_at=? WHERE id=?",
            (status, self.clock(), decision_id),
        )

    def decisions(self, slurm_id: int | None = None, status: str | None = None) -> list[Decision]:
        sql, args = "SELECT * FROM decisions WHERE 1=1", list[object]()
        if slurm_id is not None:
            sql += " AND slurm_id=?"
            args.append(slurm_id)
        if status is not None:
            sql += " AND status=?"
            args.append(status)
        rows = self.db.execute(sql + " ORDER BY id", args)
        return [Decision(**dict(r)) for r in rows]

    def count_decisions(self, action: str, detail_prefix: str = "") -> int:
        row = self.db.execute(
            "SELECT COUNT(*) FROM decisions WHERE action=? AND detail LIKE ?",
            (action, detail_prefix + "%"),
        )
        return int(row.fetchone()[0])

    # --- samples ------------------------------------------------------------------------
    def add_samples(self, samples: Sequence[Sample]) -> None:
        if samples:
            self.db.executemany(_ADD_SAMPLE, [_sample_row(s) for s in samples])

    def prune_samples(self, slurm_id: int, kept: Sequence[Sample]) -> None:
        """The job's samples become ``kept`` (what the controller chose to keep of them:
        hpcorch/controller/thinning.py); the others are deleted."""
        self.db.execute("DELETE FROM samples WHERE slurm_id=?", (slurm_id,))
        self.add_samples([s for s in kept if s.slurm_id == slurm_id])

    def count_samples(self, slurm_id: int) -> int:
        row = self.db.execute("SELECT COUNT(*) FROM samples WHERE slurm_id=?", (slurm_id,))
        return int(row.fetchone()[0])

    def samples(self, slurm_id: int) -> list[Sample]:
        cur = self.db.execute("SELECT * FROM samples WHERE slurm_id=? ORDER BY time", (slurm_id,))
        have = [d[0] for d in cur.description]
        cols = [k for k in _SAMPLE_FIELDS if k in have]  # an older database lacks some
        idx = [have.index(k) for k in cols]
        return [Sample(**{k: r[i] for k, i in zip(cols, idx, strict=True)}) for r in cur]

    # --- cycles -------------------------------------------------------------------------
    def add_cycle(self, c: CycleStats) -> None:
        self.db.execute(
            "INSERT INTO cycles(time, seconds, decision_s, slurm_calls, jobs, actions, full)"
            " VALUES(?,?,?,?,?,?,?)",
            (c.time, c.seconds, c.decision_s, c.slurm_calls, c.jobs, c.actions, int(c.full)),
        )
        self.db.execute("DELETE FROM cycles WHERE id <= (SELECT MAX(id) FROM cycles) - 10000")
        totals = add_to_totals(json.loads(self.get_meta(TOTALS_KEY) or "{}"), c)
        self.set_meta(TOTALS_KEY, json.dumps(totals))

    def cycle_totals(self) -> dict[str, Any]:
        """Counts and latency histograms over every cycle since the state was created
        (the cycles table keeps only the last 10000): what the metrics' counters read."""
        return add_to_totals(json.loads(self.get_meta(TOTALS_KEY) or "{}"), None)

    def recent_cycles(self, n: int = 100) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM cycles ORDER BY id DESC LIMIT ?", (n,))
        return [dict(r) for r in rows]
