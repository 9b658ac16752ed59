"""Drains, pending reboots and maintenance windows on the fake cluster (issue 33): the jobs
leave such a node at their next safe point, nothing new is planned there, a launch on a node
a window will take ends before it, and the node is the pool's again afterwards.

On the real pool: tests/integration/test_drain.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcorch.cluster import Observation, PoolNode, Window
from hpcorch.controller.availability import LIMIT_MARGIN_S, Fate, fates, lead_s, planned_nodes
from hpcorch.controller.store import JobRecord
from tests.test_contract import ContractCluster, started, steps
from tests.test_controller_logic import controller


@dataclass
class Site(ContractCluster):
    """The fake cluster with an admin: nodes drained, reservations made."""

    leaving: dict[str, str] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)

    def observe(self) -> Observation:
        obs = super().observe()
        nodes = tuple(
            replace(n, usable=False, leaving=self.leaving[n.name]) if n.name in self.leaving else n
            for n in obs.nodes
        )
        return replace(obs, nodes=nodes, windows=tuple(self.windows))


def running_on_both(tmp_path: Path, **settings: float) -> tuple[Site, object]:
    c = Site()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, **settings)
    ctl.cycle()
    c.report(1, started(), steps(10))
    ctl.cycle()
    assert c.jobs[1].job.node_names == ("n1", "n2")
    return c, ctl


def test_a_job_leaves_a_drained_node_at_its_next_safe_point(tmp_path: Path) -> None:
    """The drain finding: the job across n1 and n2 kept n2 for as long as it ran, the node
    DRAINING; it moves off it now, at once (not after --min-run), onto n1, and says why."""
    c, ctl = running_on_both(tmp_path, min_run_s=3600)
    c.leaving["n2"] = "drained by an admin (Reason=repair)"
    before = len(c.shapes)
    ctl.cycle()  # type: ignore[attr-defined]
    assert ("signal", 1) in c.log, c.log
    rec = ctl.store.job(1)  # type: ignore[attr-defined]
    assert rec.phase == "stopping" and rec.reason.startswith("leaving n2"), rec.reason
    ctl.cycle()  # type: ignore[attr-defined]  # it checkpointed: relaunched off n2
    assert c.state(1) == "RUNNING" and c.jobs[1].job.node_names == ("n1",)
    ctl.cycle()  # type: ignore[attr-defined]
    rec = ctl.store.job(1)  # type: ignore[attr-defined]
    assert rec.gpus == 4 and "moved off n2" in rec.reason and "repair" in rec.reason, rec.reason
    c.add(2, 1, 4)
    ctl.cycle()  # type: ignore[attr-defined]
    after = c.shapes[before:]
    assert after and all("n2" not in s.node_names for s in after), after  # nothing planned there
    c.leaving.clear()  # back in service: planned again
    back = len(c.shapes)
    for _ in range(4):
        ctl.cycle()  # type: ignore[attr-defined]
    assert any("n2" in s.node_names for s in c.shapes[back:]), c.shapes[back:]


def test_a_job_that_has_not_reported_its_start_leaves_once_it_does(tmp_path: Path) -> None:
    """A signal before the runtime's handler is installed would kill the job: it leaves
    the draining node once it reported its start."""
    c = Site()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, startup_s=600)
    ctl.cycle()
    ctl.cycle()
    c.leaving["n2"] = "a reboot is pending"
    ctl.cycle()
    assert ("signal", 1) not in c.log
    c.report(1, started())
    ctl.cycle()
    assert ("signal", 1) in c.log


def test_a_job_that_cannot_be_resumed_keeps_the_draining_node_alone(tmp_path: Path) -> None:
    """A sidecar job whose script keeps no checkpoint cannot move: it keeps its GPUs on the
    node to its end, and nothing else is planned there meanwhile."""
    c = Site(nodes=1)
    c.add(1, 2, 2)
    c.set(1, tags={**c.jobs[1].job.tags, "mode": "sidecar", "resume": "no"})
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    assert c.jobs[1].job.gpus == 2
    c.leaving["n1"] = "drained by an admin"
    c.add(2, 1, 2)
    for _ in range(3):
        ctl.cycle()
    assert ("signal", 1) not in c.log and c.state(2) == "PENDING"


def test_a_maintenance_window_empties_its_nodes_by_its_start_and_gives_them_back(
    tmp_path: Path,
) -> None:
    """A reservation with MAINT on n2 from T: a launch on n2 before it gets a time limit
    that ends before T (Slurm would not start it otherwise); its job leaves n2 at T - lead
    (the preemption bound), so n2 is empty by T; after the window n2 is planned again."""
    c = Site()
    start = c.t + 3600
    c.windows.append(Window("maint", ("n2",), start, start + 1800, ("MAINT",)))
    c.add(1, 8, 8)
    ctl = controller(tmp_path, c, min_run_s=60)
    s = ctl.config.settings
    ctl.cycle()
    shape = c.shapes[-1]
    assert "n2" in shape.node_names
    limit = shape.time_limit_min
    assert 0 < limit <= (start - c.t - LIMIT_MARGIN_S) / 60, limit
    c.report(1, started(), steps(10))
    ctl.cycle()
    c.t = start - lead_s(s) - 1
    ctl.cycle()
    assert ("signal", 1) not in c.log  # not yet
    c.t += 2
    ctl.cycle()
    assert ("signal", 1) in c.log
    ctl.cycle()  # relaunched: 8 GPUs do not fit on n1 alone, it waits
    c.t = start + 1801
    c.windows.clear()  # Slurm drops the reservation once it ended
    for _ in range(3):
        ctl.cycle()
    assert c.state(1) == "RUNNING" and c.jobs[1].job.gpus == 8
    assert c.shapes[-1].time_limit_min in (0, -1)  # its own limit again (none)


def test_a_window_closes_its_nodes_to_launches_too_short_to_pay(tmp_path: Path) -> None:
    c = Site()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, min_run_s=60)
    s = ctl.config.settings
    start = c.t + lead_s(s) + 30  # it leaves in 30 s: no new launch there
    c.windows.append(Window("r1", ("n2",), start, start + 600))
    f = fates(c.observe().nodes, c.windows, c.t, s)
    assert f["n2"].close_at <= c.t < f["n2"].leave_at
    ctl.cycle()
    assert c.shapes[-1].node_names == ("n1",) and c.shapes[-1].gpus == 4


def before_the_move(tmp_path: Path) -> tuple[Site, Any]:
    """A job on n1 and n2 training, its limit cut for a window on n2 an hour ahead; the
    clock 30 s before the controller would move it off n2."""
    c = Site()
    start = c.t + 3600
    c.windows.append(Window("maint", ("n2",), start, start + 1800, ("MAINT",)))
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, min_run_s=60)
    ctl.cycle()
    assert c.shapes[-1].node_names == ("n1", "n2") and c.shapes[-1].time_limit_min > 0
    c.report(1, started(), steps(10))
    ctl.cycle()
    c.t = start - lead_s(ctl.config.settings) - 30
    return c, ctl


def test_a_launch_whose_limit_a_window_cut_is_moved_when_it_checkpoints_on_its_own(
    tmp_path: Path,
) -> None:
    """Seen on the pool: the job's pre-limit signal (Slurm's --signal, 120 s before the cut
    limit) came before the controller moved it; it checkpointed "on its own", was
    relaunched on the same nodes with a limit cut again, and ended after --max-relaunches.
    Such a checkpoint is the window's doing: the job is planned again off the window's
    nodes, and its relaunches are not counted."""
    c, ctl = before_the_move(tmp_path)
    # Slurm's signal before the cut limit (a job whose own --signal lead is longer than
    # hpcorch's), and the job's wrapper could not requeue it: exit 75
    c.set(1, state="FAILED", exit_code=75)
    for _ in range(3):
        ctl.cycle()
    assert c.state(1) == "RUNNING" and c.jobs[1].job.node_names == ("n1",), c.jobs[1].job
    rec = ctl.store.job(1)
    assert rec is not None and rec.time_relaunches == 0 and "moved off n2" in rec.reason


def test_a_launch_that_requeues_itself_is_not_running_again_while_slurm_ends_it(
    tmp_path: Path,
) -> None:
    """Seen on the pool (22.05, CI): Slurm sent the pre-limit signal of a launch whose limit
    a window cut 30 s early (Slurm may send it up to 60 s before its time), and the wrapper
    requeued the job held. Slurm listed it COMPLETING on its old nodes with its restart
    count already raised: the controller took that for "requeued by Slurm and running
    again", then for a hold by its user, and the move off the window's node was never
    said. A job ending its launch is not running again: it is moved off n2 as a job that
    checkpointed on its own."""
    c, ctl = before_the_move(tmp_path)
    c.set(1, state="COMPLETING", restarts=1)  # requeued held by its wrapper, still ending
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and "relaunched" not in rec.reason and rec.launches == 1, rec
    c.requeue_self = True
    c.set(1, restarts=0, state="RUNNING")
    c.checkpointed(1)  # then in the queue, held, SPECIAL_EXIT
    for _ in range(3):
        ctl.cycle()
    assert c.state(1) == "RUNNING" and c.jobs[1].job.node_names == ("n1",), c.jobs[1].job
    rec = ctl.store.job(1)
    assert rec is not None and rec.time_relaunches == 0 and "moved off n2" in rec.reason, rec
    assert rec.launches == 2 and "held by its user" not in rec.reason


def test_a_stopping_jobs_gpus_on_a_node_being_left_are_not_planned_again() -> None:
    """Slurm drained nodes (Kill task failed) after slurmctld was stopped for 120 s; the
    jobs on them were stopping. Their GPUs were shown to the policy as the node's (a
    leaving node counted the GPUs of the jobs on it), so it planned new starts there,
    found blocked and planned again, every cycle."""
    why = "drained by Slurm (Reason=Kill task failed)"
    nodes = (PoolNode("n1", 4, 4, False, leaving=why), PoolNode("n2", 4, 4, True))
    base: dict[str, Any] = dict(
        job_key="j", name="j", user="u", job_dir="", app="a", min_gpus=1, max_gpus=64,
        batch=64, max_batch=4096, max_micro=64, submit_time=0.0, phase_since=0.0, ready=1,
        gpus=4, nodes=1, node_gpus="4",
    )  # fmt: skip
    records = [
        JobRecord(slurm_id=5, phase="stopping", node_list="n1", **base),
        JobRecord(slurm_id=6, phase="running", node_list="n2", **base),
    ]
    fate = {"n1": Fate(100.0, 100.0, 0.0, why)}
    n1, n2 = planned_nodes(nodes, records, fate, {}, 100.0)
    assert n1.gpus == 0 and n2 == nodes[1]
