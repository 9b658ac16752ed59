"""Policies: plans always fit the pool and the jobs' bounds; ONES is deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from hpcorch.policy import POLICIES, make_policy
from hpcorch.policy.tiresias import TiresiasPolicy
from hpcorch.policy.types import JobView, Snapshot, StepSample, validate_plan

APPS = {
    # name: (min_batch, max_batch, min_micro, max_micro)
    "cifar10": (128, 4096, 32, 1024),
    "bert": (12, 384, 4, 12),
    "ncf": (256, 32768, 32, 32768),
}


def _job(rng: np.random.Generator, i: int, node_free: list[int]) -> JobView:
    app = list(APPS)[i % len(APPS)]
    lo, hi, mlo, mhi = APPS[app]
    req = int(rng.choice([1, 2, 4, 8]))
    running = rng.random() < 0.5 and node_free[i % len(node_free)] >= 1
    placement: dict[int, int] = {}
    gpus = 0
    if running:
        node = i % len(node_free)
        gpus = min(node_free[node], int(rng.integers(1, 5)))
        node_free[node] -= gpus
        placement = {node: gpus}
    profile = ()
    if running:
        profile = (StepSample(1, gpus, mlo, 0.05 * gpus, 0.01 * (gpus - 1)),)
    return JobView(
        job_id=f"{app}-{i}",
        application=app,
        submit_time=float(i * 10),
        requested_gpus=req,
        requested_batch=max(lo, req * mlo),
        min_gpus=min(req, int(rng.integers(1, 3))),
        max_gpus=max(req, int(rng.integers(4, 17))),
        min_batch=lo,
        max_batch=hi,
        min_micro_batch=mlo,
        max_micro_batch=mhi,
        max_epochs=10,
        progress_per_epoch_hint=100.0,
        gpus=gpus,
        placement=placement,
        batch=gpus * mlo if gpus else 0,
        micro_batch=mlo if gpus else 0,
        accum_steps=1,
        epoch=int(rng.integers(0, 5)),
        progress=float(rng.random() * 300),
        grad_sqr=1.0 if running else None,
        grad_var=float(rng.random() * 20) if running else None,
        attained_service=float(rng.random() * 80000),
        profile=profile,
    )


def _snapshot(seed: int, n_jobs: int, nodes: int = 4) -> Snapshot:
    rng = np.random.default_rng(seed)
    free = [4] * nodes
    jobs = tuple(_job(rng, i, free) for i in range(n_jobs))
    # Drop running jobs whose min/max bounds the random draw violates.
    jobs = tuple(
        j
        if not j.running or j.min_gpus <= j.gpus <= j.max_gpus
        else JobView(**{**j.__dict__, "gpus": 0, "placement": {}, "batch": 0, "micro_batch": 0})
        for j in jobs
    )
    return Snapshot(now=600.0, node_gpus=(4,) * nodes, jobs=jobs)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(6))
def test_plans_fit_pool_and_bounds(name: str, seed: int) -> None:
    policy = make_policy(name, seed)
    for n_jobs in (1, 5, 24):
        snap = _snapshot(seed * 31 + n_jobs, n_jobs)
        plan = policy.schedule(snap)
        validate_plan(snap, plan)  # raises on over-allocation or bound violation
        assert plan.gpus_used <= snap.total_gpus


@pytest.mark.parametrize("name", ["ones", "sidecar"])
def test_work_conserving_when_jobs_wait(name: str) -> None:
    snap = _snapshot(3, 30)
    plan = make_policy(name).schedule(snap)
    assert plan.gpus_used == snap.total_gpus


def test_ones_deterministic_for_seed() -> None:
    snap = _snapshot(7, 20)
    a = make_policy("ones", 5).schedule(snap)
    b = make_policy("ones", 5).schedule(snap)
    assert a == b


def test_tiresias_gang_schedules_in_queue_order() -> None:
    snap = _snapshot(11, 12)
    plan = TiresiasPolicy().schedule(snap)
    by_id = plan.by_id()
    for job in snap.jobs:
        p = by_id.get(job.job_id)
        if p is not None and not job.running:
            assert p.gpus == job.requested_gpus
            assert p.global_batch <= job.requested_batch


@pytest.mark.parametrize(
    "options",
    [
        {"whole_set": True},
        {"knee": 0.5},
        {"priority": 1.0},
        {"max_job_gpus": 4},
        {"rank_weight": 0.0},
        {"now_rate": True},
    ],
)
def test_ones_variants_give_valid_plans(options: dict[str, object]) -> None:
    from hpcorch.policy.ones import OnesPolicy

    policy = OnesPolicy(seed=1, **options)  # type: ignore[arg-type]
    for seed in range(3):
        snap = _snapshot(seed, 20)
        plan = policy.schedule(snap)
        validate_plan(snap, plan)
        if "max_job_gpus" in options:
            assert all(p.gpus <= 4 for p in plan.jobs)


def test_estimate_current_speed_and_best_remaining_time() -> None:
    """The current-epoch speed is 1 at the best count and never above; finishing with
    every epoch at its own best count is never slower than any fixed count."""
    from hpcorch.policy.estimate import estimate

    for seed in range(3):
        est = estimate(_snapshot(seed, 20), explore=4.0)
        assert est.speed_now is not None and est.remaining is not None
        for j in range(len(est.jobs)):
            k = int(est.gmax[j])
            lo = int(est.gmin[j])
            speed = est.speed_now[j, max(lo, 1) : k + 1]
            assert speed.max() == pytest.approx(1.0)
            assert (speed >= 0).all() and (speed <= 1.0 + 1e-12).all()
            times = est.time[j, max(lo, 1) : k + 1]
            assert est.remaining[j] <= times.min() * (1 + 1e-9)


def test_a_job_that_cannot_rebatch_is_costed_at_the_batch_it_runs_with() -> None:
    """A batch-only change is free only where the job's runtime takes it (managed mode):
    a job whose batch changes only at a relaunch keeps its batch at its GPUs."""
    from dataclasses import replace

    from hpcorch.policy.estimate import estimate

    snap = _snapshot(3, 12)
    i, job = next((i, j) for i, j in enumerate(snap.jobs) if j.running)
    free = estimate(snap, explore=4.0)
    fixed = replace(job, rebatch=False)
    jobs = tuple(fixed if j is job else j for j in snap.jobs)
    kept = estimate(replace(snap, jobs=jobs), explore=4.0)
    g = job.gpus
    assert kept.batch[i, g] == job.batch  # no free switch to the best batch
    assert kept.time[i, g] >= free.time[i, g] * (1 - 1e-9)  # the best batch was free before
    other = [k for k in range(1, int(kept.gmax[i]) + 1) if k != g]
    assert all(kept.time[i, k] == free.time[i, k] for k in other)  # a restart: any batch


def test_tiresias_keeps_the_queue_place_of_a_job_missing_for_a_round() -> None:
    """A job the controller sets apart for a round (it cannot be moved yet) is not sent
    to the back of its queue when it comes back."""
    from dataclasses import replace

    snap = _snapshot(11, 8)
    policy = TiresiasPolicy()
    policy.schedule(snap)
    order = list(policy._queues[0])
    gone = order[0]
    policy.schedule(replace(snap, now=660.0, jobs=tuple(j for j in snap.jobs if j.job_id != gone)))
    policy.schedule(replace(snap, now=720.0))
    assert policy._queues[0][0] == gone
    policy.schedule(replace(snap, now=720.0 + 7200, jobs=snap.jobs[1:]))
    assert snap.jobs[0].job_id not in policy._queues[0]  # gone for good: forgotten
