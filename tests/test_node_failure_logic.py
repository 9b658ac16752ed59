"""A node failure right after a launch was released: Slurm ran the job and requeued it
before the controller saw it run (found on the real pool with memory scheduled, where a
node was set DOWN within a second of a relaunch: the job waited 90 s as "a launch Slurm
keeps pending" for a node that was down), and a job Slurm requeued after a node failure
whose old shape no longer fits (4 + 4 GPUs, one node down: it waited 90 s for it)."""

from __future__ import annotations

from pathlib import Path

from hpcorch.cluster import Shape
from hpcorch.controller.reconcile import REQUEUE_WAIT_S
from tests.test_controller_logic import FakeCluster, controller


def test_a_launch_requeued_by_slurm_before_it_was_seen_running_is_relaunched(
    tmp_path: Path,
) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()  # started on n1; Slurm runs it, its node fails and Slurm requeues it
    assert c.shapes[-1].node_names == ("n1",)
    c.down.add("n1")
    c.set(1, state="PENDING", held=False, node_names=(), restarts=1, reason="BeginTime")
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.reason.startswith("requeued by Slurm"), rec.reason
    c.t += REQUEUE_WAIT_S
    ctl.cycle()  # still pending on its old node: held and planned again, on n2
    ctl.cycle()
    assert c.log[-2:] == [("hold", 1), ("start", 1)] and c.shapes[-1].node_names == ("n2",)
    ctl.cycle()
    assert c.log.count(("start", 1)) == 2


def test_an_elastic_job_requeued_after_a_node_failure_is_planned_on_what_is_left(
    tmp_path: Path,
) -> None:
    """4 + 4 GPUs with n1 down: its old shape fits nowhere; it runs on n2's 4 GPUs."""
    c = FakeCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    assert c.jobs[1].job.node_names == ("n1", "n2")
    c.down.add("n1")
    c.set(1, state="PENDING", held=False, node_names=(), restarts=1, reason="BeginTime")
    ctl.cycle()
    c.t += REQUEUE_WAIT_S
    for _ in range(3):
        ctl.cycle()
    assert c.log[-1] == ("start", 1) and c.shapes[-1] == Shape(1, 4, ("n2",), per_node=(4,))
