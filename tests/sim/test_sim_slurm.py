"""The simulated Slurm side of the cluster seam: Slurm's semantics on a simulated clock."""

from __future__ import annotations

import math

import pytest

from hpcorch.cluster import Shape
from hpcorch.planner import LaunchPlan
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.slurm_side import FIRST_LINE_S, SimSlurm, SimSlurmError
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

COST = ResizeCost(checkpoint_s=4.0, exit_s=1.0, requeue_s=2.0, startup_s=30.0)


def test_slurm_semantics(apps: dict[str, AppTrace]) -> None:
    """Held on arrival; start runs it with the plan's batch; a checkpoint signal ends it
    with the relaunch code after checkpoint + exit; requeue_hold queues it held again."""
    job = WorkloadJob("cifar10-0", 5.0, "cifar10", 2, 512)
    side = SimSlurm([job], apps, (4, 4), COST, report_s=20.0)
    assert side.observe().jobs == ()
    side.advance(10)
    (seen,) = side.observe().jobs
    assert (seen.state, seen.held) == ("PENDING", True)
    assert (seen.tags["min"], seen.tags["req"], seen.tags["reqbatch"]) == ("1", "2", "512")
    assert seen.tags["epochs"] == "100" and int(seen.tags["dataset"]) > 0  # declared length
    sid, job_dir = seen.slurm_id, seen.tags["dir"]
    with pytest.raises(SimSlurmError):
        side.signal_checkpoint(sid)
    side.write_plan(sid, LaunchPlan(global_batch=1024, gpus=4, max_micro_batch=256), -1)
    side.start(sid, Shape(1, 4, ("sim001",)))
    (seen,) = side.observe().jobs
    assert (seen.state, seen.node_names, seen.gpus) == ("RUNNING", ("sim001",), 4)
    side.advance(25)  # still starting up: nothing to report
    lines, off = side.read_metrics(job_dir, 0, -1)
    assert lines == []
    side.advance(60)
    lines, off = side.read_metrics(job_dir, off, -1)
    assert [ln["event"] for ln in lines][:2] == ["start", "steps"]
    assert lines[0]["time"] == pytest.approx(40.0)  # released at 10, 30 s start-up
    steps = [ln for ln in lines if ln["event"] == "steps"]
    assert steps[-1]["global_batch"] == 1024 and steps[-1]["gpus"] == 4
    assert steps[-1]["per_gpu_batch"] * steps[-1]["accum_steps"] * 4 == 1024
    assert steps[-1]["step"] > 0 and steps[-1]["noise_scale"] > 0
    assert steps[-1]["step_time"] == pytest.approx(1024 / steps[-1]["samples_per_s"])
    side.signal_checkpoint(sid)
    assert side.next_event() == pytest.approx(side.now() + 5.0)  # its exit
    side.advance(4.5)
    assert side.observe().jobs[0].state == "RUNNING"
    side.advance(1)
    (seen,) = side.observe().jobs  # requeued itself held, as the job wrapper does
    assert (seen.state, seen.held, seen.special_exit, seen.restarts) == ("PENDING", True, True, 1)
    assert seen.end_time == pytest.approx(side.now() - 0.5)
    assert side.observe().nodes[1].gpus_used == 0
    progress = side.jobs[0].model.progress
    side.requeue_hold(sid)  # the controller's requeue of a pending job changes nothing
    (seen,) = side.observe().jobs
    assert (seen.state, seen.held, seen.restarts) == ("PENDING", True, 1)
    side.write_plan(sid, LaunchPlan(global_batch=512, gpus=2, max_micro_batch=256, launch=1), -1)
    side.start(sid, Shape(1, 2))
    side.advance(120)
    lines, off = side.read_metrics(job_dir, off, -1)
    assert [ln for ln in lines if ln["event"] == "steps"][-1]["global_batch"] == 512
    assert side.jobs[0].model.progress > progress
    side.cancel(sid)
    assert side.observe().jobs[0].state == "CANCELLED" and side.all_done()


def test_a_running_job_requeued_held_is_not_finished(apps: dict[str, AppTrace]) -> None:
    """The controller's requeue-hold of a running job (one Slurm started without its plan)
    kills it back to its checkpoint and queues it held: it is not a finished job. Counted
    as one, the simulation ended with another job still running (its JCT negative)."""
    job = WorkloadJob("ncf-0", 0.0, "ncf", 1, 256)
    side = SimSlurm([job], apps, (4,), COST)
    side.advance(1)
    (seen,) = side.observe().jobs
    side.write_plan(seen.slurm_id, LaunchPlan(global_batch=256, gpus=1, max_micro_batch=256), -1)
    side.start(seen.slurm_id, Shape(1, 1))
    side.advance(40)
    side.requeue_hold(seen.slurm_id)
    (seen,) = side.observe().jobs
    assert (seen.state, seen.held, seen.restarts) == ("PENDING", True, 1)
    assert not side.all_done() and side.arrived_unfinished()
    side.write_plan(
        seen.slurm_id, LaunchPlan(global_batch=256, gpus=1, max_micro_batch=256, launch=1), -1
    )
    side.start(seen.slurm_id, Shape(1, 1))
    while not side.all_done() and side.now() < 1e6:
        side.advance(600)
    assert side.jobs[0].model.completion_time is not None
    assert side.jobs[0].state == "COMPLETED"


def test_a_start_waits_for_busy_gpus(apps: dict[str, AppTrace]) -> None:
    jobs = [WorkloadJob("a", 0.0, "ncf", 1, 256), WorkloadJob("b", 0.0, "ncf", 1, 256)]
    side = SimSlurm(jobs, apps, (4,), COST)
    side.advance(1)
    a, b = (j.slurm_id for j in side.observe().jobs)
    side.start(a, Shape(1, 4))
    side.start(b, Shape(1, 2))
    states = {j.slurm_id: j.state for j in side.observe().jobs}
    assert states == {a: "RUNNING", b: "PENDING"}
    side.advance(40)
    side.signal_checkpoint(a)
    side.advance(10)  # a exits after its checkpoint: b gets the GPUs at that moment
    states = {j.slurm_id: j.state for j in side.observe().jobs}
    assert states == {a: "PENDING", b: "RUNNING"}
    assert side.jobs[1].start_time == pytest.approx(46.0)


def test_an_uneven_placement_runs_exactly_on_its_nodes_in_rank_order(
    apps: dict[str, AppTrace],
) -> None:
    jobs = [WorkloadJob(n, 0.0, "cifar10", 1, 128) for n in ("a", "b", "c")]
    side = SimSlurm(jobs, apps, (4, 4), COST)
    side.advance(1)
    a, b, c = (j.slurm_id for j in side.observe().jobs)
    side.start(a, Shape(2, 4, ("sim001", "sim000"), per_node=(4, 2)))
    seen = {j.slurm_id: j for j in side.observe().jobs}
    assert seen[a].node_names == ("sim001", "sim000") and seen[a].per_node == (4, 2)
    assert seen[a].gpus == 6 and seen[a].gpus_per_node == 4
    assert [n.gpus_used for n in side.observe().nodes] == [2, 4]
    assert side.jobs[0].model.placement == ((1, 4), (0, 2))
    side.start(b, Shape(1, 3, ("sim000",), per_node=(3,)))  # 2 free there: it waits
    side.start(c, Shape(1, 2, ("sim000",), per_node=(2,)))
    seen = {j.slurm_id: j for j in side.observe().jobs}
    assert (seen[b].state, seen[c].state) == ("PENDING", "RUNNING")
    with pytest.raises(SimSlurmError):
        side.start(b, Shape(2, 2, ("sim000",), per_node=(2, 2)))  # counts != nodes


def test_a_batch_only_plan_is_taken_without_a_restart(apps: dict[str, AppTrace]) -> None:
    side = SimSlurm([WorkloadJob("a", 0.0, "cifar10", 2, 128)], apps, (4,), COST, report_s=10.0)
    side.advance(1)
    (seen,) = side.observe().jobs
    sid, job_dir = seen.slurm_id, seen.tags["dir"]
    side.write_plan(sid, LaunchPlan(global_batch=256, gpus=2, max_micro_batch=512), -1)
    side.start(seen.slurm_id, Shape(1, 2, ("sim000",), per_node=(2,)))
    side.advance(60)
    job = side.jobs[0]
    assert job.model.batch == 256
    progress, finish = job.model.progress, job.finish_at
    # the running launch's own plan (launch 0) rewritten: taken now, no restart
    side.write_plan(sid, LaunchPlan(global_batch=1024, gpus=2, max_micro_batch=512), -1)
    assert job.model.batch == 1024 and job.launches == 1 and job.model.rescale_left == 0
    assert job.finish_at < finish  # a larger batch: fewer steps to go at this noise
    side.advance(30)
    assert job.model.progress > progress and job.launches == 1
    lines, _ = side.read_metrics(job_dir, 0, -1)
    batches = [ln["global_batch"] for ln in lines if ln["event"] == "steps"]
    assert batches[0] == 256 and batches[-1] == 1024
    # a plan for the next launch is kept for it, not taken now
    side.write_plan(sid, LaunchPlan(global_batch=512, gpus=2, max_micro_batch=512, launch=1), -1)
    assert job.model.batch == 1024


def test_the_first_line_at_a_live_batch_comes_a_metrics_interval_after(
    apps: dict[str, AppTrace],
) -> None:
    """The runtime writes a line every 5 s: a job given a batch live reports it 5 s later,
    not a report interval later, and the driver is told when (``next_event``)."""
    side = SimSlurm([WorkloadJob("a", 0.0, "cifar10", 2, 128)], apps, (4,), COST, report_s=60.0)
    side.advance(1)
    (seen,) = side.observe().jobs
    sid, job_dir = seen.slurm_id, seen.tags["dir"]
    side.start(sid, Shape(1, 2, ("sim000",), per_node=(2,)))
    side.advance(100)
    side.observe()
    side.write_plan(sid, LaunchPlan(global_batch=512, gpus=2, max_micro_batch=512), -1)
    changed = side.now()
    assert side.next_event() == changed + FIRST_LINE_S
    side.advance_to(changed + FIRST_LINE_S)
    lines, _ = side.read_metrics(job_dir, 0, -1)
    last = [ln for ln in lines if ln["event"] == "steps"][-1]
    assert (last["global_batch"], last["time"]) == (512, changed + FIRST_LINE_S)
    assert side.next_event() > changed + 30  # then every report_s again
    side.advance(30)
    assert len(side.read_metrics(job_dir, 0, -1)[0]) == len(lines)


def test_a_launch_s_first_line_comes_a_metrics_interval_after_it_trains(
    apps: dict[str, AppTrace],
) -> None:
    """A launch's first ``steps`` line comes 5 s after it starts training, as the runtime
    writes it, and the driver is told when: the controller plans a new job's next round
    from that line (``LoopConfig.measured_round``), not a report interval later."""
    side = SimSlurm([WorkloadJob("a", 0.0, "cifar10", 2, 128)], apps, (4,), COST, report_s=60.0)
    side.advance(1)
    (seen,) = side.observe().jobs
    side.start(seen.slurm_id, Shape(1, 2, ("sim000",), per_node=(2,)))
    job = side.jobs[0]
    side.observe()
    assert side.next_event() == job.train_at
    side.advance_to(job.train_at)
    side.observe()
    assert side.next_event() == job.train_at + FIRST_LINE_S
    side.advance_to(job.train_at + FIRST_LINE_S)
    lines, _ = side.read_metrics(seen.tags["dir"], 0, -1)
    steps = [ln for ln in lines if ln["event"] == "steps"]
    assert [ln["time"] for ln in steps] == [job.train_at + FIRST_LINE_S]
    assert side.next_event() >= job.train_at + 60.0  # then every report_s


def test_next_event_is_never_later_than_what_happens(apps: dict[str, AppTrace]) -> None:
    jobs = [WorkloadJob("a", 0.0, "ncf", 1, 256), WorkloadJob("b", 500.0, "ncf", 1, 256)]
    side = SimSlurm(jobs, apps, (4,), COST)
    side.advance(1)
    assert side.next_event() == 500.0
    side.start(side.observe().jobs[0].slurm_id, Shape(1, 1, ("sim000",), per_node=(1,)))
    assert side.next_event() == 1.0  # running now: the next cycle sees it
    side.observe()
    assert side.next_event() == pytest.approx(31.0)  # it starts training
    side.advance_to(31.0)
    job = side.jobs[0]
    assert side.next_event() == pytest.approx(31.0 + FIRST_LINE_S)  # its first line
    side.advance_to(31.0 + FIRST_LINE_S)
    done = job.finish_at
    assert math.isfinite(done) and side.next_event() == pytest.approx(min(done - 1.0, 500.0))
    side.advance_to(done)
    assert job.state == "COMPLETED" and job.end_time <= done
