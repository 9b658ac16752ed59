"""The production controller over the simulated Slurm side (``--engine controller``)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcorch.cluster import Shape
from hpcorch.planner import LaunchPlan, plan_batch
from hpcorch.policy import make_policy
from hpcorch.protocol import EXIT_RELAUNCH
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.loop import SimConfig, SimResult
from hpcorch.sim.slurm_side import SimSlurm, SimSlurmError
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob, load_workload


def _isolated(app: AppTrace, gpus: int, batch: int, start: float, cfg: SimConfig) -> float:
    """Seconds from ``start`` to the end of a job alone at a fixed configuration."""
    bp = plan_batch(batch, gpus, app.max_micro)
    full, rem = divmod(gpus, cfg.gpus_per_node)
    counts = (cfg.gpus_per_node,) * full + ((rem,) if rem else ())
    micro = min(max(bp.micro_batch, app.min_micro), app.max_micro)
    it = app.iteration_time(counts, micro, bp.accum_steps)
    run = sum(
        (app.epoch_end[e + 1] - app.epoch_end[e]) * it / app.gain(bp.global_batch, e)
        for e in range(app.epochs)
    )
    return start + cfg.restart_cost + run


@pytest.mark.parametrize(
    ("app", "gpus", "batch", "interval"),
    [("ncf", 1, 256, 60.0), ("cifar10", 4, 512, 10.0), ("bert", 8, 96, 60.0)],
)
def test_single_job_alone_finishes_in_its_isolated_time(
    apps: dict[str, AppTrace], app: str, gpus: int, batch: int, interval: float
) -> None:
    cfg = SimConfig()
    job = WorkloadJob(f"{app}-0", 17.0, app, gpus, batch)
    res = simulate_controlled([job], make_policy("fifo"), apps, cfg, interval_s=interval)
    # the first cycle after the arrival adopts the job and starts it
    start = math.floor(job.time / interval + 1) * interval
    expect = _isolated(apps[app], gpus, batch, start, cfg) - job.time
    assert res.jobs[0].jct == pytest.approx(expect, abs=0.5 * apps[app].epochs + 1)
    assert res.jobs[0].restarts == 0
    assert res.jobs[0].queueing_delay == pytest.approx(start - job.time)


def _first_jobs(data_dir: Path, apps: dict[str, AppTrace], n: int) -> list[WorkloadJob]:
    path = data_dir / "workloads" / "load-1.0" / "workload-3.csv"
    if not path.is_file():
        pytest.skip(f"no workload {path}")
    return load_workload(path, apps)[:n]


def _check_allocation(peak: list[int]) -> Callable[[SimCluster], None]:
    def check(world: SimCluster) -> None:
        per_node = [0] * len(world.node_gpus)
        for j in world.jobs:
            for node, n in j.placement:
                per_node[node] += n
        assert all(u <= g for u, g in zip(per_node, world.node_gpus, strict=True)), per_node
        peak[0] = max(peak[0], sum(per_node))

    return check


def _completed(res: SimResult, n: int, gpus: int, peak: int) -> None:
    assert len(res.jobs) == n
    assert all(j.jct > 0 and j.queueing_delay >= 0 for j in res.jobs)
    assert res.avg_jct >= res.lower_bound * 0.999
    assert 0 < peak <= gpus
    assert max(u for _, u in res.timeline) <= gpus
    assert res.decision_s and res.extra["slurm_calls"] > 0


def test_first_jobs_of_a_workload_complete_under_fifo(
    data_dir: Path, apps: dict[str, AppTrace]
) -> None:
    jobs = _first_jobs(data_dir, apps, 10)
    peak = [0]
    cfg = SimConfig(nodes=4, gpus_per_node=4)
    res = simulate_controlled(jobs, make_policy("fifo"), apps, cfg, _check_allocation(peak))
    _completed(res, len(jobs), 16, peak[0])
    assert all(j.restarts == 0 for j in res.jobs)  # FIFO never resizes: one launch each


def test_small_workload_completes_under_ones(
    apps: dict[str, AppTrace], small_workload: Path
) -> None:
    jobs = load_workload(small_workload, apps)
    peak = [0]
    cfg = SimConfig(nodes=2, gpus_per_node=4)
    a = simulate_controlled(jobs, make_policy("ones", 5), apps, cfg, _check_allocation(peak))
    _completed(a, len(jobs), 8, peak[0])
    assert a.extra["resizes"] > 0  # ONES resized through checkpoint -> requeue -> start
    b = simulate_controlled(jobs, make_policy("ones", 5), apps, cfg)  # same seed, same run
    assert [(j.jct, j.restarts) for j in a.jobs] == [(j.jct, j.restarts) for j in b.jobs]
    assert a.timeline == b.timeline


def test_slurm_semantics(apps: dict[str, AppTrace]) -> None:
    """Held on arrival; start runs it with the plan's batch; a checkpoint signal ends it
    with the relaunch code after checkpoint_s; requeue_hold queues it held again."""
    job = WorkloadJob("cifar10-0", 5.0, "cifar10", 2, 512)
    side = SimSlurm([job], apps, (4, 4), restart_cost=30.0, checkpoint_s=5.0, report_s=20.0)
    assert side.observe().jobs == ()
    side.advance(10)
    (seen,) = side.observe().jobs
    assert (seen.state, seen.held) == ("PENDING", True)
    assert (seen.tags["min"], seen.tags["req"], seen.tags["reqbatch"]) == ("1", "2", "512")
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
    steps = [ln for ln in lines if ln["event"] == "steps"]
    assert steps[-1]["global_batch"] == 1024 and steps[-1]["gpus"] == 4
    assert steps[-1]["per_gpu_batch"] * steps[-1]["accum_steps"] * 4 == 1024
    assert steps[-1]["step"] > 0 and steps[-1]["noise_scale"] > 0
    assert steps[-1]["step_time"] == pytest.approx(1024 / steps[-1]["samples_per_s"])
    side.signal_checkpoint(sid)
    side.advance(4)
    assert side.observe().jobs[0].state == "RUNNING"
    side.advance(2)
    (seen,) = side.observe().jobs
    assert (seen.state, seen.exit_code) == ("FAILED", EXIT_RELAUNCH)
    assert side.observe().nodes[1].gpus_used == 0
    progress = side.jobs[0].model.progress
    side.requeue_hold(sid)
    (seen,) = side.observe().jobs
    assert (seen.state, seen.held, seen.restarts) == ("PENDING", True, 1)
    side.write_plan(sid, LaunchPlan(global_batch=512, gpus=2, max_micro_batch=256), -1)
    side.start(sid, Shape(1, 2))
    side.advance(120)
    lines, off = side.read_metrics(job_dir, off, -1)
    assert [ln for ln in lines if ln["event"] == "steps"][-1]["global_batch"] == 512
    assert side.jobs[0].model.progress > progress
    side.cancel(sid)
    assert side.observe().jobs[0].state == "CANCELLED" and side.all_done()


def test_a_start_waits_for_busy_gpus(apps: dict[str, AppTrace]) -> None:
    jobs = [WorkloadJob("a", 0.0, "ncf", 1, 256), WorkloadJob("b", 0.0, "ncf", 1, 256)]
    side = SimSlurm(jobs, apps, (4,), checkpoint_s=5.0)
    side.advance(1)
    a, b = (j.slurm_id for j in side.observe().jobs)
    side.start(a, Shape(1, 4))
    side.start(b, Shape(1, 2))
    states = {j.slurm_id: j.state for j in side.observe().jobs}
    assert states == {a: "RUNNING", b: "PENDING"}
    side.advance(40)
    side.signal_checkpoint(a)
    side.advance(10)  # a exits after its checkpoint: b gets the GPUs
    states = {j.slurm_id: j.state for j in side.observe().jobs}
    assert states == {a: "FAILED", b: "RUNNING"}


def test_cli_engine_controller(data_dir: Path, small_workload: Path) -> None:
    from click.testing import CliRunner

    from hpcorch.cli import main

    args = ["simulate", str(small_workload), "--policy", "fifo", "--nodes", "2", "--json"]
    res = CliRunner().invoke(main, [*args, "--engine", "controller"])
    assert res.exit_code == 0, res.stderr
    (row,) = json.loads(res.stdout)["results"]
    assert row["policy"] == "fifo" and row["avg_jct"] >= row["lower_bound"]
    bad = CliRunner().invoke(main, [*args, "--engine", "slurm"])
    assert bad.exit_code == 2 and "'slurm' is not one of" in bad.stderr
