"""A replay's time scale (`hpcorch simulate --time-scale F`): F times the work per epoch,
steps at their measured time, start-up and resize costs in full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.policy import make_policy
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.traces import AppTrace, TraceError, scale_apps
from hpcorch.sim.workload import WorkloadJob


def test_a_scaled_application_has_less_work_and_the_same_steps(
    apps: dict[str, AppTrace],
) -> None:
    app = apps["cifar10"]
    small = app.scaled(0.05)
    assert small.epochs == app.epochs
    assert small.total_progress == pytest.approx(0.05 * app.total_progress)
    assert small.progress_per_epoch_hint == pytest.approx(0.05 * app.progress_per_epoch_hint)
    assert small.step_time((2, 2), 64) == app.step_time((2, 2), 64)
    assert small.gain(1024, 3) == app.gain(1024, 3)
    assert small.epoch_grain_s == pytest.approx(0.05)
    assert app.total_progress == pytest.approx(apps["cifar10"].total_progress)  # unchanged
    assert scale_apps(apps, 1.0)["ncf"] is apps["ncf"]
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(TraceError, match="time scale"):
            app.scaled(bad)


def test_a_scaled_job_trains_f_times_as_long_and_starts_up_as_long(
    apps: dict[str, AppTrace],
) -> None:
    """One job alone at the GPUs and batch it asks for (FIFO: no resize, no batch change):
    its time training (JCT less queueing and start-up) scales by F; the start-up does not."""
    cost = ResizeCost()
    cfg = SimConfig(1, 4, 60.0, cost.total, cpus_per_node=48)
    job = [WorkloadJob("c", 0.0, "cifar10", 1, 128)]

    def training(scale: float) -> float:
        run = simulate_controlled(job, make_policy("fifo", 0), scale_apps(apps, scale), cfg)
        r = run.jobs[0]
        return r.jct - r.queueing_delay - cost.startup_s

    full, tenth = training(1.0), training(0.1)
    assert full > 600
    assert tenth == pytest.approx(0.1 * full, rel=0.02)


def test_simulate_takes_a_time_scale_and_refuses_a_bad_one(small_workload: Path) -> None:
    runner = CliRunner()
    base = ["simulate", str(small_workload), "--nodes", "2", "--json"]
    full = json.loads(runner.invoke(main, base).stdout)["results"][0]
    scaled = json.loads(runner.invoke(main, [*base, "--time-scale", "0.1"]).stdout)["results"][0]
    assert scaled["avg_jct"] < full["avg_jct"]
    bad = runner.invoke(main, [*base, "--time-scale", "0"])
    assert bad.exit_code == 2 and "--time-scale" in bad.stderr


def test_start_up_by_gpus_and_a_jobs_finish_are_charged(apps: dict[str, AppTrace]) -> None:
    """What the real pool measured of a launch: a start-up that grows with the GPUs whose
    ranks start (ranks that share CPUs), and a job's end in Slurm some seconds after its
    last step (final checkpoint, teardown), its GPUs held until then."""
    cfg = SimConfig(1, 4, 60.0, 24.5, cpus_per_node=48)
    job = [WorkloadJob("c", 0.0, "cifar10", 4, 128)]
    small = scale_apps(apps, 0.05)

    def run(cost: ResizeCost) -> tuple[float, float]:
        res = simulate_controlled(job, make_policy("fifo", 0), small, cfg, cost=cost)
        return res.jobs[0].jct, res.jobs[0].gpu_seconds

    base_jct, base_gpu_s = run(ResizeCost())
    jct, gpu_s = run(ResizeCost(startup_per_gpu_s=1.5))
    assert jct == pytest.approx(base_jct + 4 * 1.5, abs=0.01)  # 4 ranks start
    jct, gpu_s = run(ResizeCost(finish_s=3.0))
    assert jct == pytest.approx(base_jct + 3.0, abs=0.01)
    assert gpu_s == pytest.approx(base_gpu_s + 4 * 3.0, abs=0.01)  # held while it ends
    assert ResizeCost(startup_per_gpu_s=1.5).total == ResizeCost().total  # the policy's


def test_the_policy_is_told_the_restart_cost_the_controller_is(small_workload: Path) -> None:
    """`--policy-restart-cost` is the controller's `--restart-cost` (a replay tells both
    sides the same); a dear resize makes ONES resize no more than a cheap one."""
    runner = CliRunner()
    base = ["simulate", str(small_workload), "--nodes", "2", "--json", "--policy", "ones"]
    cheap = json.loads(runner.invoke(main, [*base, "--policy-restart-cost", "1"]).stdout)
    dear = json.loads(runner.invoke(main, [*base, "--policy-restart-cost", "3000"]).stdout)
    assert dear["results"][0]["restarts_per_job"] <= cheap["results"][0]["restarts_per_job"]
