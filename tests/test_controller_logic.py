"""The controller's logic against a scripted fake cluster: transitions, restarts, retries.

The real-Slurm behaviour is covered by tests/integration/test_controller.py; here every
path of the state machine is driven quickly and deterministically.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from hpcorch.cluster import Observation, ObservedJob, PoolNode, Shape
from hpcorch.controller.actions import Action
from hpcorch.controller.execute import Executor, act
from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.reconcile import REQUEUE_WAIT_S, Settings
from hpcorch.controller.store import JobRecord, StateError, Store
from hpcorch.errors import SlurmUnavailable
from hpcorch.planner import LaunchPlan
from hpcorch.policy.share import SharePolicy
from hpcorch.protocol import EXIT_LAUNCH_LOST, EXIT_STORAGE


@dataclass
class FakeJob:
    job: ObservedJob
    exit_on_signal: bool = True


@dataclass
class FakeCluster:
    """Slurm in miniature: held jobs start at once, signalled jobs exit 75 at once."""

    nodes: int = 2
    gpus_per_node: int = 4
    t: float = 1000.0
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    log: list[tuple[str, int]] = field(default_factory=list)
    plans: dict[int, LaunchPlan] = field(default_factory=dict)
    shapes: list[Shape] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    calls: int = 0
    call_seconds: float = 0.0
    longest: float = 0.0
    """The longest call since ``longest_call`` was last asked."""
    answers: bool = True
    """Whether slurmctld answers (``ping``)."""

    def longest_call(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest

    def ping(self) -> None:
        self.calls += 1
        if not self.answers:
            raise SlurmUnavailable("Slurm is not reachable (scontrol: Socket timed out)")

    def add(self, job_id: int, lo: int, hi: int, held: bool = True) -> None:
        tags = {
            "id": f"j{job_id}",
            "min": str(lo),
            "max": str(hi),
            "batch": "64",
            "dir": f"/jobs/{job_id}",
        }
        self.jobs[job_id] = FakeJob(
            ObservedJob(
                job_id,
                f"j{job_id}",
                "alice",
                "PENDING",
                held,
                "JobHeldUser",
                (),
                0,
                0,
                0,
                self.t,
                0,
                tags,
            )
        )

    def set(self, job_id: int, **kw: Any) -> None:
        self.jobs[job_id].job = replace(self.jobs[job_id].job, **kw)

    def state(self, job_id: int) -> str:
        return self.jobs[job_id].job.state

    def now(self) -> float:
        return self.t

    def observe(self) -> Observation:
        self.calls += 2
        used = [0] * self.nodes
        for fj in self.jobs.values():
            if fj.job.state == "RUNNING":
                for n in fj.job.node_names:
                    used[int(n[1:]) - 1] += fj.job.gpus_per_node
        nodes = tuple(
            PoolNode(f"n{i + 1}", self.gpus_per_node, used[i], f"n{i + 1}" not in self.down)
            for i in range(self.nodes)
        )
        return Observation(self.t, nodes, tuple(fj.job for fj in self.jobs.values()))

    def start(self, slurm_id: int, shape: Shape) -> None:
        self.log.append(("start", slurm_id))
        self.shapes.append(shape)
        names = shape.node_names or tuple(f"n{i + 1}" for i in range(shape.nodes))
        self.set(
            slurm_id,
            state="RUNNING",
            held=False,
            node_names=names,
            gpus_per_node=shape.gpus_per_node,
            special_exit=False,
        )

    admin: bool = True
    """Whether holds are admin holds (the controller is a Slurm operator)."""

    def flush(self, send: bool = True) -> dict[int, str]:
        return {}

    def hold(self, slurm_id: int) -> None:
        self.log.append(("hold", slurm_id))
        if self.state(slurm_id) == "PENDING":
            self.set(slurm_id, held=True, reason="JobHeldAdmin" if self.admin else "JobHeldUser")

    requeue_self: bool = False
    """Signalled jobs requeue themselves held in SPECIAL_EXIT (hpcorch's wrapper) instead of
    ending with exit code 75 (a wrapper whose requeue Slurm refused)."""

    def signal_checkpoint(self, slurm_id: int) -> None:
        self.log.append(("signal", slurm_id))
        if self.jobs[slurm_id].exit_on_signal:
            self.checkpointed(slurm_id)

    def checkpointed(self, slurm_id: int) -> None:
        """The job checkpointed and asks for its relaunch, as ``requeue_self`` says."""
        if not self.requeue_self:
            self.set(slurm_id, state="FAILED", exit_code=75)
            return
        j = self.jobs[slurm_id].job
        self.set(
            slurm_id,
            state="PENDING",
            held=True,
            special_exit=True,
            reason="job_requeued_in_held_state",
            node_names=(),
            restarts=j.restarts + 1,
        )

    def requeue_hold(self, slurm_id: int) -> None:
        self.log.append(("requeue_hold", slurm_id))
        j = self.jobs[slurm_id].job
        self.set(
            slurm_id,
            state="PENDING",
            held=True,
            reason="JobHeldUser",
            node_names=(),
            restarts=j.restarts + 1,
        )

    def cancel(self, slurm_id: int) -> None:
        self.set(slurm_id, state="CANCELLED")

    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        self.plans[slurm_id] = plan

    def read_metrics(
        self, job_dir: str, offset: int, uid: int
    ) -> tuple[Sequence[dict[str, Any]], int]:
        return [], offset


CFG = LoopConfig(
    interval_s=1,
    round_s=0,
    restart_cost_s=0,  # the fake clock stands still: a launch may be resized at once
    settings=Settings(min_run_s=0, grace_s=30, max_retries=1, startup_s=0, relaunch_delay_s=0),
)


def controller(tmp_path: Path, cluster: FakeCluster, **settings: float) -> Controller:
    """A controller on ``cluster`` with CFG, its Settings overridden by ``settings``."""
    cfg = replace(CFG, settings=replace(CFG.settings, **settings))
    return Controller(cluster, Store(tmp_path / "state.db"), SharePolicy(), cfg, log=lambda m: None)


def test_a_held_job_is_started_at_its_share(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    assert c.log == [("start", 1)] and c.jobs[1].job.gpus == 8
    assert c.plans[1].gpus == 8 and c.plans[1].global_batch == 64
    ctl.cycle()
    assert ctl.store.job(1).phase == "running"  # type: ignore[union-attr]


def test_arrival_shrinks_and_departure_grows(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 4, 4)
    ctl.cycle()  # policy: job 1 -> 4 GPUs: signal
    assert ("signal", 1) in c.log and c.state(1) == "FAILED"
    ctl.cycle()  # exit 75 seen: requeue held, reshape, release
    assert c.log[-2:] == [("requeue_hold", 1), ("start", 1)] and c.jobs[1].job.gpus == 4
    assert c.state(2) == "RUNNING" and c.jobs[2].job.gpus == 4
    rec = ctl.store.job(1)
    assert rec is not None and rec.resizes == 1 and rec.reason == "resized 8 -> 4 GPUs"
    c.set(2, state="COMPLETED", exit_code=0)
    for _ in range(3):
        ctl.cycle()
    assert c.jobs[1].job.gpus == 8 and ctl.store.job(2).phase == "done"  # type: ignore[union-attr]


def _signalled_for_a_newcomer(tmp_path: Path) -> tuple[FakeCluster, Controller]:
    """Job 1 alone on 8 GPUs, then job 2 (4 GPUs) arrives: job 1 is signalled to shrink to
    4 and has not checkpointed yet; its wrapper will requeue it itself (``requeue_self``)."""
    c = FakeCluster(requeue_self=True)
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 4, 4)
    c.jobs[1].exit_on_signal = False
    ctl.cycle()  # policy: job 1 -> 4 GPUs: signal
    assert ("signal", 1) in c.log
    return c, ctl


def test_a_job_that_requeued_itself_is_relaunched_at_its_new_size_once(tmp_path: Path) -> None:
    """hpcorch's wrapper requeues its job held in SPECIAL_EXIT after the checkpoint (so that
    accounting shows a requeue): the controller starts it at its new size, with no requeue
    of its own, and does not take the still-pending job for a second checkpoint."""
    c, ctl = _signalled_for_a_newcomer(tmp_path)
    c.checkpointed(1)
    c.start = lambda slurm_id, shape: c.log.append(("start", slurm_id))  # type: ignore[method-assign]
    ctl.cycle()  # requeued held by itself: reshape and release, no requeue_hold
    assert c.log[-1] == ("start", 1) and ("requeue_hold", 1) not in c.log
    rec = ctl.store.job(1)
    assert rec is not None and rec.resizes == 1 and rec.reason == "resized 8 -> 4 GPUs"
    assert rec.phase == "starting"
    ctl.cycle()  # Slurm has not run it yet: the start is redone, not a second relaunch
    rec = ctl.store.job(1)
    assert rec is not None and rec.resizes == 1 and rec.time_relaunches == 0
    assert c.log.count(("start", 1)) == 3  # the first launch, the relaunch, its redo
    del c.start
    ctl.cycle()
    assert c.state(1) == "RUNNING" and c.jobs[1].job.gpus == 4


def test_a_controller_killed_after_the_job_requeued_itself_relaunches_it(tmp_path: Path) -> None:
    c, ctl = _signalled_for_a_newcomer(tmp_path)
    ctl.store.close()
    c.checkpointed(1)  # while no controller runs
    ctl2 = controller(tmp_path, c)
    ctl2.cycle()
    assert c.log.count(("start", 1)) == 2 and ("requeue_hold", 1) not in c.log
    assert c.jobs[1].job.gpus == 4 and c.state(1) == "RUNNING"


def test_controller_killed_mid_resize_resumes_without_repeating(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 4, 4)
    c.jobs[1].exit_on_signal = False  # the checkpoint takes a while
    ctl.cycle()
    assert ctl.store.job(1).phase == "stopping"  # type: ignore[union-attr]
    ctl.store.close()
    # "kill -9": a new controller on the same state; the job now exits 75
    c.set(1, state="FAILED", exit_code=75)
    ctl2 = controller(tmp_path, c)
    ctl2.cycle()
    starts = [e for e in c.log if e == ("start", 1)]
    assert len(starts) == 2  # the first launch and the relaunch, nothing twice
    assert c.jobs[1].job.gpus == 4 and c.jobs[1].job.restarts == 1


def test_interrupted_start_is_redone_from_the_store(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    real_start = c.start
    c.start = lambda *a: None  # type: ignore[method-assign]  # "killed" before the release
    ctl.cycle()
    assert c.state(1) == "PENDING" and ctl.store.job(1).phase == "starting"  # type: ignore[union-attr]
    c.start = real_start  # type: ignore[method-assign]
    controller(tmp_path, c).cycle()
    assert c.state(1) == "RUNNING" and c.jobs[1].job.gpus == 2
    interrupted = [d for d in Store(tmp_path / "state.db").decisions() if d.status == "interrupted"]
    assert interrupted == []  # the first start finished (as a no-op), it was not left pending


def test_no_checkpoint_within_grace_is_requeued_by_force(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.jobs[1].exit_on_signal = False
    c.add(2, 4, 4)
    ctl.cycle()
    c.t += 31
    ctl.cycle()
    assert c.log[-1] == ("requeue_hold", 1)
    assert "no checkpoint within 30 s" in ctl.store.job(1).reason  # type: ignore[union-attr]
    ctl.cycle()
    assert c.state(1) == "RUNNING" and c.jobs[1].job.gpus == 4


def test_failures_are_retried_then_left_failed(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.set(1, state="FAILED", exit_code=1)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "queued" and c.state(1) == "PENDING"
    assert rec.reason == "failed with exit code 1: retry 1/1 from the last checkpoint in 2 s"
    ctl.cycle()
    assert c.state(1) == "PENDING"  # backing off, its GPUs free
    c.t += 2
    ctl.cycle()
    assert c.state(1) == "RUNNING"
    c.set(1, state="FAILED", exit_code=3)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "failed"
    assert rec.reason == "failed with exit code 3; gave up after 1 retries"


def test_cancelled_and_vanished_jobs_are_recorded(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 1)
    c.add(2, 1, 1)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    c.cancel(1)
    del c.jobs[2]
    ctl.cycle()
    assert ctl.store.job(1).phase == "cancelled"  # type: ignore[union-attr]
    assert ctl.store.job(2).phase == "lost"  # type: ignore[union-attr]


def test_a_cycle_costs_a_bounded_number_of_calls(tmp_path: Path) -> None:
    c = FakeCluster(nodes=4)
    for i in range(500):
        c.add(i + 1, 1, 4)
    stats = controller(tmp_path, c).cycle()
    assert stats.jobs == 500
    assert stats.slurm_calls == 2  # one observation; actions are counted by the real side
    assert sum(1 for e in c.log if e[0] == "start") == 16


def test_a_corrupt_state_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"this is not a database" * 100)
    before = db.read_bytes()
    with pytest.raises(StateError, match="unreadable or corrupt"):
        Store(db)
    assert db.read_bytes() == before


def test_a_launch_is_not_signalled_before_it_reports_its_start(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, startup_s=600)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 4, 4)
    ctl.cycle()
    assert ("signal", 1) not in c.log  # still importing torch, as far as anyone knows
    c.read_metrics = lambda d, o, u: ([{"event": "start", "epochs": 3}], o + 1)  # type: ignore[method-assign]
    ctl.cycle()
    assert ("signal", 1) in c.log


def test_relaunch_waits_for_the_second_after_the_end_was_seen(tmp_path: Path) -> None:
    c = FakeCluster(t=1000.4)
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, relaunch_delay_s=1)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 4, 4)
    ctl.cycle()  # job 1 signalled; it exits 75 at once
    ctl.cycle()  # the end seen at 1000.4: requeued at once, released from 1001.0 on
    assert [e for e in c.log if e[1] == 1][-1] == ("requeue_hold", 1)
    c.t = 1000.9
    ctl.cycle()
    # waiting, the requeue's user hold is made the controller's own (an admin hold)
    mine = [e for e in c.log if e[1] == 1 and e[0] != "hold"]
    assert mine[-1] == ("requeue_hold", 1)
    assert c.log[-1] == ("hold", 1)
    assert "let go of the last run" in ctl.store.job(1).reason  # type: ignore[union-attr]
    c.t = 1001.0
    ctl.cycle()
    mine = [e for e in c.log if e[1] == 1 and e[0] != "hold"]
    assert mine[-2:] == [("requeue_hold", 1), ("start", 1)]


def test_a_job_requeued_after_a_node_failure_is_planned_again_on_the_nodes_in_service(
    tmp_path: Path,
) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    assert c.shapes[-1].node_names == ("n1",)
    c.down.add("n1")
    ctl.cycle()  # still RUNNING as far as Slurm knows: nothing asked of it, no invalid plan
    assert c.log == [("start", 1)]
    c.set(1, state="PENDING", held=False, node_names=(), restarts=1)  # Slurm requeued it
    ctl.cycle()  # left to Slurm a while: the node may come back
    assert c.log == [("start", 1)]
    assert "requeued by Slurm" in ctl.store.job(1).reason  # type: ignore[union-attr]
    c.t += REQUEUE_WAIT_S
    ctl.cycle()  # held and planned again, on the nodes in service
    ctl.cycle()
    assert c.log[-2:] == [("hold", 1), ("start", 1)] and c.shapes[-1].node_names == ("n2",)
    ctl.cycle()
    assert c.log.count(("start", 1)) == 2  # started once


def test_a_job_requeued_by_slurm_is_left_to_slurm_while_its_node_may_return(
    tmp_path: Path,
) -> None:
    """Slurm requeues a job after a node failure (pending, not held, its node list naming
    the failed node). If the node comes back (slurmd restarted), Slurm starts it there and
    the controller asks nothing; a job still pending after REQUEUE_WAIT_S is restarted
    anywhere (it was left pending on the dead node for good: seen on the real pool)."""
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c, relaunch_delay_s=1.0)
    ctl.cycle()
    ctl.cycle()
    c.down.add("n1")
    c.t += 0.5
    c.set(1, state="PENDING", held=False, node_names=(), restarts=1)
    ctl.cycle()
    c.t += 5
    c.down.discard("n1")
    c.set(1, state="RUNNING", node_names=("n1",))  # Slurm started it on its node again
    ctl.cycle()
    c.t += REQUEUE_WAIT_S
    ctl.cycle()
    assert c.log == [("start", 1)]
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "running", rec


def test_a_node_failure_while_a_resize_stops_the_job_restarts_it_anywhere(
    tmp_path: Path,
) -> None:
    """Slurm requeues a job being stopped for a resize (its node died): it is planned again
    away from the dead node, not left pending for good."""
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None
    rec.phase = "stopping"
    ctl.store.put_job(rec)
    c.down.add("n1")
    c.set(1, state="PENDING", held=False, node_names=(), restarts=1)
    ctl.cycle()
    assert "requeued by Slurm" in ctl.store.job(1).reason  # type: ignore[union-attr]
    c.t += REQUEUE_WAIT_S
    ctl.cycle()
    ctl.cycle()
    assert c.log[-2:] == [("hold", 1), ("start", 1)] and "n1" not in c.shapes[-1].node_names


def test_a_relaunch_by_slurm_between_two_cycles_is_noticed(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.set(1, restarts=1)  # requeued and running again before the controller looked
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.launches == 2 and rec.ready == 0
    assert rec.reason == "relaunched by Slurm (restart 1)"
    ctl.cycle()
    assert ctl.store.job(1).launches == 2  # type: ignore[union-attr]


def test_a_bad_plan_or_checkpoint_is_not_retried(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.set(1, state="FAILED", exit_code=78)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "failed" and "not retried" in rec.reason
    assert ("requeue_hold", 1) not in c.log


def test_a_force_requeue_slurm_does_not_show_yet_is_not_repeated_every_cycle(
    tmp_path: Path,
) -> None:
    """Seen on the pool: a job still stopping past the grace period was requeued by force
    at every cycle (35 requeues in 35 s) while Slurm had not yet shown the first one. Once
    forced, it is left ``force_retry_s`` to go; still running after that, it is ended."""
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.jobs[1].exit_on_signal = False
    c.requeue_hold = lambda slurm_id: c.log.append(("requeue_hold", slurm_id))  # type: ignore[method-assign]
    c.add(2, 4, 4)
    ctl.cycle()
    c.t += 31
    for _ in range(35):  # Slurm keeps showing it running, one cycle a second
        ctl.cycle()
        c.t += 1
    assert c.log.count(("requeue_hold", 1)) == 1
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "stopping" and "requeued by force" in rec.reason
    c.t += Settings().force_retry_s
    ctl.cycle()  # still running long after its forced requeue: it is ended, not re-forced
    assert c.log.count(("requeue_hold", 1)) == 1 and c.state(1) == "CANCELLED"
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "failed" and "contract" in rec.reason


@pytest.mark.parametrize(
    ("code", "said"),
    [(EXIT_STORAGE, "cannot be written"), (EXIT_LAUNCH_LOST, "before any task of it started")],
)
def test_an_unwritable_job_directory_backs_off_then_fails_with_the_reason(
    tmp_path: Path, code: int, said: str
) -> None:
    """The runtime exits 74 (EXIT_STORAGE) when the job directory cannot be written: the
    job's GPUs go back, it is retried after 2, 4, 8, 16 s, and the fifth exit fails it.
    So does a launch that ends 79 (EXIT_LAUNCH_LOST) before it reported its start: srun
    could not start its step (slurmctld stopped or overloaded), which is no try of the
    job's training (three slurmctld stalls made a job fail for good)."""
    c = FakeCluster()
    c.add(1, 4, 4)
    ctl = controller(tmp_path, c)
    for n in range(1, 6):
        ctl.cycle()
        assert c.state(1) == "RUNNING"
        c.set(1, state="FAILED", exit_code=code)
        ctl.cycle()
        rec = ctl.store.job(1)
        assert rec is not None and rec.failures == 0
        if n == 5:
            assert rec.phase == "failed" and c.log.count(("start", 1)) == 5
            assert said in rec.reason and "gave up after 5 tries" in rec.reason
            return
        delay = 2.0 * 2 ** (n - 1)
        assert rec.phase == "queued" and rec.target_gpus == 0, rec.reason
        assert rec.reason.endswith(f"retry {n}/4 in {delay:.0f} s")
        starts = c.log.count(("start", 1))
        c.t += delay - 0.5
        ctl.cycle()  # still backing off: not started, its GPUs free for others
        assert c.log.count(("start", 1)) == starts and c.state(1) == "PENDING"
        c.t += 0.5


@dataclass
class ReleaseRefused(FakeCluster):
    """Slurm that refuses some of the releases sent together at the end of a cycle."""

    refuse: dict[int, str] = field(default_factory=dict)
    pending: list[tuple[int, Shape]] = field(default_factory=list)

    def start(self, slurm_id: int, shape: Shape) -> None:
        self.log.append(("start", slurm_id))
        self.shapes.append(shape)
        self.pending.append((slurm_id, shape))

    def flush(self, send: bool = True) -> dict[int, str]:
        pending, self.pending = self.pending, []
        for slurm_id, shape in pending:
            if slurm_id not in self.refuse:
                super().start(slurm_id, shape)
                self.log.pop()  # said when asked for
        return {j: self.refuse[j] for j, _ in pending if j in self.refuse}


def test_a_start_whose_release_slurm_refuses_goes_back_to_the_queue(tmp_path: Path) -> None:
    c = ReleaseRefused(refuse={2: "scontrol failed: Invalid job id specified for job 2"})
    c.add(1, 4, 4)
    c.add(2, 4, 4)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    assert [e for e in c.log if e[0] == "start"] == [("start", 1), ("start", 2)]
    one, two = ctl.store.job(1), ctl.store.job(2)
    assert one is not None and one.phase == "starting" and c.state(1) == "RUNNING"
    assert two is not None and two.phase == "queued" and c.state(2) == "PENDING"
    assert "start failed (scontrol failed: Invalid job id specified for job 2)" in two.reason
    assert "GPUs released" in two.reason


def test_a_view_too_old_to_act_on_still_holds_the_jobs_planned_back_to_the_queue() -> None:
    """Past ``stale_after_s`` a cycle carries out no start, but its holds: a job planned
    back to the queue and left released could start without a plan meanwhile."""
    c = FakeCluster()
    c.add(1, 1, 4, held=False)
    c.add(2, 1, 4)
    ex = Executor(c, CFG, warn=lambda m: None)
    recs = [_queued(1), _queued(2)]
    intents = [
        (recs[0], Action("hold", 1, reason="planned again"), 11),
        (recs[1], Action("start", 2, Shape(1, 4, ("n1",)), "start at 4 GPUs"), 12),
    ]
    done, unanswered = act(ex, CFG, intents, c.t, t0=time.perf_counter() - 1000)
    assert unanswered is None
    assert done[0] == (11, "done") and c.jobs[1].job.held
    assert done[1][1].startswith("deferred: the pool's view is too old")
    assert c.state(2) == "PENDING" and ("start", 2) not in c.log


@dataclass
class SlowCluster(FakeCluster):
    """Each start and requeue takes a while, as a Slurm command does: how many run at once
    is counted, and one job's start can find Slurm not answering."""

    busy: int = 0
    most: int = 0
    unreachable: set[int] = field(default_factory=set)
    flushed: list[bool] = field(default_factory=list)

    def _call(self, what: str, slurm_id: int) -> None:
        with LOCK:
            self.busy += 1
            self.most = max(self.most, self.busy)
        time.sleep(0.05)
        with LOCK:
            self.busy -= 1
        if slurm_id in self.unreachable:
            raise SlurmUnavailable("Slurm is not reachable (scontrol: Socket timed out)")

    def start(self, slurm_id: int, shape: Shape) -> None:
        self._call("start", slurm_id)
        super().start(slurm_id, shape)

    def requeue_hold(self, slurm_id: int) -> None:
        self._call("requeue_hold", slurm_id)
        super().requeue_hold(slurm_id)

    def flush(self, send: bool = True) -> dict[int, str]:
        self.flushed.append(send)
        return {}


LOCK = threading.Lock()


def _queued(i: int) -> JobRecord:
    return JobRecord(
        slurm_id=i, job_key=f"j{i}", name=f"j{i}", user="alice", job_dir="/j", app="",
        min_gpus=1, max_gpus=4, batch=64, max_batch=64, max_micro=64, submit_time=0.0,
        phase="queued", phase_since=0.0,
    )  # fmt: skip


def _act_on(c: SlowCluster, parallel: int, max_starts: int = 64) -> list[tuple[int, str]]:
    cfg = replace(CFG, parallel_actions=parallel, max_starts_per_cycle=max_starts)
    ex = Executor(c, cfg, warn=lambda m: None)
    recs = {i: _queued(i) for i in range(1, 9)}
    intents = [(recs[1], Action("requeue_hold", 1, reason="it ended"), 100)]
    intents += [
        (recs[i], Action("start", i, Shape(1, 1, (f"n{1 + i % 2}",)), "start"), 100 + i)
        for i in range(1, 9)
    ]
    done, _ = act(ex, cfg, intents, c.t, t0=time.perf_counter())
    return done


def test_actions_of_different_jobs_are_carried_out_at_once_each_jobs_in_order() -> None:
    """A cycle's starts are Slurm calls that slurmctld answers from several threads: with
    ``parallel_actions`` 4, up to 4 jobs' actions run at once, with the same outcome as one
    after the other; a job's own actions (a requeue, then its start) stay in order, and
    the start limit counts in the cycle's order."""
    outcomes = []
    for parallel in (1, 4):
        c = SlowCluster(nodes=2, gpus_per_node=8)
        for i in range(1, 9):
            c.add(i, 1, 4)
        done = _act_on(c, parallel, max_starts=6)
        outcomes.append(done)
        assert c.most == 1 if parallel == 1 else 1 < c.most <= 4
        assert c.log.index(("requeue_hold", 1)) < c.log.index(("start", 1))
        assert sorted(j for kind, j in c.log if kind == "start") == [1, 2, 3, 4, 5, 6]
    assert outcomes[0] == outcomes[1]
    assert [s for _, s in outcomes[1]] == ["done"] * 7 + ["deferred"] * 2


def test_slurm_not_answering_one_action_stops_the_rest_and_the_releases() -> None:
    """One job's start finding Slurm unreachable while others run: the jobs whose actions
    had not begun are not sent, the releases are not sent (flush without send), and every
    start is asked for again (unknown)."""
    c = SlowCluster(nodes=2, gpus_per_node=8, unreachable={2})
    for i in range(1, 9):
        c.add(i, 1, 4)
    done = _act_on(c, 2)
    statuses = dict(done)
    assert statuses[102].startswith("unknown: Slurm did not answer")
    assert any(s == "not sent: Slurm did not answer" for s in statuses.values())
    assert c.flushed == [False]
    assert all(not s.startswith("done") for d, s in done if d > 100)
