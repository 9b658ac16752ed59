"""Exact placements: what the policy plans (GPUs per node, on named nodes, in rank order)
is the shape handed to the cluster, and an uneven one is released only when Slurm's way of
spreading a job's GPU count leaves exactly the planned split.

Pure logic and a fake cluster that spreads GPUs the way Slurm 22.05 does (measured on the
local pool, see hpcorch/slurm/backend.py's shape_args); tests/integration/
test_exact_placement.py runs a 4+2 plan on the real pool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcorch.cluster import Observation, ObservedJob, PoolNode, Shape, fill_gpus
from hpcorch.controller import reconcile
from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.reconcile import Settings, launch_wait, target_shape
from hpcorch.controller.service import serve
from hpcorch.controller.snapshot import placement_of
from hpcorch.controller.store import JobRecord, Store
from hpcorch.planner import LaunchPlan
from hpcorch.policy.types import JobPlan, Plan, Snapshot


def record(**kw: Any) -> JobRecord:
    base: dict[str, Any] = dict(
        slurm_id=7,
        job_key="j7",
        name="j",
        user="u",
        job_dir="",
        app="a",
        min_gpus=1,
        max_gpus=8,
        batch=64,
        max_batch=64,
        max_micro=64,
        submit_time=0.0,
        phase="queued",
        phase_since=0.0,
    )
    base.update(kw)
    return JobRecord(**base)


def test_slurm_fill_one_per_node_then_in_node_order() -> None:
    # the allocations measured on the local pool (4 GPUs per node)
    assert fill_gpus(6, [4, 4]) == (4, 2)
    assert fill_gpus(7, [4, 4, 4]) == (4, 2, 1)
    assert fill_gpus(9, [4, 4, 4]) == (4, 4, 1)
    assert fill_gpus(6, [2, 4]) == (2, 4)  # two GPUs of the first node taken by another job
    assert fill_gpus(5, [4, 0]) is None and fill_gpus(9, [4, 4]) is None


def test_target_shape_is_the_planned_placement_in_rank_order() -> None:
    pool = ("n1", "n2", "n3", "n4")
    rec = record(target_gpus=6, target_cpus=3, target_placement=json.dumps({3: 4, 1: 2}))
    assert target_shape(rec, pool) == Shape(2, 4, ("n4", "n2"), 3, (4, 2))
    even = record(target_gpus=4, target_placement=json.dumps({2: 2, 0: 2}))
    assert target_shape(even, pool) == Shape(2, 2, ("n3", "n1"), 0, (2, 2))
    # a planned node the pool no longer has: the fewest even nodes, Slurm chooses
    gone = record(target_gpus=6, target_placement=json.dumps({7: 4, 1: 2}))
    assert target_shape(gone, pool) == Shape(2, 3)


def nodes(free: Sequence[int], gpus: int = 4) -> tuple[PoolNode, ...]:
    return tuple(PoolNode(f"n{i + 1}", gpus, gpus - f, True) for i, f in enumerate(free))


def test_an_uneven_launch_waits_until_the_free_gpus_leave_one_split() -> None:
    four_two = Shape(2, 4, ("n2", "n1"), 0, (4, 2))  # 4 on n2, 2 on n1
    b = {"n1": 2}  # another job starting beside it is to take two GPUs of n1
    assert launch_wait(four_two, nodes([4, 4]), claimed=b) != ""  # Slurm would put 4 on n1
    assert launch_wait(four_two, nodes([2, 4]), claimed=b) == ""  # now they are taken
    assert launch_wait(four_two, nodes([2, 2])) != ""  # n2 still held (a stopping job)
    assert launch_wait(Shape(2, 4, ("n1", "n2"), 0, (4, 2)), nodes([4, 4]), claimed=b) == ""
    assert launch_wait(Shape(2, 2, ("n1", "n2"), 0, (2, 2)), nodes([0, 0])) == ""  # even
    # n1's other GPUs are idle in the plan: waiting cannot help, it goes with Slurm's split
    assert launch_wait(four_two, nodes([4, 4])) == ""
    # after the limit it goes with Slurm's split if that takes no GPU another start is to
    # take; never before the planned GPUs are free
    assert launch_wait(four_two, nodes([4, 4]), waited_s=11, limit_s=10, claimed=b) != ""
    one_three = Shape(2, 3, ("n1", "n2"), 0, (1, 3))  # Slurm: 2 on n1, 2 on n2 of 8 free
    two = {"n2": 2}
    assert launch_wait(one_three, nodes([2, 8], 8), waited_s=9, limit_s=10, claimed=two) != ""
    assert launch_wait(one_three, nodes([2, 8], 8), waited_s=11, limit_s=10, claimed=two) == ""
    assert launch_wait(four_two, nodes([2, 2]), waited_s=11, limit_s=10) != ""


def test_the_policy_sees_a_running_uneven_job_on_its_real_counts() -> None:
    rec = record(phase="running", gpus=6, node_list="n1,n2", node_gpus="2,4")
    assert placement_of(rec, {"n1": 0, "n2": 1}) == {0: 2, 1: 4}
    old = record(phase="running", gpus=4, node_list="n1,n2")  # reported before node_gpus
    assert placement_of(old, {"n1": 0, "n2": 1}) == {0: 2, 1: 2}


@dataclass
class FillCluster:
    """Slurm in miniature, with Slurm's spread of a per-job GPU count."""

    free: list[int]
    t: float = 1000.0
    jobs: dict[int, ObservedJob] = field(default_factory=dict)
    started: list[tuple[int, Shape]] = field(default_factory=list)
    plans: list[LaunchPlan] = field(default_factory=list)
    calls: int = 0
    call_seconds: float = 0.0

    def longest_call(self) -> float:
        return 0.0

    def now(self) -> float:
        return self.t

    def observe(self) -> Observation:
        self.calls += 2
        pool = tuple(PoolNode(f"n{i + 1}", 4, 4 - f, True) for i, f in enumerate(self.free))
        return Observation(self.t, pool, tuple(self.jobs.values()))

    def start(self, slurm_id: int, shape: Shape) -> None:
        self.started.append((slurm_id, shape))
        order = sorted(shape.node_names, key=lambda n: int(n[1:]))
        counts = fill_gpus(shape.gpus, [self.free[int(n[1:]) - 1] for n in order])
        assert counts is not None
        for n, c in zip(order, counts, strict=True):
            self.free[int(n[1:]) - 1] -= c
        self.jobs[slurm_id] = replace(
            self.jobs[slurm_id],
            state="RUNNING",
            held=False,
            node_names=tuple(order),
            gpus_per_node=max(counts),
            per_node=counts,
        )

    def hold(self, slurm_id: int) -> None: ...

    def flush(self, send: bool = True) -> dict[int, str]:
        return {}

    def signal_checkpoint(self, slurm_id: int) -> None: ...
    def requeue_hold(self, slurm_id: int) -> None: ...
    def cancel(self, slurm_id: int) -> None: ...

    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        self.plans.append(plan)

    def read_metrics(
        self, job_dir: str, offset: int, uid: int
    ) -> tuple[Sequence[dict[str, Any]], int]:
        return [], offset


class FixedPlan:
    """Job 7 on 4 GPUs of n2 and 2 of n1 (rank order); job 8 on the other 2 of n1."""

    name = "fixed"

    def schedule(self, snapshot: Snapshot) -> Plan:
        plans = {
            "7": JobPlan("7", 6, {1: 4, 0: 2}, 96, 16, 1),
            "8": JobPlan("8", 2, {0: 2}, 2, 1, 1),
        }
        return Plan(tuple(plans[j.job_id] for j in snapshot.jobs if j.job_id in plans))


def test_the_controller_releases_an_uneven_start_once_slurm_can_only_split_it_as_planned(
    tmp_path: Path,
) -> None:
    c = FillCluster(free=[4, 4])
    for sid, lo in ((7, "6"), (8, "2")):
        c.jobs[sid] = ObservedJob(
            sid, f"j{sid}", "u", "PENDING", True, "", (), 0, 0, 0, c.t, 0,
            {"id": f"j{sid}", "min": lo, "max": lo, "micro": "16"},
        )  # fmt: skip
    cfg = LoopConfig(round_s=0, settings=Settings(min_run_s=0, startup_s=0, exact_wait_s=60))
    ctl = Controller(c, Store(tmp_path / "s.db"), FixedPlan(), cfg, log=lambda m: None)
    ctl.cycle()
    # job 8 (even) is released at once; job 7 waits: with n1 all free Slurm would put 4 there
    assert c.started == [(8, Shape(1, 2, ("n1",), 0, (2,)))]
    rec = ctl.store.job(7)
    assert rec is not None and rec.phase == "starting" and "leave one split" in rec.reason
    c.t += 1
    ctl.cycle()  # job 8 holds two of n1's GPUs now: the free GPUs leave one split
    assert c.started[1:] == [(7, Shape(2, 4, ("n2", "n1"), 0, (4, 2)))]
    assert c.jobs[7].node_names == ("n1", "n2") and c.jobs[7].per_node == (2, 4)
    c.t += 1
    ctl.cycle()
    rec = ctl.store.job(7)
    assert rec is not None and rec.phase == "running" and rec.gpus == 6
    assert rec.node_gpus == "2,4"
    assert reconcile.target_shape(rec, ("n1", "n2")).node_names == ("n2", "n1")


def test_run_polls_fast_only_while_a_transition_is_in_flight(tmp_path: Path) -> None:
    """While a job starts, cycles come every fast_interval_s, but no more Slurm calls a
    second than max_calls_per_s allows, and fast cycles read no metrics of settled jobs;
    once it runs, a cycle every interval_s."""
    c = FillCluster(free=[2, 4])
    c.jobs[7] = ObservedJob(
        7,
        "j7",
        "u",
        "PENDING",
        True,
        "",
        (),
        0,
        0,
        0,
        c.t,
        0,
        {"id": "j7", "min": "6", "dir": "/j7"},
    )
    reads: list[float] = []

    def read_metrics(job_dir: str, offset: int, uid: int) -> tuple[list[dict[str, Any]], int]:
        reads.append(c.t)
        return [{"event": "start"}], offset + 1

    c.read_metrics = read_metrics  # type: ignore[method-assign]
    cfg = LoopConfig(
        interval_s=10,
        fast_interval_s=0.1,
        max_calls_per_s=8,
        round_s=1e9,
        settings=Settings(min_run_s=0, startup_s=0),
    )
    ctl = Controller(c, Store(tmp_path / "s.db"), FixedPlan(), cfg, log=lambda m: None)
    real_start = c.start

    def start(slurm_id: int, shape: Shape) -> None:  # released; Slurm runs it 1 s later
        real_start(slurm_id, shape)
        c.jobs[slurm_id] = replace(c.jobs[slurm_id], state="PENDING", held=False)

    c.start = start  # type: ignore[method-assign]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(round(seconds, 2))
        c.t += seconds
        if len(sleeps) == 4:
            c.jobs[7] = replace(c.jobs[7], state="RUNNING")

    serve(ctl, lambda: len(sleeps) >= 7, sleep)
    # 2 Slurm calls a cycle at most 8 a second: 0.25 s apart (not 0.1) while starting
    assert sleeps[:4] == [0.25, 0.25, 0.25, 0.25]
    # seen running at the 5th cycle: then the next full cycle, 10 s after the first
    assert sleeps[4:] == [9.0, 10.0, 10.0]
    # the job's report read as soon as it runs (a fast cycle), then at full cycles
    assert reads == [1001.0, 1010.0, 1020.0]


def test_two_uneven_starts_that_wait_for_each_other_do_not_wait_forever() -> None:
    """Seen at the end of a 2,000-job run on Slurm 22.05: ten large jobs on an empty pool,
    each planned unevenly on nodes another start was to share, each waiting until the
    other took its GPUs first; after 90 s every one was planned again, the same way, for
    half an hour. Past ``exact_wait_s`` the start no other start with a lower id shares a
    node with goes with Slurm's split (it may take GPUs the other was to take; that one
    is then found blocked and planned again at once)."""
    s = Settings(exact_wait_s=10.0)
    a = record(slurm_id=5, phase="starting", phase_since=0.0, target_gpus=6,
               target_placement=json.dumps({0: 2, 1: 4}))  # fmt: skip
    b = record(slurm_id=6, phase="starting", phase_since=0.0, target_gpus=6,
               target_placement=json.dumps({0: 2, 2: 4}))  # fmt: skip
    pool = ("n1", "n2", "n3")
    free = nodes([4, 4, 4])  # Slurm would put 4 on n1 for either: the other's 2 with them
    claims = reconcile.start_claims([a, b], pool)
    shape_a, shape_b = target_shape(a, pool), target_shape(b, pool)
    assert reconcile.start_wait(a, shape_a, free, 5.0, s, claims) != ""  # not yet
    assert reconcile.start_wait(a, shape_a, free, 11.0, s, claims) == ""  # the first goes
    assert reconcile.start_wait(b, shape_b, free, 11.0, s, claims) != ""  # the other waits
