"""The pool is the controller's alone (issue 23): the pure and loop-level rules, on the fake
cluster of test_controller_logic. The same attacks run on the real pool in
tests/integration/test_closed_pool.py."""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from hpcorch.cluster import ForeignJob, Observation, PoolNode
from hpcorch.controller.ends import NODE_REFUSED_WAIT_S
from hpcorch.controller.guard import PoolGuard
from hpcorch.controller.logs import disk_full
from hpcorch.controller.loop import Controller
from hpcorch.controller.service import serve
from hpcorch.controller.store import JobRecord, Store
from hpcorch.policy.share import SharePolicy
from hpcorch.protocol import EXIT_UNPLANNED
from tests.test_controller_logic import CFG, FakeCluster


def make(tmp_path: Path, c: FakeCluster, **settings: float) -> tuple[Controller, list[str]]:
    lines: list[str] = []
    cfg = replace(CFG, settings=replace(CFG.settings, **settings))
    ctl = Controller(c, Store(tmp_path / "state.db"), SharePolicy(), cfg, log=lines.append)
    return ctl, lines


def full_pool(c: FakeCluster) -> None:
    """Job 1 runs on all 8 GPUs; job 2 (1-2 GPUs) is queued behind it, held by its owner."""
    c.add(1, 8, 8)
    c.add(2, 1, 2)


def test_a_queued_jobs_user_hold_becomes_the_controllers_own(tmp_path: Path) -> None:
    c = FakeCluster()
    full_pool(c)
    ctl, _ = make(tmp_path, c)
    ctl.cycle()
    assert ("hold", 2) in c.log and c.jobs[2].job.reason == "JobHeldAdmin"
    n = len(c.log)
    ctl.cycle()
    ctl.cycle()
    assert ("hold", 2) not in c.log[n:]  # once: Slurm shows the admin hold
    assert ctl.admin_holds is True


def test_a_controller_that_is_no_operator_says_so_once(tmp_path: Path) -> None:
    c = FakeCluster(admin=False)
    full_pool(c)
    ctl, lines = make(tmp_path, c)
    for _ in range(4):
        ctl.cycle()
    assert c.log.count(("hold", 2)) == 1 and ctl.admin_holds is False
    assert sum("user holds" in ln for ln in lines) == 1


def test_a_job_released_by_its_user_is_held_again(tmp_path: Path) -> None:
    c = FakeCluster()
    full_pool(c)
    ctl, _ = make(tmp_path, c)
    ctl.cycle()
    c.set(2, held=False, reason="Priority")  # its owner's scontrol release
    ctl.cycle()
    rec = ctl.store.job(2)
    assert c.log[-1] == ("hold", 2) and rec is not None and rec.phase == "queued"
    assert "released outside the controller" in rec.reason and rec.launches == 0


def test_a_job_slurm_starts_without_the_controller_is_put_back_uncounted(tmp_path: Path) -> None:
    c = FakeCluster()
    full_pool(c)
    ctl, _ = make(tmp_path, c)
    ctl.cycle()
    c.set(2, state="RUNNING", held=False, node_names=("n1",), gpus_per_node=1)
    ctl.cycle()
    rec = ctl.store.job(2)
    assert c.log[-1] == ("requeue_hold", 2) and rec is not None
    assert rec.phase == "queued" and rec.launches == 0 and rec.failures == 0
    # its wrapper found no plan and ran nothing (exit 77): held again, still not a try
    c.set(2, state="FAILED", exit_code=EXIT_UNPLANNED, node_names=())
    ctl.cycle()
    rec = ctl.store.job(2)
    assert rec is not None and rec.phase == "queued" and rec.failures == 0
    assert rec.start_failures == 0 and c.log[-1] == ("requeue_hold", 2)


def test_a_node_that_comes_back_costs_no_retry(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 4, 4)
    ctl, _ = make(tmp_path, c, max_retries=2)
    ctl.cycle()
    ctl.cycle()
    for flap in range(1, 4):  # three node flaps
        # Slurm requeues it after the node failure, restarts it on the returning node, and
        # the node refuses the launch at once ("Job credential revoked")
        c.set(1, state="PENDING", held=False, reason="BeginTime", node_names=(), restarts=flap)
        ctl.cycle()
        c.set(1, state="RUNNING", node_names=("n1",), gpus_per_node=4)
        ctl.cycle()
        c.set(1, state="FAILED", exit_code=1)
        ctl.cycle()
        rec = ctl.store.job(1)
        assert rec is not None and rec.failures == 0, rec.reason
        assert rec.phase in ("queued", "starting", "running"), rec.reason
        # planned again only once the returning node's slurmd can have let the launch go
        c.t += NODE_REFUSED_WAIT_S - 5
        ctl.cycle()
        assert ctl.store.job(1).phase == "queued"  # type: ignore[union-attr]
        c.t += 6
        ctl.cycle()
        ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.failures == 0 and rec.phase == "running"
    # a launch that fails once it trained is the job's failure, as before
    c.set(1, state="FAILED", exit_code=1)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.failures == 1


@pytest.mark.parametrize(
    ("reason", "says", "waits"),
    [("Resources", "Slurm keeps it pending", 90), ("None", "Slurm has not tried it yet", 270)],
)
def test_a_launch_slurm_keeps_pending_is_planned_again_with_slurms_reason(
    tmp_path: Path, reason: str, says: str, waits: int
) -> None:
    """Past ``--launch-pending`` (90 s) a released launch Slurm keeps pending is held and
    planned again. One pending with Slurm's reason ``None`` (its scheduler, busy, has not
    looked at it yet) waits ``UNTRIED_WAIT`` times as long: seen at 2,000 jobs on 22.05,
    such relaunches pending 91 s were held as Slurm started them, ran unplanned and were
    requeued. Holding a launch Slurm has not tried frees nothing."""
    from hpcorch.controller.reconcile import UNTRIED_WAIT

    assert waits == 90 * (UNTRIED_WAIT if reason == "None" else 1)
    c = FakeCluster()
    c.add(1, 4, 4)
    ctl, lines = make(tmp_path, c, launch_pending_s=90)
    real_start = c.start

    def stuck(slurm_id: int, shape: object) -> None:  # released, but Slurm does not run it
        c.log.append(("start", slurm_id))
        c.set(slurm_id, held=False, reason=reason)

    c.start = stuck  # type: ignore[method-assign]
    ctl.cycle()
    c.t += waits - 10
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "starting", rec.reason
    assert f"{says} ({reason})" in rec.reason and ("hold", 1) not in c.log
    c.t += 10
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "queued" and f"({reason})" in rec.reason
    assert c.log[-1] == ("hold", 1) and any("replan" in ln for ln in lines)
    c.start = real_start  # type: ignore[method-assign]
    c.t += 10
    ctl.cycle()
    assert c.state(1) == "RUNNING"


def test_gpus_of_jobs_the_controller_did_not_place_are_never_planned(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 8)
    stranger = ForeignJob(99, "mallory", "wrap", "RUNNING", ("n1",), (4,))
    plain = c.observe

    def observe() -> Observation:
        obs = plain()
        nodes = tuple(
            replace(n, gpus_used=n.gpus_used + 4, gpus_foreign=4) if n.name == "n1" else n
            for n in obs.nodes
        )
        return replace(obs, nodes=nodes, foreign=(stranger,))

    c.observe = observe  # type: ignore[method-assign]
    ctl, lines = make(tmp_path, c)
    ctl.cycle()
    shape = c.shapes[-1]
    assert shape.gpus == 4 and "n1" not in shape.node_names, shape
    assert sum("mallory" in ln for ln in lines) == 1
    ctl.cycle()
    assert sum("mallory" in ln for ln in lines) == 1  # said once
    assert '"user": "mallory"' in (ctl.store.get_meta("foreign") or "")


def test_a_full_disk_is_told_apart() -> None:
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(sqlite3.OperationalError("database or disk is full"))
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:
            raise RuntimeError("cannot save") from exc
    except RuntimeError as wrapped:
        assert disk_full(wrapped)
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(ValueError("full of beans"))


def test_a_full_state_directory_is_said_once_and_nothing_is_done(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 4, 4)
    ctl, lines = make(tmp_path, c)
    ctl.cycle()
    n = len(c.log)
    cycles = iter(range(6))

    def full_cycle(full: bool = True) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    ctl.cycle = full_cycle  # type: ignore[assignment,method-assign]
    serve(ctl, lambda: next(cycles, None) is None, lambda s: None)
    assert sum("cannot be written" in ln for ln in lines) == 1
    assert c.log[n:] == [] and c.state(1) == "RUNNING"


def test_pool_nodes_default_to_no_foreign_gpus() -> None:
    n = PoolNode("n1", 4, 0, True)
    assert n.gpus_foreign == 0 and n.cpus_foreign == 0


def test_the_gpu_view_is_checked_against_slurms_every_cycle() -> None:
    """A node whose GPUs in use differ from what the controller's running jobs hold there
    counts once it has differed for 10 s without a break (a launch or an end seen between
    Slurm's two reads, a node completing an ended job, last less), and is said once while
    the difference stays the same."""
    said: list[str] = []
    guard = PoolGuard(said.append)
    job = JobRecord(
        7, "k", "a", "alice", "/d", "", 1, 4, 32, 32, 32, 0.0, "running", 0.0,
        gpus=2, nodes=1, node_list="n2", node_gpus="2",
    )  # fmt: skip
    nodes = [PoolNode("n1", 4, 0, True), PoolNode("n2", 4, 2, True)]
    guard.gpu_view(nodes, [job], 100.0)
    assert guard.view_mismatches == 0 and not said
    ended = replace(job, phase="done")  # Slurm still shows its GPUs in use
    for t in (101.0, 105.0, 110.9):
        guard.gpu_view(nodes, [ended], t)
    guard.gpu_view(nodes, [job], 111.0)  # a break: the difference starts again
    guard.gpu_view(nodes, [ended], 112.0)
    assert guard.view_mismatches == 0
    for t in (115.0, 122.0, 125.0):
        guard.gpu_view(nodes, [ended], t)
    assert guard.view_mismatches == 2
    assert said == [
        "the GPUs Slurm shows in use differ from the controller's: n2 2 in use, 0 held by its jobs"
    ]
    foreign = [PoolNode("n1", 4, 0, True), PoolNode("n2", 4, 2, True, gpus_foreign=2)]
    guard.gpu_view(foreign, [ended], 130.0)  # a job the controller did not place holds them
    guard.gpu_view([PoolNode("n1", 4, 0, True), PoolNode("n2", 4, 2, False)], [ended], 140.0)
    assert guard.view_mismatches == 2  # counted as taken; a down node is not compared


def test_a_difference_from_before_an_outage_counts_afresh_once_slurm_answers() -> None:
    """Jobs that ended while slurmctld was stopped are taken in over the cycles after it
    answers again: a node that differed before the outage and differs in the first view
    after it has not differed for the grace in what Slurm showed."""
    guard = PoolGuard(lambda m: None)
    job = JobRecord(
        7, "k", "a", "alice", "/d", "", 1, 4, 32, 32, 32, 0.0, "running", 0.0,
        gpus=2, nodes=1, node_list="n2", node_gpus="2",
    )  # fmt: skip
    freed = [PoolNode("n1", 4, 0, True), PoolNode("n2", 4, 0, True)]
    guard.gpu_view(freed, [job], 100.0)  # the job's end seen between Slurm's two reads
    guard.view_afresh()  # slurmctld stopped for 60 s, then answers
    guard.gpu_view(freed, [job], 160.0)
    assert guard.view_mismatches == 0
    guard.gpu_view(freed, [job], 171.0)  # still differs 11 s later: counted
    assert guard.view_mismatches == 1


def test_a_new_difference_on_a_node_is_not_the_old_one_lasting() -> None:
    """Cycles 30 s apart (a slow slurmctld) each catching another launch or end between
    Slurm's two reads on one busy node are no mismatch: what must last the grace is one
    difference (the GPUs in use less those held), not any difference on the node."""
    guard = PoolGuard(lambda m: None)
    job = JobRecord(
        7, "k", "a", "alice", "/d", "", 1, 4, 32, 32, 32, 0.0, "running", 0.0,
        gpus=4, nodes=1, node_list="n2", node_gpus="4",
    )  # fmt: skip
    for t, used in ((100.0, 6), (130.0, 2), (160.0, 5), (190.0, 3)):  # held: 4
        guard.gpu_view([PoolNode("n2", 8, used, True)], [job], t)
    assert guard.view_mismatches == 0
    for t in (220.0, 250.0):  # 2 GPUs in use that no job of the controller holds: lasting
        guard.gpu_view([PoolNode("n2", 8, 6, True)], [job], t)
    assert guard.view_mismatches == 1


def test_another_end_of_the_same_size_on_a_busy_node_is_not_the_old_one_lasting() -> None:
    """Slurm 22.05 site run: cycles 12 s apart on a node of 1-GPU jobs, each catching
    another job's end between Slurm's two reads (one GPU fewer in use than held, both
    times). The jobs held there changed between the two views: not one difference lasting."""
    guard = PoolGuard(lambda m: None)

    def one(jid: int) -> JobRecord:
        return JobRecord(
            jid, "k", "a", "alice", "/d", "", 1, 4, 32, 32, 32, 0.0, "running", 0.0,
            gpus=1, nodes=1, node_list="n2", node_gpus="1",
        )  # fmt: skip

    jobs = {j: one(j) for j in range(1, 9)}
    # 8 held; job 8's end already freed its GPU in Slurm's view of the node
    guard.gpu_view([PoolNode("n2", 8, 7, True)], list(jobs.values()), 100.0)
    del jobs[8]
    jobs[9] = one(9)  # a launch took its place; job 1 ends between the next two reads
    guard.gpu_view([PoolNode("n2", 8, 7, True)], list(jobs.values()), 112.0)
    assert guard.view_mismatches == 0
    # the same jobs, the same difference, for the grace: counted
    guard.gpu_view([PoolNode("n2", 8, 7, True)], list(jobs.values()), 124.0)
    assert guard.view_mismatches == 1
