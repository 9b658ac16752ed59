"""Fair tails: a job's restarts bounded per hour of its own run, waiting or shrunk jobs
aged, and a resize charged the GPU-time it wastes (:mod:`hpcorch.policy.tails`), on
every job by default (or on the jobs of unknown length only)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.tails import age_factor, guarded, restart_guard, restarts_over
from hpcorch.policy.types import Snapshot
from tests.unknown_length import unknown_length_job

_job = unknown_length_job


RUN = {"gpus": 4, "placement": {0: 4}, "batch": 64, "micro_batch": 16}


def test_restarts_are_bounded_per_hour_of_the_job_s_own_run() -> None:
    jobs = (
        _job("new", restarts=2, run_time=600.0, **RUN),  # 2 free: a third is one over
        _job("long", restarts=6, run_time=4 * 3600.0, **RUN),  # earned 2 + 4: 7 is one over
        _job("fine", restarts=3, run_time=3 * 3600.0, **RUN),  # earned 5: within it
        _job("queued", restarts=9, run_time=600.0),  # not running: nothing to keep
    )
    over = restarts_over(jobs, free=2.0, per_hour=1.0)
    assert over == pytest.approx([1.0 - 600.0 / 3600.0, 1.0, 0.0, 0.0])
    assert not restarts_over(jobs, free=2.0, per_hour=0.0).any()  # no bound


def test_a_job_past_its_restarts_keeps_its_gpus_unless_a_change_gains_more() -> None:
    """Its current allocation is worth ``1 + over`` times as much: a change must beat that.
    Not a pin: a job kept on its GPUs whatever the others gain held back the short jobs
    that arrived (measured worse on the bundled workloads)."""
    value = np.array([[0.0, 1.0, 1.5, 1.8, 2.0], [0.0, 1.0, 1.5, 1.8, 2.0]])
    cur = np.array([2, 2])
    out = restart_guard(value, cur, np.array([1.0, 0.0]))
    assert out[0, 2] == pytest.approx(3.0) and out[1, 2] == pytest.approx(1.5)
    assert np.argmax(out[0]) == 2  # growing to 4 (2.0) no longer beats keeping 2
    assert np.argmax(out[1]) == 4
    assert out[0, 0] == 0.0  # preempted it is worth nothing: the others must gain 3.0
    typed = np.stack([value, value], axis=1)  # (job, type, GPUs), both on type 1
    out = restart_guard(typed, np.stack([np.array([1, 1]), cur]), np.array([1.0, 0.0]))
    assert out[0, 1, 2] == pytest.approx(3.0) and out[0, 0, 2] == pytest.approx(1.5)


def test_the_guards_apply_to_every_job_by_default_and_can_be_narrowed() -> None:
    jobs = (_job("unknown"), _job("known", length_known=True))
    assert OnesPolicy().tails == "all"
    assert OnesPolicy().age_s > 0 and OnesPolicy().age_cap > 1
    assert list(guarded(jobs, "unknown")) == [True, False]
    assert list(guarded(jobs, "all")) == [True, True]
    assert not guarded(jobs, "none").any()
    with pytest.raises(ValueError, match="tails must be one of"):
        guarded(jobs, "some")


def test_a_resize_of_a_job_of_unknown_length_is_charged_the_gpu_time_it_wastes() -> None:
    """A running job of unknown length is charged, for a change, the value of the
    GPU-seconds its restart idles (the running jobs' value per GPU, times the restart
    cost, times the GPUs it idles, over the time the change lasts); with ``tails`` narrowed
    to those jobs, a job of known length is not (its estimate does not change as it runs);
    by default it is."""
    policy = OnesPolicy(seed=0, tails="unknown")
    jobs = (_job("u", **RUN), _job("k", length_known=True, **RUN))
    snap = Snapshot(now=0.0, node_gpus=(4, 4), jobs=jobs, restart_cost_s=25.0)
    value = np.array([[0.0, 0.5, 0.8, 0.9, 1.0, 1.1], [0.0, 0.5, 0.8, 0.9, 1.0, 1.1]])
    t = np.full(value.shape, 1000.0)
    cur = np.array([4, 4])
    out = policy.charge(value, t, cur, snap)
    lam = (1.0 + 1.0) / 8  # the running jobs' value per GPU of the pool
    assert out[0, 4] == 1.0 and out[1, 4] == 1.0  # keeping costs nothing
    assert out[0, 5] == pytest.approx(1.1 - lam * 25.0 * 5 / 1000.0)
    assert out[0, 2] == pytest.approx(0.8 - lam * 25.0 * 4 / 1000.0)  # its 4 GPUs idle
    assert out[1] == pytest.approx(value[1])  # known length: not charged
    assert OnesPolicy().charge(value, t, cur, snap)[1, 5] < 1.1


def test_a_job_behind_its_share_weighs_more() -> None:
    jobs = (
        _job("waited", submit_time=0.0),  # an hour in the pool, nothing served
        _job("served", submit_time=0.0, attained_service=4 * 3600.0),  # its share: 4 GPUs
        _job("known", submit_time=0.0, length_known=True),
    )
    snap = Snapshot(now=3600.0, node_gpus=(4, 4, 4), jobs=jobs)
    mask = guarded(jobs, "unknown")
    assert age_factor(snap, jobs, 3600.0, 1.0, mask) == pytest.approx([2.0, 1.0, 1.0])
    assert age_factor(snap, jobs, 0.0, 1.0, mask) == pytest.approx([1.0, 1.0, 1.0])


def test_a_cap_on_aging_leaves_the_jobs_far_behind_ordered_by_remaining_work() -> None:
    jobs = (
        _job("an hour", submit_time=0.0),
        _job("three hours", submit_time=-7200.0),
        _job("served", submit_time=0.0, attained_service=4 * 3600.0),
    )
    snap = Snapshot(now=3600.0, node_gpus=(4, 4, 4), jobs=jobs)
    every = np.ones(3, dtype=bool)
    assert age_factor(snap, jobs, 3600.0, 1.0, every) == pytest.approx([2.0, 4.0, 1.0])
    capped = age_factor(snap, jobs, 3600.0, 1.0, every, cap=2.0)
    assert capped == pytest.approx([2.0, 2.0, 1.0])
    assert age_factor(snap, jobs, 3600.0, 2.0, every, cap=2.0) == pytest.approx([2.0, 2.0, 1.0])
    some = np.array([True, False, True])
    assert age_factor(snap, jobs, 3600.0, 1.0, some, cap=2.0) == pytest.approx([2.0, 1.0, 1.0])
    # a cap below 1 ages no job
    assert age_factor(snap, jobs, 3600.0, 1.0, every, cap=0.5) == pytest.approx([1.0] * 3)
    # through the policy (value: each job's completion rate): uncapped, the job behind
    # three hours outweighs the one behind one though it has twice the work left; capped,
    # the one with less work left weighs more again
    work = np.array([1000.0, 2000.0, 500.0])
    value = np.stack([np.zeros(3), 1.0 / work], axis=1)
    capped_w = OnesPolicy(tails="all", age_s=3600.0, age_cap=2.0).weigh(value, work, jobs, snap)
    free_w = OnesPolicy(tails="all", age_s=3600.0, age_cap=0.0).weigh(value, work, jobs, snap)
    assert free_w[1, 1] > free_w[0, 1]
    assert capped_w[0, 1] > capped_w[1, 1]


def test_the_controller_shows_a_job_s_run_time_over_all_its_launches() -> None:
    """The restarts a job earns are per hour of its whole run, not of its current launch:
    the controller showed only the current launch's seconds (``run_seconds``, reset at each
    launch), so a job run for hours and just resized had earned nothing (the simulator's
    own engine counted them all, and the two disagreed)."""
    from hpcorch.controller.snapshot import job_view
    from hpcorch.controller.store import JobRecord

    rec = JobRecord(
        slurm_id=7, job_key="j7", name="j", user="u", job_dir="", app="a", min_gpus=1,
        max_gpus=8, batch=64, max_batch=1024, max_micro=64, submit_time=0.0, phase="running",
        phase_since=9000.0, gpus=4, nodes=1, node_list="n1", node_gpus="4", launches=6,
        run_seconds=60.0, run_total_s=4 * 3600.0,
    )  # fmt: skip
    view = job_view(rec, (), {"n1": 0}, 8)
    assert (view.run_time, view.restarts) == (4 * 3600.0, 5)
    # 2 free and 1 an hour: 6 earned, a sixth restart is within it
    assert restarts_over((view,), free=2.0, per_hour=1.0)[0] == 0.0


def test_a_change_to_a_job_changed_often_is_charged_over_less_time() -> None:
    """A change is charged the GPU-time its restart idles, spread over the time it is
    expected to last: the time between the job's changes so far (the horizon counted as
    one interval before the first), at most the horizon. A job preempted and started again
    every two minutes had each change spread over an hour, and was changed again."""
    policy = OnesPolicy(seed=0, waste_horizon_s=3600.0)
    jobs = (
        _job("new", restarts=0, run_time=0.0),
        _job("calm", restarts=1, run_time=7200.0),
        _job("churned", restarts=59, run_time=7200.0),
    )
    assert policy.lasts(jobs) == pytest.approx([3600.0, 3600.0, 180.0])
    policy.waste_adapt = False
    assert policy.lasts(jobs) == pytest.approx([3600.0] * 3)
