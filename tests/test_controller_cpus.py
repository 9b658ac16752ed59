"""CPUs per GPU through the controller: reports in, CPU-aware plans out, Slurm shapes."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hpcorch.cluster import Observation, PoolNode
from hpcorch.controller.snapshot import cpu_profile_of
from hpcorch.controller.store import SCHEMA_VERSION, JobRecord, Sample, Store
from tests.test_controller_logic import FakeCluster, controller


@dataclass
class CpuCluster(FakeCluster):
    """The fake cluster with 8 CPUs per node; its jobs report a CPU-starved step."""

    cpus_per_node: int = 8
    reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def observe(self) -> Observation:
        obs = super().observe()
        nodes = tuple(
            PoolNode(n.name, n.gpus, n.gpus_used, n.usable, self.cpus_per_node) for n in obs.nodes
        )
        return Observation(obs.time, nodes, obs.jobs)

    def read_metrics(
        self, job_dir: str, offset: int, uid: int
    ) -> tuple[Sequence[dict[str, Any]], int]:
        lines = self.reports.get(job_dir, [])
        return lines[offset:], len(lines)


def starved(cpus: int, wait: float, step: int) -> dict[str, Any]:
    return {
        "event": "steps",
        "time": 1000.0 + step,
        "step": step,
        "step_time": 1.0,
        "gpus": 4,
        "global_batch": 64,
        "per_gpu_batch": 16,
        "accum_steps": 1,
        "cpus_per_gpu": cpus,
        "data_wait": wait,
    }


def test_a_starved_job_is_relaunched_with_more_cpus(tmp_path: Path) -> None:
    cluster = CpuCluster(nodes=1)
    cluster.add(1, 4, 4)
    ctl = controller(tmp_path, cluster)
    ctl.cycle()  # adopted and started at 4 GPUs, CPUs as submitted
    assert cluster.shapes[-1].gpus == 4
    cluster.reports["/jobs/1"] = [{"event": "start"}] + [starved(1, 0.8, s) for s in (1, 2, 3)]
    cluster.t += 10
    ctl.cycle()  # reads the reports: 80% of each step waits for input -> more CPUs
    cluster.t += 10
    ctl.cycle()  # the checkpointed job is relaunched
    assert ("signal", 1) in cluster.log
    assert cluster.shapes[-1].gpus == 4 and cluster.shapes[-1].cpus_per_gpu == 2
    detail = [d.detail for d in ctl.store.decisions(1) if d.action == "signal"]
    assert detail == ["resize to 2 CPUs per GPU"]


def test_a_fed_job_keeps_its_cpus(tmp_path: Path) -> None:
    cluster = CpuCluster(nodes=1)
    cluster.add(1, 4, 4)
    ctl = controller(tmp_path, cluster)
    ctl.cycle()
    cluster.reports["/jobs/1"] = [{"event": "start"}] + [starved(2, 0.0, s) for s in (1, 2, 3)]
    for _ in range(3):
        cluster.t += 10
        ctl.cycle()
    assert ("signal", 1) not in cluster.log


def test_cpu_profile_from_samples() -> None:
    def s(c: int, t: float, w: float | None) -> Sample:
        return Sample(1, 0.0, 4, 1, 16, 2, 128, t, 0.0, cpus_per_gpu=c, data_wait=w)

    prof = cpu_profile_of([s(1, 2.0, 1.0), s(1, 4.0, 1.0), s(2, 1.0, None), s(0, 9.0, 9.0)])
    assert [(p.cpus_per_gpu, p.step_time, p.data_wait) for p in prof] == [
        (1, 1.5, 0.5),  # per micro-step: 2 accumulation steps
        (2, 0.5, None),
    ]


def test_an_old_state_database_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES('schema', '1');"
        "CREATE TABLE samples(slurm_id INTEGER NOT NULL, time REAL NOT NULL,"
        " gpus INTEGER NOT NULL, nodes INTEGER NOT NULL, micro_batch INTEGER NOT NULL,"
        " accum_steps INTEGER NOT NULL, global_batch INTEGER NOT NULL,"
        " step_time REAL NOT NULL, samples_per_s REAL NOT NULL, loss REAL,"
        " noise_scale REAL, step INTEGER NOT NULL DEFAULT 0);"
        "INSERT INTO samples VALUES(7, 1.0, 2, 1, 32, 1, 64, 0.5, 128.0, 0.3, NULL, 10);"
    )
    db.commit()
    db.close()
    store = Store(path)
    old = store.samples(7)
    assert len(old) == 1 and old[0].cpus_per_gpu == 0 and old[0].data_wait is None
    store.add_samples([Sample(7, 2.0, 2, 1, 32, 1, 64, 0.5, 128.0, cpus_per_gpu=3)])
    assert store.samples(7)[-1].cpus_per_gpu == 3
    assert store.get_meta("schema") == str(SCHEMA_VERSION)


@pytest.mark.parametrize(
    "columns", [("node_gpus",), ("uid", "start_failures", "retry_at")], ids=["main-4", "trust-4"]
)
def test_a_schema_4_store_of_either_line_gains_every_column(
    tmp_path: Path, columns: tuple[str, ...]
) -> None:
    """Schema 4 was numbered twice while two lines of work ran side by side (exact
    placements: node_gpus; the controller's trust: uid, start_failures, retry_at): a store
    of either opens at the current schema with all of them (and schema 6's ready_at and
    samples.epoch, schema 7's fingerprint and model_bytes), its rows kept."""
    path = tmp_path / "state.db"
    store = Store(path)
    store.put_job(JobRecord(3, "k", "n", "u", "/d", "a", 1, 2, 64, 64, 64, 0.0, "queued", 0.0))
    store.close()
    db = sqlite3.connect(path)
    added = ("forced_at", "ready_at", "fingerprint", "model_bytes")
    for name in ("node_gpus", "uid", "start_failures", "retry_at", *added):
        if name not in columns:
            db.execute(f"ALTER TABLE jobs DROP COLUMN {name}")
    db.execute("ALTER TABLE samples DROP COLUMN epoch")
    db.execute("UPDATE meta SET value='4' WHERE key='schema'")
    db.commit()
    db.close()
    store = Store(path)
    have = {r[1] for r in store.db.execute("PRAGMA table_info(jobs)")}
    assert {"node_gpus", "uid", "start_failures", "retry_at", *added} <= have
    assert "epoch" in {r[1] for r in store.db.execute("PRAGMA table_info(samples)")}
    rec = store.job(3)
    assert rec is not None and rec.uid == -1 and rec.node_gpus == "" and rec.forced_at == 0.0
    assert rec.ready_at == 0.0 and rec.fingerprint == "" and rec.model_bytes == 0
    assert store.get_meta("schema") == str(SCHEMA_VERSION) == "11"
