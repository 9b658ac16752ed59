"""CPUs per GPU: the data-loading model of the simulator and the chooser of the policies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from hpcorch.policy import POLICIES, make_policy
from hpcorch.policy.cpus import NO_NEED, cpu_need, fit_cpus
from hpcorch.policy.types import (
    CpuSample,
    JobPlan,
    JobView,
    Plan,
    PlanError,
    Snapshot,
    StepSample,
    validate_plan,
)
from hpcorch.sim.config import SimConfig
from hpcorch.sim.engine import SimCluster, SimJob
from hpcorch.sim.loop import simulate
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

# -- the simulator's data-loading model --------------------------------------------------


def _sim_job(app: AppTrace, cpus: int, demand: float, accum: int = 1) -> SimJob:
    job = SimJob(WorkloadJob("j", 0.0, app.name, 1, 128), app, cpu_s_per_sample=demand)
    job.placement = ((0, 1),)
    job.micro_batch, job.accum_steps, job.batch = 128, accum, 128 * accum
    job.cpus_per_gpu = cpus
    return job


def test_step_time_grows_when_cpus_are_short(apps: dict[str, AppTrace]) -> None:
    app = apps["cifar10"]
    compute = app.iteration_time((1,), 128, 1)
    # 128 samples x 0.02 s on 12 CPUs = 0.213 s of loading > 0.103 s of compute.
    assert _sim_job(app, 12, 0.02).iteration_time() == (pytest.approx(128 * 0.02 / 12), compute)
    assert _sim_job(app, 1, 0.02).iteration_time()[0] == pytest.approx(128 * 0.02)
    # Enough CPUs (or no demand): loading hides behind compute, the trace's step time.
    assert _sim_job(app, 48, 0.02).iteration_time()[0] == compute
    assert _sim_job(app, 1, 0.0).iteration_time()[0] == compute
    # Every micro-step of an accumulated step waits for its own micro-batch.
    assert _sim_job(app, 1, 0.02, accum=3).iteration_time()[0] == pytest.approx(3 * 128 * 0.02)


def test_job_reports_what_it_saw_at_each_cpu_count(apps: dict[str, AppTrace]) -> None:
    job = _sim_job(apps["cifar10"], 6, 0.02)
    job.step(0.0, 60.0)
    job.cpus_per_gpu = 48
    job.step(60.0, 60.0)
    (slow, fast) = (job.cpu_profile[(6, 1, 128)], job.cpu_profile[(48, 1, 128)])
    assert slow[0] == pytest.approx(128 * 0.02 / 6) and slow[1] > 0.5 * slow[0]
    assert fast[1] == 0.0 and fast[0] < slow[0]


# -- the chooser -------------------------------------------------------------------------


def _cpu(c: int, step: float, wait: float | None = None, gpus: int = 1) -> CpuSample:
    return CpuSample(cpus_per_gpu=c, gpus=gpus, micro_batch=128, step_time=step, data_wait=wait)


def test_need_is_the_fewest_cpus_near_the_best_throughput() -> None:
    prof = [_cpu(2, 0.40), _cpu(4, 0.20), _cpu(8, 0.104), _cpu(16, 0.10)]
    need = cpu_need(prof)
    assert (need.target, need.explore) == (8, 0)  # 8 is within 5% of 16
    # Still falling at the largest count: try twice as many.
    need = cpu_need(prof[:3])
    assert (need.target, need.explore) == (8, 16)
    # Input waits measured: go straight to the count that removes them.
    need = cpu_need([_cpu(12, 0.2, wait=0.1)])
    assert (need.target, need.explore) == (12, 23)  # ceil(12 x 0.95 / 0.5)
    assert cpu_need([_cpu(12, 0.2, wait=0.0)]).target == 12
    # Nothing to compare: no evidence either way.
    assert cpu_need([]) == NO_NEED
    assert cpu_need([_cpu(12, 0.2)]) == NO_NEED


def _view(job_id: str, placement: dict[int, int], **kw: Any) -> JobView:
    gpus = sum(placement.values())
    base = JobView(
        job_id=job_id,
        application=job_id.split("-")[0],
        submit_time=0.0,
        requested_gpus=max(gpus, 1),
        requested_batch=128 * max(gpus, 1),
        min_gpus=1,
        max_gpus=8,
        min_batch=128,
        max_batch=4096,
        min_micro_batch=32,
        max_micro_batch=1024,
        max_epochs=10,
        progress_per_epoch_hint=100.0,
        gpus=gpus,
        placement=placement,
        batch=128 * gpus,
        micro_batch=128 if gpus else 0,
    )
    return replace(base, **kw)


def _plan_for(*jobs: tuple[JobView, dict[int, int]]) -> Plan:
    return Plan(
        tuple(JobPlan(j.job_id, sum(p.values()), p, 128 * sum(p.values()), 128, 1) for j, p in jobs)
    )


def _snap(*jobs: JobView, node_cpus: tuple[int, ...] = (48, 48)) -> Snapshot:
    return Snapshot(now=0.0, node_gpus=(4,) * len(node_cpus), jobs=jobs, node_cpus=node_cpus)


def test_site_default_without_a_profile_and_nothing_without_node_cpus() -> None:
    a = _view("a-0", {}, min_cpus_per_gpu=2, max_cpus_per_gpu=8)
    b = _view("b-1", {})
    plan = _plan_for((a, {0: 2}), (b, {1: 4}))
    got = fit_cpus(_snap(a, b), plan).by_id()
    assert (got["a-0"].cpus_per_gpu, got["b-1"].cpus_per_gpu) == (8, 12)
    unmanaged = Snapshot(now=0.0, node_gpus=(4, 4), jobs=(a, b))
    assert fit_cpus(unmanaged, plan) == plan


def test_starved_job_gets_free_cpus_but_never_more_than_the_node_has() -> None:
    starved = (_cpu(12, 0.4, wait=0.3),)  # needs ~46 CPUs per GPU
    a = _view("a-0", {0: 1}, cpus_per_gpu=12, cpu_profile=starved)
    plan = _plan_for((a, {0: 1}))
    assert fit_cpus(_snap(a), plan).jobs[0].cpus_per_gpu == 46
    # A neighbour on the node: only what it leaves free.
    b = _view("b-1", {})
    got = fit_cpus(_snap(a, b), _plan_for((a, {0: 1}), (b, {0: 3}))).by_id()
    assert (got["a-0"].cpus_per_gpu, got["b-1"].cpus_per_gpu) == (12, 12)
    # Its own bound.
    capped = replace(a, max_cpus_per_gpu=20)
    assert fit_cpus(_snap(capped), plan).jobs[0].cpus_per_gpu == 20


def test_staying_job_keeps_its_cpus_unless_the_gain_pays_the_restart() -> None:
    small_gain = (_cpu(12, 0.2, wait=0.01),)  # 5% wait: within tolerance
    a = _view("a-0", {0: 1}, cpus_per_gpu=12, cpu_profile=small_gain)
    assert fit_cpus(_snap(a), _plan_for((a, {0: 1}))).jobs[0].cpus_per_gpu == 12
    # Measured fewer is enough, but shrinking a running job would only restart it.
    prof = (_cpu(4, 0.10), _cpu(12, 0.10))
    b = _view("b-0", {0: 1}, cpus_per_gpu=12, cpu_profile=prof)
    assert fit_cpus(_snap(b), _plan_for((b, {0: 1}))).jobs[0].cpus_per_gpu == 12
    # ... while a job that moves anyway takes the fewest that suffice.
    assert fit_cpus(_snap(b), _plan_for((b, {1: 1}))).jobs[0].cpus_per_gpu == 4


def test_node_overcommit_shrinks_the_greediest_and_drops_what_cannot_fit() -> None:
    a = _view("a-0", {0: 1}, cpus_per_gpu=40, cpu_profile=(_cpu(40, 0.1, wait=0.0),))
    b = _view("b-1", {})
    got = fit_cpus(_snap(a, b), _plan_for((a, {0: 1}), (b, {0: 3}))).by_id()
    assert (got["a-0"].cpus_per_gpu, got["b-1"].cpus_per_gpu) == (12, 12)
    b = _view("b-1", {}, min_cpus_per_gpu=14)
    got = fit_cpus(_snap(a, b), _plan_for((a, {0: 1}), (b, {0: 3}))).by_id()
    assert (got["a-0"].cpus_per_gpu, got["b-1"].cpus_per_gpu) == (48 - 3 * 14, 14)
    c = _view("c-2", {}, min_cpus_per_gpu=16)
    plan = fit_cpus(_snap(c), _plan_for((c, {0: 4})))
    assert plan.jobs == ()  # 4 x 16 > 48


def _random_snapshot(seed: int, n_jobs: int, nodes: int = 4) -> Snapshot:
    rng = np.random.default_rng(seed)
    free = [4] * nodes
    jobs: list[JobView] = []
    for i in range(n_jobs):
        node = i % nodes
        gpus = min(free[node], int(rng.integers(1, 5))) if rng.random() < 0.5 else 0
        free[node] -= gpus
        placement = {node: gpus} if gpus else {}
        lo = int(rng.integers(1, 4))
        hi = int(rng.choice([0, 8, 24]))
        cur = min(12, hi or 12) if gpus else 0
        prof: tuple[CpuSample, ...] = ()
        if gpus:
            step = float(rng.uniform(0.05, 0.5))
            prof = tuple(
                _cpu(c, step * float(rng.uniform(0.8, 3.0) if c < cur else 1.0), gpus=gpus)
                for c in sorted({cur, max(lo, cur // 2)})
            )
            prof += (_cpu(cur, step, wait=float(rng.uniform(0, 0.9)) * step, gpus=gpus),)
        jobs.append(
            _view(
                f"{['cifar10', 'bert', 'ncf'][i % 3]}-{i}",
                placement,
                requested_gpus=int(rng.choice([1, 2, 4, 8])),
                submit_time=float(i),
                min_cpus_per_gpu=lo,
                max_cpus_per_gpu=hi,
                cpus_per_gpu=cur,
                cpu_profile=prof,
                profile=(StepSample(1, gpus, 128, 0.1, 0.0),) if gpus else (),
                grad_sqr=1.0 if gpus else None,
                grad_var=5.0 if gpus else None,
            )
        )
    cpus = tuple(int(c) for c in rng.choice([16, 48, 64], size=nodes))
    return Snapshot(now=600.0, node_gpus=(4,) * nodes, jobs=tuple(jobs), node_cpus=cpus)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(5))
def test_every_policy_plans_within_node_cpus_and_bounds(name: str, seed: int) -> None:
    for n_jobs in (1, 6, 20):
        snap = _random_snapshot(seed * 37 + n_jobs, n_jobs)
        plan = make_policy(name, seed).schedule(snap)
        validate_plan(snap, plan)
        views = {j.job_id: j for j in snap.jobs}
        used = [0] * len(snap.node_cpus)
        for p in plan.jobs:
            job = views[p.job_id]
            assert p.cpus_per_gpu >= max(job.min_cpus_per_gpu, 1)
            assert job.max_cpus_per_gpu == 0 or p.cpus_per_gpu <= job.max_cpus_per_gpu
            for node, g in p.placement.items():
                used[node] += g * p.cpus_per_gpu
        assert all(u <= c for u, c in zip(used, snap.node_cpus, strict=True))
        assert make_policy(name, seed).schedule(snap) == plan  # deterministic


def test_validate_plan_checks_cpus() -> None:
    a = _view("a-0", {}, max_cpus_per_gpu=8)
    snap = _snap(a)
    ok = _plan_for((a, {0: 4}))
    validate_plan(snap, ok)  # 0 = site default, 4 x 12 = 48 fits
    with pytest.raises(PlanError, match="outside bounds"):
        validate_plan(snap, Plan((replace(ok.jobs[0], cpus_per_gpu=9),)))
    b = _view("b-1", {})
    two = _plan_for((a, {0: 2}), (b, {0: 2}))
    two = Plan((replace(two.jobs[0], cpus_per_gpu=8), replace(two.jobs[1], cpus_per_gpu=17)))
    with pytest.raises(PlanError, match="50 CPUs planned, 48 exist"):
        validate_plan(_snap(a, b), two)


# -- the effect in a simulation ----------------------------------------------------------

HUNGRY = (("cifar10", 0.02),)
WORKLOAD = [
    WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128),
    WorkloadJob("cifar10-1", 100.0, "cifar10", 2, 256),
]


@pytest.mark.parametrize("name", ["fifo", "tiresias"])
def test_cpu_aware_allocation_finishes_cpu_hungry_jobs_sooner(
    apps: dict[str, AppTrace], name: str
) -> None:
    cfg = SimConfig(nodes=1, gpus_per_node=4, cpu_demand=HUNGRY)
    seen: set[tuple[str, int]] = set()

    def watch(cluster: SimCluster) -> None:
        for j in cluster.jobs:
            if j.gpus:
                seen.add((j.spec.name, j.cpus_per_gpu))

    aware = simulate(WORKLOAD, make_policy(name), apps, cfg, watch)
    one = simulate(WORKLOAD, make_policy(name), apps, replace(cfg, cpus_per_gpu=1))
    site = simulate(WORKLOAD, make_policy(name), apps, replace(cfg, cpus_per_gpu=12))
    assert aware.avg_jct < 0.1 * one.avg_jct
    # Beyond the site default: the first job takes the CPUs its neighbours leave free.
    assert aware.avg_jct < 0.8 * site.avg_jct
    assert ("cifar10-0", 12) in seen and max(c for k, c in seen if k == "cifar10-0") > 12
    again = simulate(WORKLOAD, make_policy(name), apps, cfg)
    assert [j.jct for j in again.jobs] == [j.jct for j in aware.jobs]


def test_without_cpu_demand_cpus_change_nothing(apps: dict[str, AppTrace]) -> None:
    jobs = [*WORKLOAD, WorkloadJob("ncf-2", 50.0, "ncf", 2, 512)]
    base = simulate(jobs, make_policy("ones"), apps, SimConfig(nodes=2))
    for cfg in (SimConfig(nodes=2, cpus_per_node=8), SimConfig(nodes=2, cpus_per_gpu=1)):
        res = simulate(jobs, make_policy("ones"), apps, cfg)
        assert [j.jct for j in res.jobs] == [j.jct for j in base.jobs]
