"""The simulator: isolated jobs take their isolated time, GPU-seconds are conserved."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpcorch.planner import plan_batch
from hpcorch.policy import make_policy
from hpcorch.sim.config import SimConfig
from hpcorch.sim.loop import simulate
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob, load_workload


def _isolated(app: AppTrace, gpus: int, batch: int, arrival: float, cfg: SimConfig) -> float:
    """JCT of a job alone at a fixed configuration, computed epoch by epoch."""
    bp = plan_batch(batch, gpus, app.max_micro, app.min_micro)
    counts = (cfg.gpus_per_node,) * (gpus // cfg.gpus_per_node) + (
        (gpus % cfg.gpus_per_node,) if gpus % cfg.gpus_per_node else ()
    )
    it = app.iteration_time(counts, bp.micro_batch, bp.accum_steps)
    run = sum(
        (app.epoch_end[e + 1] - app.epoch_end[e]) * it / app.gain(bp.global_batch, e)
        for e in range(app.epochs)
    )
    start = math.floor(arrival / cfg.round_s + 1) * cfg.round_s
    return start - arrival + cfg.restart_cost + run


@pytest.mark.parametrize(
    ("app", "gpus", "batch"), [("ncf", 1, 256), ("cifar10", 4, 512), ("bert", 8, 96)]
)
def test_single_job_alone_finishes_in_isolated_time(
    apps: dict[str, AppTrace], app: str, gpus: int, batch: int
) -> None:
    cfg = SimConfig()
    job = WorkloadJob(f"{app}-0", 17.0, app, gpus, batch)
    for name in ("fifo", "tiresias"):
        res = simulate([job], make_policy(name), apps, cfg)
        expect = _isolated(apps[app], gpus, batch, job.time, cfg)
        # Epoch boundaries are rounded to whole seconds.
        assert res.jobs[0].jct == pytest.approx(expect, abs=0.5 * apps[app].epochs + 1)
        assert res.jobs[0].restarts == 0


@pytest.mark.parametrize("name", ["fifo", "tiresias", "ones", "aiturbo", "sidecar"])
def test_gpu_seconds_conserved_and_deterministic(
    apps: dict[str, AppTrace], small_workload: Path, name: str
) -> None:
    jobs = load_workload(small_workload, apps)
    cfg = SimConfig(nodes=2, gpus_per_node=4)
    a = simulate(jobs, make_policy(name, 3), apps, cfg)
    held = sum(j.gpu_seconds for j in a.jobs) + a.extra["idle_held"]
    assert held == pytest.approx(a.allocated_gpu_seconds)
    assert max(used for _, used in a.timeline) <= 8
    assert all(j.jct > 0 for j in a.jobs)
    assert a.avg_jct >= a.lower_bound * 0.999
    b = simulate(jobs, make_policy(name, 3), apps, cfg)
    assert [j.jct for j in a.jobs] == [j.jct for j in b.jobs]


def test_restart_cost_is_charged(apps: dict[str, AppTrace], small_workload: Path) -> None:
    jobs = load_workload(small_workload, apps)
    cheap = simulate(jobs, make_policy("fifo"), apps, SimConfig(restart_cost=0.0))
    dear = simulate(jobs, make_policy("fifo"), apps, SimConfig(restart_cost=300.0))
    assert dear.avg_jct > cheap.avg_jct + 250


def test_tiresias_reproduces_published_workload(apps: dict[str, AppTrace], data_dir: Path) -> None:
    """Fidelity: the published Tiresias rules on a published workload give its JCTs."""
    import json

    jobs = load_workload(data_dir / "workloads" / "load-0.5" / "workload-5.csv", apps)
    res = simulate(jobs, make_policy("tiresias"), apps, SimConfig())
    pub = json.loads((data_dir / "published-results" / "tiresias-load-0.5.json").read_text())
    published = pub["jcts"]["workload-5"]
    assert res.avg_jct == pytest.approx(sum(published.values()) / len(published), rel=0.02)
    ours = {j.name: j.jct for j in res.jobs}
    close = sum(abs(ours[k] - v) <= 0.05 * v + 60 for k, v in published.items())
    assert close >= 0.9 * len(published)


def test_other_topology_runs(apps: dict[str, AppTrace], small_workload: Path) -> None:
    jobs = load_workload(small_workload, apps)
    res = simulate(jobs, make_policy("ones"), apps, SimConfig(nodes=1, gpus_per_node=8))
    assert all(j.jct > 0 for j in res.jobs)
    assert max(used for _, used in res.timeline) <= 8
