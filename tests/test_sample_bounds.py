"""A job's samples are bounded whatever it reports: the thinning rule keeps what the
profiles, the history and the report read; the controller's memory and store hold at most
``MAX_SAMPLES_PER_JOB`` of a running job and ``KEEP_FINISHED`` of one that ended."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcorch.controller.loop import Controller
from hpcorch.controller.memory import Records
from hpcorch.controller.snapshot import (
    PROFILE_WINDOW,
    Profiles,
    build_snapshot,
    cpu_profile_of,
    noise_history,
    profile_of,
)
from hpcorch.controller.store import JobRecord, Sample, Store
from hpcorch.controller.thinning import (
    KEEP_FINISHED,
    KEEP_RUNNING,
    MAX_CHANGES,
    MAX_SAMPLES_PER_JOB,
    SAMPLES_PER_CYCLE,
    keep,
)
from hpcorch.policy import POLICIES, make_policy
from hpcorch.policy.types import validate_plan
from hpcorch.report import build
from tests.test_controller_logic import FakeCluster
from tests.test_controller_loop import Reporting, Scripted, _ctl


def _sample(i: int, sid: int = 1, **kw: Any) -> Sample:
    fields: dict[str, Any] = {
        "slurm_id": sid, "time": 1000.0 + i, "gpus": 2, "nodes": 1, "micro_batch": 32,
        "accum_steps": 1, "global_batch": 64, "step_time": 0.5 + (i % 7) / 100,
        "samples_per_s": 128.0, "loss": 2.0 - i / 1e5, "noise_scale": 100.0 + i % 5,
        "step": i + 1, "cpus_per_gpu": 2, "data_wait": 0.01, "epoch": i // 500,
    }  # fmt: skip
    fields.update(kw)
    return Sample(**fields)


def _honest(n: int) -> list[Sample]:
    """A long job: three configurations in turn, the batch growing with the GPUs."""
    out = []
    for i in range(n):
        gpus = (1, 2, 4)[min(2, i * 3 // n)]
        out.append(_sample(i, gpus=gpus, global_batch=32 * gpus))
    return out


def _flood(n: int, sid: int = 1, start: int = 0) -> list[Sample]:
    """Lines spread over hundreds of configurations, epochs and batches."""
    return [
        _sample(
            i, sid, micro_batch=1 + i % 300, accum_steps=1 + i % 2, global_batch=32 * (1 + i % 3),
            epoch=i // 50, step=i // 2,
        )
        for i in range(start, start + n)
    ]  # fmt: skip


def _count(store: Store, sid: int) -> int:
    return int(
        store.db.execute("SELECT COUNT(*) FROM samples WHERE slurm_id=?", (sid,)).fetchone()[0]
    )


def _rows(samples: list[Sample]) -> list[dict[str, Any]]:
    return [dict(vars(s)) for s in samples]


def test_fewer_than_the_budget_are_all_kept() -> None:
    got = _honest(500)
    assert keep(got, 500) == got


def test_a_flood_is_cut_to_the_budget_and_keeps_its_last_report() -> None:
    flood = _flood(100_000)
    for budget in (SAMPLES_PER_CYCLE, KEEP_FINISHED, KEEP_RUNNING):
        kept = keep(flood, budget)
        assert len(kept) <= budget
        assert kept[-1] is flood[-1]
        assert [s.time for s in kept] == sorted(s.time for s in kept)  # in order


def test_thinning_keeps_what_profiles_history_and_report_read() -> None:
    """10000 samples of an honest job, thinned to what is kept of a finished job: the same
    step-time and CPU profiles, noise history, batch changes and final loss."""
    got = _honest(10_000)
    kept = keep(got, KEEP_FINISHED)
    assert len(kept) <= KEEP_FINISHED
    assert profile_of(kept) == profile_of(got)
    assert cpu_profile_of(kept) == cpu_profile_of(got)
    assert noise_history(kept, 64, 20) == noise_history(got, 64, 20)
    job = {
        "slurm_id": 1, "name": "a", "submit_time": 900.0, "finished_at": 12_000.0,
        "phase_since": 12_000.0, "phase": "done", "gpu_seconds": 1.0, "resizes": 2,
        "started_at": 950.0,
    }  # fmt: skip
    whole = build([job], [], _rows(got), {}, "x").jobs[0]
    thinned = build([job], [], _rows(kept), {}, "x").jobs[0]
    assert whole.batches == thinned.batches == [32, 64, 128]
    assert whole.final_loss == thinned.final_loss
    assert whole.marks == thinned.marks


def test_changes_kept_are_bounded() -> None:
    """A batch change on every line: the last ``MAX_CHANGES`` changes are kept as such,
    within the budget."""
    flip = [_sample(i, global_batch=64 + 32 * (i % 2)) for i in range(20_000)]
    kept = keep(flip, KEEP_FINISHED)
    assert len(kept) <= KEEP_FINISHED
    last = flip[-MAX_CHANGES - 1 :]
    assert kept[-len(last) :] == last


def test_profiles_follow_a_thinned_list() -> None:
    """The incremental profiles notice a list thinned in place and start afresh."""
    got = _honest(4000)
    prof = Profiles()
    assert prof.of(1, got) == (profile_of(got), cpu_profile_of(got))
    got[:] = keep(got, 1000)
    got += [_sample(5000 + i, gpus=8, global_batch=256, step_time=9.0) for i in range(3000)]
    got += [_sample(9000 + i, gpus=16, global_batch=512, step_time=7.0) for i in range(500)]
    assert prof.of(1, got) == (profile_of(got), cpu_profile_of(got))


def test_records_bound_a_flood_in_memory_and_store(tmp_path: Path) -> None:
    """Cycle after cycle of 10000 samples from one job: memory and store hold the same
    samples, never more than ``MAX_SAMPLES_PER_JOB``; an honest job beside it keeps all."""
    store = Store(tmp_path / "state.db")
    records = Records(store)
    honest: list[Sample] = []
    for cycle in range(30):
        new = [_sample(cycle * 3 + k, 2, gpus=2) for k in range(3)]
        honest += new
        records.stage([*_flood(10_000, 1, cycle * 10_000), *new])
        with store.transaction():
            records.write()
        assert _count(store, 1) == len(records.samples(1)) <= MAX_SAMPLES_PER_JOB
        assert records.samples(2) == honest
    assert _count(store, 2) == len(honest)
    assert sorted(store.samples(1), key=lambda s: s.time) == sorted(
        records.samples(1), key=lambda s: s.time
    )


def test_a_flood_through_the_controller(tmp_path: Path) -> None:
    """The controller's loop with a job whose reports come 10000 a cycle: its store stays
    bounded while it runs, is pruned when it ends, and its history entry is made from what
    was kept (a restarted controller makes the same)."""
    c = Reporting()
    c.add(1, 1, 4)
    ctl = _ctl(tmp_path, c, Scripted({"1": (2, {0: 2}, 64)}))
    ctl.cycle()
    ctl.cycle()  # started, reported its start
    lines = c.lines["/jobs/1"]
    step = 0
    for _ in range(20):
        c.t += 10
        for _ in range(10_000):
            step += 1
            lines.append(
                {"time": c.t, "event": "steps", "step": step, "step_time": 0.5, "gpus": 2,
                 "global_batch": 64, "per_gpu_batch": 32, "accum_steps": 1,
                 "noise_scale": 50.0, "loss": 1.0, "epoch": step // 20_000}
            )  # fmt: skip
        ctl.cycle()
        assert _count(ctl.store, 1) <= MAX_SAMPLES_PER_JOB
        assert len(ctl.records.samples(1)) <= MAX_SAMPLES_PER_JOB
    assert ctl.store.job(1).progress == step  # type: ignore[union-attr]  # every line digested
    c.set(1, state="COMPLETED", exit_code=0)
    c.t += 10
    ctl.cycle()
    ctl.cycle()
    assert ctl.store.job(1).phase == "done"  # type: ignore[union-attr]
    assert 0 < _count(ctl.store, 1) <= KEEP_FINISHED
    (entry,) = ctl.history
    assert entry.profile and entry.profile[0].step_time == 0.5
    again = Controller(c, Store(tmp_path / "state.db"), Scripted(), ctl.config, log=lambda m: None)
    c.t += 10
    again.cycle()
    assert again.history == ctl.history
    assert len(again.history[0].grad_history) == 11 and PROFILE_WINDOW > 0


def test_a_report_outside_the_jobs_bounds_does_not_void_the_round() -> None:
    """A running job that reports a micro-batch above its own maximum (its script writes
    its lines) is shown at the split its plan gives it: the plan every policy keeps for it
    stays valid, and the other jobs are scheduled (before: the whole plan was ignored)."""
    nodes = FakeCluster().observe().nodes
    base = JobRecord(1, "j1", "j", "u", "/j", "app", 1, 1, 32, 32, 32, 0.0, "running", 0.0)
    flood = replace(
        base, gpus=1, node_list="n1", ready=1, micro_batch=300, accum_steps=2,
        global_batch=600, target_batch=32,
    )  # fmt: skip
    queued = replace(base, slurm_id=2, job_key="j2", phase="queued")
    snap = build_snapshot(100.0, nodes, [flood, queued], {}, (), {}, 60.0, 30.0)
    view = next(v for v in snap.jobs if v.job_id == "1")
    assert 1 <= view.micro_batch <= view.max_micro_batch
    for name in POLICIES:
        plan = make_policy(name).schedule(snap)
        validate_plan(snap, plan)
        assert "2" in plan.by_id(), name
