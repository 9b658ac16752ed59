"""Prometheus metrics through prometheus-client (hpcorch/controller/prom.py) and GPU time
by user (hpcorch/controller/usage.py), from a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcorch.controller.prom import render_metrics
from hpcorch.controller.store import CycleStats, JobRecord, Store
from hpcorch.controller.usage import render_usage, user_usage

prom_parser = pytest.importorskip("prometheus_client.parser")


def _job(sid: int, user: str, phase: str, gpus: int, gpu_seconds: float) -> JobRecord:
    return JobRecord(
        slurm_id=sid,
        job_key=f"k{sid}",
        name=f'job "{sid}"\\n',  # quotes and backslashes must survive as label values
        user=user,
        job_dir="",
        app="a",
        min_gpus=1,
        max_gpus=4,
        batch=64,
        max_batch=256,
        max_micro=64,
        submit_time=0.0,
        phase=phase,
        phase_since=0.0,
        gpus=gpus,
        gpu_seconds=gpu_seconds,
        samples_per_s=1234.5678,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "state.db")
    for rec in (
        _job(11, "alice", "running", 4, 7200.0),
        _job(12, "alice", "done", 0, 3600.0),
        _job(13, "bob", "queued", 0, 0.0),
        _job(14, "bob", "stopping", 2, 1800.0),
    ):
        s.put_job(rec)
    s.set_meta("pool", json.dumps([{"name": "n1", "gpus": 4, "gpus_used": 4, "usable": True}]))
    s.add_cycle(CycleStats(1795390000.123456, 0.3, 0.004, 5, 4, 1))
    s.add_cycle(CycleStats(1795390010.654321, 0.07, 0.0, 2, 4, 0))
    return s


def _families(text: str) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for fam in prom_parser.text_string_to_metric_families(text):
        assert fam.type in ("gauge", "counter", "histogram"), fam.name
        out[f"{fam.name}:{fam.type}"] = {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples
        }
    return out


def test_metrics_are_well_formed_and_precise(store: Store) -> None:
    text = render_metrics(store)
    fams = _families(text)
    last = fams["hpcorch_last_cycle_timestamp_seconds:gauge"]
    assert last[("hpcorch_last_cycle_timestamp_seconds", ())] == 1795390010.654321
    calls = fams["hpcorch_slurm_calls:counter"]
    assert calls[("hpcorch_slurm_calls_total", ())] == 7
    assert fams["hpcorch_cycles:counter"][("hpcorch_cycles_total", ())] == 2
    cycle = fams["hpcorch_cycle_duration_seconds:histogram"]
    assert cycle[("hpcorch_cycle_duration_seconds_bucket", (("le", "0.1"),))] == 1
    assert cycle[("hpcorch_cycle_duration_seconds_bucket", (("le", "+Inf"),))] == 2
    assert cycle[("hpcorch_cycle_duration_seconds_sum", ())] == pytest.approx(0.37)
    decision = fams["hpcorch_decision_duration_seconds:histogram"]
    assert decision[("hpcorch_decision_duration_seconds_count", ())] == 1  # rounds only
    # per job: slurm_job_id, never Prometheus' own "job" label; only active jobs
    gpus = fams["hpcorch_job_gpus:gauge"]
    assert {dict(labels)["slurm_job_id"] for _, labels in gpus} == {"11", "13", "14"}
    assert all("job" not in dict(labels) for fam in fams.values() for _, labels in fam)
    names = {dict(labels)["name"] for _, labels in gpus}
    assert names == {'job "11"\\n', 'job "13"\\n', 'job "14"\\n'}
    rate = fams["hpcorch_job_samples_per_second:gauge"]
    assert set(rate.values()) == {1234.5678}
    used = fams["hpcorch_user_gpu_seconds:counter"]
    assert used[("hpcorch_user_gpu_seconds_total", (("user", "alice"),))] == 10800.0
    assert used[("hpcorch_user_gpu_seconds_total", (("user", "bob"),))] == 1800.0
    held = fams["hpcorch_user_gpus:gauge"]
    assert held[("hpcorch_user_gpus", (("user", "bob"),))] == 2


def test_counters_survive_the_pruning_of_old_cycles(store: Store) -> None:
    store.db.execute("DELETE FROM cycles")
    fams = _families(render_metrics(store))
    assert fams["hpcorch_slurm_calls:counter"][("hpcorch_slurm_calls_total", ())] == 7
    store.add_cycle(CycleStats(1795390020.0, 0.2, 0.0, 2, 4, 0))
    fams = _families(render_metrics(store))
    assert fams["hpcorch_slurm_calls:counter"][("hpcorch_slurm_calls_total", ())] == 9


def test_user_usage_table(store: Store) -> None:
    rows = user_usage(store.jobs())
    assert [(r.user, r.active_jobs, r.gpus) for r in rows] == [("alice", 1, 4), ("bob", 2, 2)]
    assert rows[0].share == pytest.approx(10800 / 12600)
    text = render_usage(rows)
    assert text.splitlines()[1].split() == ["USER", "ACTIVE", "GPUS", "GPU-HOURS", "SHARE"]
    assert text.splitlines()[2].split() == ["alice", "1", "4", "3.00", "86%"]
    assert render_usage([]) == "USAGE  no GPU time recorded yet"
