"""The controller's loop: exact placements, the minimum training time before a resize,
batch-only changes without a restart, and its in-memory view of the store."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from hpcorch.cluster import Shape
from hpcorch.controller.execute import MEASURED_REBATCHES
from hpcorch.controller.loop import Controller
from hpcorch.controller.reconcile import target_shape
from hpcorch.controller.snapshot import build_snapshot
from hpcorch.controller.store import JobRecord, Store, job_row
from hpcorch.policy.types import JobPlan, Plan, Snapshot
from tests.test_controller_logic import CFG, FakeCluster


@dataclass
class Scripted:
    """A policy that returns ``plans[job id] = (gpus, placement, batch)`` and records
    what it was shown."""

    plans: dict[str, tuple[int, dict[int, int], int]] = field(default_factory=dict)
    seen: list[Snapshot] = field(default_factory=list)
    fail: bool = False
    name: str = "scripted"

    def schedule(self, snapshot: Snapshot) -> Plan:
        self.seen.append(snapshot)
        if self.fail:
            raise RuntimeError("policy crashed")
        out = []
        for j in snapshot.jobs:
            if j.job_id in self.plans:
                gpus, where, batch = self.plans[j.job_id]
                out.append(JobPlan(j.job_id, gpus, where, batch, batch // gpus, 1))
        return Plan(tuple(out))


@dataclass
class Reporting(FakeCluster):
    """The fake cluster, with jobs that report their start (as the runtime does)."""

    lines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def start(self, slurm_id: int, shape: Shape) -> None:
        super().start(slurm_id, shape)
        self.set(slurm_id, per_node=shape.per_node)
        self.lines.setdefault(f"/jobs/{slurm_id}", []).append(
            {"time": self.t, "event": "start", "step": 0}
        )

    def read_metrics(
        self, job_dir: str, offset: int, uid: int = -1
    ) -> tuple[list[dict[str, Any]], int]:
        got = self.lines.get(job_dir, [])
        return got[offset:], len(got)


def _ctl(tmp_path: Path, c: FakeCluster, policy: Scripted, **config: Any) -> Controller:
    cfg = replace(CFG, **config)
    return Controller(c, Store(tmp_path / "state.db"), policy, cfg, log=lambda m: None)


def test_an_uneven_plan_is_launched_exactly_in_rank_order(tmp_path: Path) -> None:
    c = Reporting()
    c.add(1, 1, 8)
    policy = Scripted({"1": (6, {1: 4, 0: 2}, 96)})
    ctl = _ctl(tmp_path, c, policy)
    ctl.cycle()
    assert c.shapes[-1] == Shape(2, 4, ("n2", "n1"), 0, (4, 2))
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and (rec.node_list, rec.node_gpus, rec.gpus) == ("n2,n1", "4,2", 6)
    (view,) = policy.seen[-1].jobs
    assert dict(view.placement) == {1: 4, 0: 2}  # where Slurm runs it, uneven
    # a planned node that no longer exists: the fewest even nodes, for Slurm to choose
    rec.target_placement, rec.target_gpus = json.dumps({0: 2, 7: 2}), 4
    assert target_shape(rec, ("n1", "n2")) == Shape(2, 2)


def test_a_launch_trains_for_its_restart_cost_before_it_is_resized(tmp_path: Path) -> None:
    c = Reporting()
    c.add(1, 1, 8)
    policy = Scripted({"1": (8, {0: 4, 1: 4}, 64)})
    ctl = _ctl(tmp_path, c, policy, restart_cost_s=30.0)
    ctl.cycle()
    c.t += 5
    ctl.cycle()  # running; its start reported at t=1000
    policy.plans["1"] = (4, {0: 4}, 64)
    c.t += 20
    rounds = len(policy.seen)
    ctl.cycle()
    assert ("signal", 1) not in c.log  # trained 25 s < 30 s
    assert len(policy.seen) == rounds  # set apart: it keeps its GPUs this round
    c.t += 10
    ctl.cycle()
    assert ("signal", 1) in c.log  # 35 s of training: now it may
    # min_run_s counts too, when it is the longer
    c2 = Reporting()
    c2.add(1, 1, 8)
    ctl2 = _ctl(tmp_path / "b", c2, Scripted({"1": (8, {0: 4, 1: 4}, 64)}), restart_cost_s=0.0)
    ctl2.config = replace(ctl2.config, settings=replace(CFG.settings, min_run_s=50.0))
    ctl2.cycle()
    ctl2.policy.plans["1"] = (2, {0: 2}, 64)  # type: ignore[attr-defined]
    c2.t += 40
    ctl2.cycle()
    assert ("signal", 1) not in c2.log
    c2.t += 20
    ctl2.cycle()
    assert ("signal", 1) in c2.log


def test_a_batch_only_change_rewrites_the_running_launchs_plan(tmp_path: Path) -> None:
    c = Reporting()
    c.add(1, 1, 8)
    c.add(2, 1, 8)
    c.set(2, tags={**c.jobs[2].job.tags, "mode": "sidecar"})
    policy = Scripted({"1": (4, {0: 4}, 64), "2": (4, {1: 4}, 64)})
    ctl = _ctl(tmp_path, c, policy)
    ctl.cycle()
    ctl.cycle()
    assert c.plans[1].launch == 0 and c.plans[1].global_batch == 64
    policy.plans = {"1": (4, {0: 4}, 256), "2": (4, {1: 4}, 256)}
    before = list(c.log)
    ctl.cycle()
    assert c.log == before  # no Slurm action: no signal, no restart
    plan = c.plans[1]
    assert (plan.launch, plan.global_batch, plan.gpus) == (0, 256, 4)  # same launch
    assert c.plans[2].global_batch == 64  # a sidecar job keeps its batch
    assert [d.action for d in ctl.store.decisions(1)][-1] == "rebatch"
    ctl.cycle()
    assert len([d for d in ctl.store.decisions(1) if d.action == "rebatch"]) == 1


def _steps(c: Reporting, job: int, batch: int) -> None:
    """Job ``job`` reports steps at global batch ``batch`` on its 4 GPUs."""
    c.lines[f"/jobs/{job}"].append(
        {"event": "steps", "time": c.t, "step": 10, "steps": 10, "step_time": 0.5,
         "samples_per_s": batch / 0.5, "global_batch": batch, "per_gpu_batch": batch // 4,
         "accum_steps": 1, "gpus": 4}
    )  # fmt: skip


def _started(tmp_path: Path) -> tuple[Reporting, Scripted, Controller]:
    """One job started at batch 64 on 4 GPUs by the arrival's round (at t 1000), 60 s
    rounds brought forward to 15 s by a first report."""
    c = Reporting()
    c.add(1, 1, 8)
    policy = Scripted({"1": (4, {0: 4}, 64)})
    ctl = _ctl(tmp_path, c, policy, round_s=60.0, measured_round=0.25)
    ctl.cycle()
    ctl.cycle()
    return c, policy, ctl


def test_a_first_report_at_a_new_batch_brings_the_next_round_forward(tmp_path: Path) -> None:
    """A new job's batch (and GPUs) are found in steps: each waits for its first report at
    what it was given. That report brings the next round forward to a quarter of
    ``round_s`` after the last (``measured_round``), once per launch or batch change the
    controller made: a job cannot bring rounds forward by what it reports."""
    c, policy, ctl = _started(tmp_path)
    rounds = len(policy.seen)
    for dt, batch in ((5, 100), (5, 32), (5, 100)):  # not the batch it was given
        c.t += dt
        _steps(c, 1, batch)
        ctl.cycle()
    assert len(policy.seen) == rounds  # 15 s, nothing brought forward
    c.t = 1020.0
    _steps(c, 1, 64)
    ctl.cycle()
    assert len(policy.seen) == rounds + 1  # its first report at 64: a round at once
    policy.plans["1"] = (4, {0: 4}, 128)
    for t in (1025.0, 1030.0, 1034.0):  # more reports at 64; a rebatch to 128 at 1030
        c.t = t
        _steps(c, 1, 64)
        ctl.cycle()
    assert len(policy.seen) == rounds + 1
    assert c.plans[1].global_batch == 64  # not yet: the next round is at 1080
    c.t = 1080.0
    ctl.cycle()
    assert (c.plans[1].launch, c.plans[1].global_batch) == (0, 128)  # a rebatch
    rounds = len(policy.seen)
    c.t = 1085.0
    _steps(c, 1, 128)
    ctl.cycle()
    assert len(policy.seen) == rounds  # 5 s after the round: due at 1095
    c.t = 1095.0
    ctl.cycle()
    assert len(policy.seen) == rounds + 1
    for t in (1100.0, 1110.0, 1150.0):  # the same batch again: the round is every 60 s
        c.t = t
        _steps(c, 1, 128)
        ctl.cycle()
    assert len(policy.seen) == rounds + 1


def test_a_job_that_provokes_rebatches_brings_few_rounds_forward(tmp_path: Path) -> None:
    """A job whose reports lead the policy to change its batch at every round (here: the
    plan flips between two batches, and the job reports each at once) brings the next
    round forward only for the first few changes of a launch, not every 15 s for ever."""
    c, policy, ctl = _started(tmp_path)
    start = len(policy.seen)
    for _ in range(40):  # 400 s, a cycle every 10 s
        c.t += 10
        _steps(c, 1, c.plans[1].global_batch)
        batch = 128 if c.plans[1].global_batch == 64 else 64
        policy.plans["1"] = (4, {0: 4}, batch)
        ctl.cycle()
    rebatches = [d for d in ctl.store.decisions(1) if d.action == "rebatch"]
    early = len(policy.seen) - start - 400 // 60
    assert len(rebatches) >= 5
    assert 1 <= early <= 1 + MEASURED_REBATCHES


def test_a_batch_the_job_already_reports_awaits_nothing(tmp_path: Path) -> None:
    """A rebatch to the batch the job already reports (a plan that rounds to it) is no new
    measurement: its next report brings no round forward."""
    c, policy, ctl = _started(tmp_path)
    c.t += 20
    _steps(c, 1, 128)  # the job reports a batch of its own (its script chose it)
    ctl.cycle()  # its first report: not at 64, nothing brought forward
    policy.plans["1"] = (4, {0: 4}, 128)
    c.t = 1060.0
    ctl.cycle()  # the round: a rebatch to what it reports
    assert c.plans[1].global_batch == 128
    rounds = len(policy.seen)
    c.t = 1080.0
    _steps(c, 1, 128)
    ctl.cycle()
    assert len(policy.seen) == rounds


@dataclass
class SeesFixed(Scripted):
    """A scripted policy that plans around the jobs that keep their GPUs (as ONES does)."""

    sees_fixed: bool = True


def test_a_launch_too_young_to_stop_still_takes_a_new_batch(tmp_path: Path) -> None:
    """A launch that has not trained for its restart cost keeps its GPUs, but a batch
    change costs no restart: a policy that plans around it (here while a third job waits)
    gives it the batch its first measurements call for at once, not once it may be
    stopped. A sidecar job (no live batch) keeps its batch; a plan at other GPUs waits."""
    c = Reporting()
    c.add(1, 1, 8)
    c.add(2, 1, 8)
    c.set(2, tags={**c.jobs[2].job.tags, "mode": "sidecar"})
    c.add(3, 1, 8)
    policy = SeesFixed({"1": (4, {0: 4}, 64), "2": (2, {1: 2}, 64)})
    ctl = _ctl(tmp_path, c, policy, restart_cost_s=30.0)
    ctl.cycle()
    c.t += 5
    ctl.cycle()  # 1 and 2 running, 5 s trained; 3 queued, 2 GPUs free
    policy.plans = {"1": (4, {0: 4}, 256), "2": (2, {1: 2}, 256)}
    c.t += 5
    ctl.cycle()
    assert not [a for a in c.log if a[0] == "signal"]
    assert (c.plans[1].launch, c.plans[1].global_batch, c.plans[1].gpus) == (0, 256, 4)
    assert c.plans[2].global_batch == 64  # a sidecar job keeps its batch
    assert [d.action for d in ctl.store.decisions(1)][-1] == "rebatch"
    assert not [d for d in ctl.store.decisions(2) if d.action == "rebatch"]
    policy.plans["1"] = (8, {0: 4, 1: 4}, 512)  # other GPUs: a restart, not yet allowed
    c.t += 5
    ctl.cycle()
    assert not [a for a in c.log if a[0] == "signal"]
    assert c.plans[1].global_batch == 256  # nor the batch that came with them


def test_the_memory_view_is_what_the_store_holds(tmp_path: Path) -> None:
    c = Reporting()
    c.add(1, 1, 8)
    c.add(2, 2, 4)
    policy = Scripted({"1": (4, {0: 4}, 64), "2": (4, {1: 4}, 64)})
    ctl = _ctl(tmp_path, c, policy)
    for _ in range(3):
        ctl.cycle()
        c.t += 1

    def stored() -> dict[int, tuple[Any, ...]]:
        return {r.slurm_id: job_row(r) for r in ctl.store.jobs()}

    assert stored() == {s: job_row(r) for s, r in ctl.records.all.items()}

    # a cycle that fails half-way leaves nothing in memory that the store does not hold
    # (a failing policy is caught and its plan ignored: here the log line of the job's
    # end raises, after the record moved to done in memory, before anything is stored)
    def broken_log(msg: str) -> None:
        raise RuntimeError(msg)

    ctl.log = broken_log
    c.set(2, state="COMPLETED", exit_code=0)
    with pytest.raises(RuntimeError):
        ctl.cycle()
    assert stored() == {s: job_row(r) for s, r in ctl.records.all.items()}
    assert ctl.records.get(2) is not None and ctl.records.get(2).phase == "running"  # type: ignore[union-attr]
    ctl.log = lambda m: None
    ctl.cycle()
    assert ctl.store.job(2).phase == "done"  # type: ignore[union-attr]
    assert stored() == {s: job_row(r) for s, r in ctl.records.all.items()}


def test_jobs_in_a_transition_are_shown_where_they_are_going() -> None:
    def rec(sid: int, phase: str, **kw: Any) -> JobRecord:
        base = JobRecord(sid, f"j{sid}", "j", "u", "", "app", 1, 8, 64, 512, 64, 0.0, phase, 0.0)
        return replace(base, **kw)

    nodes = FakeCluster().observe().nodes
    records = [
        rec(1, "starting", target_gpus=3, target_placement=json.dumps({1: 3})),
        rec(2, "stopping", gpus=4, node_list="n1", target_gpus=1,
            target_placement=json.dumps({0: 1})),
        rec(3, "stopping", gpus=2, node_list="n1", target_gpus=0),
        rec(4, "running", gpus=2, node_list="n1,n2", node_gpus="1,1", ready=1),
    ]  # fmt: skip
    # (4 GPUs a node: a placement that no longer fits beside what runs is shown unplaced)
    snap = build_snapshot(100.0, nodes, records, {}, (), {}, 60.0, 30.0)
    views = {v.job_id: v for v in snap.jobs}
    assert (views["1"].gpus, dict(views["1"].placement), views["1"].resizable) == (3, {1: 3}, False)
    assert (views["2"].gpus, dict(views["2"].placement), views["2"].resizable) == (1, {0: 1}, False)
    assert (views["3"].gpus, views["3"].resizable) == (0, False)  # being preempted
    assert dict(views["4"].placement) == {0: 1, 1: 1} and views["4"].rebatch
