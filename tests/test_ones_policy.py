"""ONES's inputs as the controller gives them (pure logic, fake snapshots).

* A job whose length nobody declared shows one placeholder epoch of one step: ONES must
  not take it for a job that is almost done.
* A job that needs at least two GPUs has no one-GPU time: its priority is its remaining
  GPU-seconds at its minimum, not a constant that starves it.
* Jobs report seconds per optimizer step without the all-reduce part: the step-time model
  infers it from steps at several accumulation counts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcorch.model.throughput import ThroughputModel, split_sync
from hpcorch.policy.estimate import estimate, one_gpu_time
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.split import split_schedule
from hpcorch.policy.types import JobView, Snapshot, StepSample, validate_plan

A, B = 0.02, 0.004  # compute of one micro-step: A + B x micro (seconds)
SYNC = {(1, 2): 0.05, (1, 4): 0.12, (2, 8): 0.9}  # all-reduce per step at (nodes, GPUs)


def _step(nodes: int, gpus: int, micro: int, accum: int) -> StepSample:
    """What a job reports: seconds per optimizer step, no sync time."""
    t = accum * (A + B * micro) + SYNC.get((nodes, gpus), 0.0)
    return StepSample(nodes, gpus, micro, t, 0.0, accum)


PROFILE = (_step(1, 4, 8, 1), _step(1, 4, 16, 1), _step(1, 4, 16, 2), _step(1, 2, 16, 1))


def _job(name: str, **kw: object) -> JobView:
    base = JobView(
        job_id=name,
        application="app",
        submit_time=0.0,
        requested_gpus=1,
        requested_batch=32,
        min_gpus=1,
        max_gpus=4,
        min_batch=32,
        max_batch=32,
        min_micro_batch=1,
        max_micro_batch=16,
        max_epochs=10,
        progress_per_epoch_hint=1000.0,
        profile=PROFILE,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_split_sync_recovers_the_all_reduce_from_accumulation_counts() -> None:
    sync = split_sync([*PROFILE, _step(2, 8, 16, 1), _step(2, 8, 8, 3)])
    assert set(sync) == {(1, 2), (1, 4), (2, 8)}
    for key, value in sync.items():
        assert value == pytest.approx(SYNC[key], abs=1e-9)


def test_split_sync_gives_up_where_compute_and_all_reduce_cannot_be_told_apart() -> None:
    one_count = [_step(1, 4, 8, 1), _step(1, 4, 16, 1), _step(1, 2, 16, 1)]
    assert split_sync(one_count) == {}
    measured = [*PROFILE[:3], StepSample(1, 2, 16, 0.2, 0.05, 1)]  # a job that reports sync
    assert split_sync(measured) == {}


def test_model_without_sync_times_does_not_predict_perfect_scaling() -> None:
    model = ThroughputModel(PROFILE, min_batch=32)
    one = float(model.iteration_time(*(np.array([x]) for x in (1, 1, 32, 1)))[0])
    assert one == pytest.approx(A + B * 32, rel=0.02)  # the true one-GPU step
    # reading the 4-GPU step as all compute would have put it 0.12 s (the all-reduce) higher
    without = ThroughputModel(PROFILE[:2], min_batch=32)
    naive = float(without.iteration_time(*(np.array([x]) for x in (1, 1, 32, 1)))[0])
    assert naive > one + 0.1


def test_a_job_of_unknown_length_counts_as_a_typical_job_not_as_almost_done() -> None:
    jobs = (
        _job("short", epoch=8, progress=8000.0),
        _job("long", epoch=1, progress=1000.0),
        _job("mid", epoch=5, progress=5000.0),
        _job("new", max_epochs=1, progress_per_epoch_hint=1.0, length_known=False),
    )
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=jobs, restart_cost_s=24.5)
    est = estimate(snap)
    work = one_gpu_time(est.time, est.gmin)
    assert work[3] == pytest.approx(work[2], rel=1e-6)  # the median of the known three
    assert work[0] < work[3] < work[1]
    # as the placeholder says, it would have been a fraction of a second
    naive = estimate(replace(snap, jobs=(*jobs[:3], replace(jobs[3], length_known=True))))
    assert one_gpu_time(naive.time, naive.gmin)[3] < 1.0


def test_a_job_that_needs_two_gpus_is_not_starved_by_its_priority() -> None:
    """Two queued jobs on two GPUs: the one that needs both is nearly done, the other has
    its whole run ahead. Shortest remaining first gives the GPUs to the first; a one-GPU
    reference time of 1 s for it (none exists) gave them to the long job."""
    jobs = (
        _job("long", max_gpus=2, epoch=0, progress=0.0),
        _job("pair", min_gpus=2, max_gpus=2, epoch=9, progress=9500.0),
    )
    snap = Snapshot(now=0.0, node_gpus=(2,), jobs=jobs, restart_cost_s=24.5)
    est = estimate(snap)
    work = one_gpu_time(est.time, est.gmin)
    assert np.isfinite(work).all() and work[1] < work[0]
    plan = OnesPolicy(seed=0).schedule(snap).by_id()
    assert set(plan) == {"pair"} and plan["pair"].gpus == 2


def _fixed(gpus: int, **kw: object) -> JobView:
    """A job running on ``gpus`` GPUs of node 0 at 16 a GPU that cannot be stopped yet."""
    return _job(
        "fixed",
        gpus=gpus,
        placement={0: gpus},
        batch=16 * gpus,
        micro_batch=16,
        accum_steps=1,
        resizable=False,
        **kw,
    )


@pytest.mark.parametrize("cpus", [(), (48, 48)])
def test_ones_shown_the_fixed_jobs_keeps_them_and_plans_around_them(
    cpus: tuple[int, ...],
) -> None:
    """A job that cannot be stopped yet is shown to ONES pinned where it runs: it keeps
    its GPUs and node, ONES remembers it in its population, the others fit beside it."""
    fixed = _fixed(3, epoch=9, progress=9900.0)
    jobs = (fixed, _job("a", epoch=2, progress=2000.0), _job("b", epoch=1, progress=1000.0))
    snap = Snapshot(now=0.0, node_gpus=(4, 4), jobs=jobs, restart_cost_s=24.5, node_cpus=cpus)
    for sees in (False, True):
        policy = OnesPolicy(seed=0, sees_fixed=sees)
        plan = split_schedule(policy, snap)
        validate_plan(snap, plan)
        by = plan.by_id()
        assert by["fixed"].gpus == 3 and dict(by["fixed"].placement) == {0: 3}
        assert {"a", "b"} <= set(by)
        assert ("fixed" in policy._pop[0]) is sees
        # asked directly, ONES keeps a job that cannot be resized where it is
        alone = policy.schedule(snap).by_id()
        assert alone["fixed"].gpus == 3 and dict(alone["fixed"].placement) == {0: 3}


@pytest.mark.parametrize("others", [False, True])
def test_a_job_that_cannot_be_stopped_yet_gets_its_batch_planned_when_no_job_can_move(
    others: bool,
) -> None:
    """A new job trains at the batch its first measurements call for (a probe here: it
    was measured at one per-GPU batch) before it may be stopped, also in a round where no
    job may move, or no GPU is free for those that wait: the policy is still asked."""
    fixed = _fixed(4, min_batch=16, max_batch=256, profile=(_step(1, 4, 16, 1),))
    queued = (_job("waits", min_gpus=2),) if others else ()
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=(fixed, *queued), restart_cost_s=24.5)
    plan = split_schedule(OnesPolicy(seed=0), snap)
    validate_plan(snap, plan)
    by = plan.by_id()
    assert by["fixed"].gpus == 4 and dict(by["fixed"].placement) == {0: 4}
    assert by["fixed"].micro_batch != 16  # another per-GPU batch, measured for free
    assert "waits" not in by
    kept = split_schedule(OnesPolicy(seed=0, sees_fixed=False), snap).by_id()
    assert kept["fixed"].global_batch == 64  # a policy that does not plan around it


def test_the_simulation_shows_ones_the_fixed_jobs_as_production_does() -> None:
    """The simulator times the policy through a wrapper; the wish to see the fixed jobs
    passes through it as the controller passes the policy itself in production."""
    from hpcorch.sim.controlled import _Timed

    assert _Timed(OnesPolicy(sees_fixed=True)).sees_fixed
    assert not _Timed(OnesPolicy(sees_fixed=False)).sees_fixed
