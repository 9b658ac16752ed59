"""Jobs that never say how long they train (``JobView.length_known`` False): their
remaining work comes from what they have done against the sizes of the jobs before them,
and ONES neither takes them for jobs about to end nor leaves GPUs idle around them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcorch.policy.estimate import estimate, one_gpu_time
from hpcorch.policy.lengths import Prior, gittins_remaining, gittins_weighted, survival
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.types import CompletedJob, JobView, Snapshot, StepSample, validate_plan
from tests.unknown_length import unknown_length_job

PROFILE = (
    *(StepSample(1, g, 16, 0.02 + 0.004 * 16 + 0.01 * (g > 1), 0.0, 1) for g in (1, 2, 4)),
    StepSample(1, 4, 8, 0.02 + 0.004 * 8 + 0.01, 0.0, 1),
    StepSample(1, 4, 16, 0.18, 0.0, 2),
)


def _job(name: str, **kw: object) -> JobView:
    return unknown_length_job(name, **{"profile": PROFILE, **kw})


def test_the_gittins_remaining_work_of_one_size_is_what_is_left_of_it() -> None:
    sizes = np.full(50, 1000.0)
    assert gittins_remaining(sizes, 400.0) == pytest.approx(600.0, rel=0.03)


def test_a_job_that_outlived_the_small_ones_counts_as_one_of_the_long_ones() -> None:
    sizes = np.sort(np.r_[np.full(90, 100.0), np.full(10, 10000.0)])
    new = gittins_remaining(sizes, 0.0)
    past = gittins_remaining(sizes, 200.0)
    assert new < 200.0  # most jobs are small: a new one ranks as a small one
    assert past == pytest.approx(9800.0, rel=0.1)  # it is one of the long ones
    # beyond every size seen: as long again as it has run, in doublings of the largest
    assert gittins_remaining(sizes, 50000.0) == pytest.approx(80000.0)


def test_jobs_beyond_every_size_rank_alike_within_a_doubling() -> None:
    """Ranked by the work it has done, the running one of two such jobs fell behind the
    other at every round and they swapped their GPUs (three imagenet jobs at load 1.0: 43
    GPUs preempted and started again every two minutes, 128 restarts a job)."""
    sizes = np.sort(np.r_[np.full(90, 100.0), np.full(10, 10000.0)])
    ahead, behind = gittins_remaining(sizes, 45000.0), gittins_remaining(sizes, 60000.0)
    assert ahead == behind == pytest.approx(80000.0)
    assert gittins_remaining(sizes, 81000.0) == pytest.approx(160000.0)  # the next step
    assert gittins_remaining(sizes, 10000.0) == pytest.approx(10000.0)  # where it begins


def test_the_sizes_count_the_jobs_still_running_as_at_least_their_work() -> None:
    """The jobs that left first are the short ones: nine of 100 s left while one has run
    for 1000 s and runs on. Counted as a size at least that large (Kaplan and Meier), it
    makes a job past the short ones one of the long ones, not a job as long again as it
    ran; without running jobs the distribution is the sizes' own."""
    sizes = np.full(9, 100.0)
    points, mass = survival(sizes, np.empty(0))
    assert list(points) == [100.0] and list(mass) == pytest.approx([1.0, 0.1])  # + the tail
    assert gittins_weighted(points, mass, 50.0) == pytest.approx(
        gittins_remaining(sizes, 50.0), rel=0.02
    )
    points, mass = survival(sizes, np.array([1000.0, 1000.0, 1000.0]))
    assert mass.sum() == pytest.approx(1.0) and mass[-1] == pytest.approx(0.25)
    assert gittins_weighted(points, mass, 50.0) > gittins_remaining(sizes, 50.0)


def test_a_job_past_an_epoch_is_weighed_by_the_epochs_the_others_trained() -> None:
    """Its work per epoch is known once it finished one; how many epochs it trains is
    weighed against the jobs that left (a long job near its end is then seen near it;
    by its work alone it stayed behind every shorter job until it ended)."""
    jobs = (_job("near", epoch=45), _job("young", epoch=5))
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=jobs)
    done = {"near": 4550.0, "young": 550.0}  # 100 one-GPU seconds an epoch
    # the long ones that left trained 50 epochs of 400 s: 20000 s of work
    departed = [(f"d{i}", 20000.0 if i % 2 else 200.0, 50.0 if i % 2 else 2.0) for i in range(10)]
    work = one_gpu_time(*(lambda e: (e.time, e.gmin))(estimate(snap, departed=departed, done=done)))
    by_epochs = estimate(snap, departed=departed, done=done, prior=Prior(by_epochs=True))
    left = one_gpu_time(by_epochs.time, by_epochs.gmin)
    # 50 epochs: 4.5 left, a little more for the chance of a longer one (the extra size)
    assert left[0] == pytest.approx(100.0 * (5 * 4.5 + 4.5) / 5)
    assert left[0] < 0.1 * work[0]  # by its work: 15450 s left of a 20000 s job
    assert left[1] == pytest.approx(100.0 * (5 * 44.5 + 94.5) / 6)  # past 2: one of 50


def test_a_job_past_an_epoch_is_weighed_most_by_departed_jobs_of_its_epoch_work() -> None:
    """Jobs of one kind train epochs of like work and like numbers of them: 100 short
    epochs (10 one-GPU seconds each) or 50 long ones (400 s). Both jobs below are in their
    eleventh epoch. With ``kin`` the long-epoch job is weighed by the long-epoch jobs that
    left (about 40 epochs to go, not the 90 the short-epoch kind would give it) and the
    short-epoch one by the short-epoch jobs; all alike, each got a blend of both."""
    jobs = (_job("long", epoch=10), _job("short", epoch=10))
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=jobs)
    done = {"long": 4200.0, "short": 105.0}  # 10.5 epochs of 400 s and of 10 s
    departed = [(f"s{i}", 1000.0, 100.0) for i in range(6)]
    departed += [(f"l{i}", 20000.0, 50.0) for i in range(6)]

    def left(kin: float) -> np.ndarray:
        e = estimate(snap, departed=departed, done=done, prior=Prior(by_epochs=True, kin=kin))
        return one_gpu_time(e.time, e.gmin) / np.array([400.0, 10.0])  # in epochs

    alike, kin = left(0.0), left(1.0)
    assert alike[0] == alike[1] == pytest.approx(72.0, rel=0.01)
    assert 39.5 < kin[0] < 0.65 * alike[0]  # 39.5, and a little for the longer kind
    assert kin[1] > alike[1] and kin[1] == pytest.approx(89.5, rel=0.1)


def test_unknown_lengths_come_from_the_work_of_the_jobs_that_left() -> None:
    """Without history every job of unknown length looked alike (and, with no job of known
    length, a second from its end). Against the work of departed jobs, a job that has done
    more than the small jobs ever needed ranks behind a new one and far from its end."""
    jobs = (_job("new", progress=0.0), _job("old", progress=2000.0, epoch=3))
    snap = Snapshot(now=0.0, node_gpus=(4, 4), jobs=jobs, restart_cost_s=24.5)
    done = {"new": 0.0, "old": 2000.0}  # one-GPU seconds of work each has done
    est = estimate(snap, done=done)
    # with nothing known of any job's length: as long again as it ran, at least an hour
    # (the placeholders alone said a fraction of a second)
    assert one_gpu_time(est.time, est.gmin) == pytest.approx([3600.0, 3600.0])
    sizes = [500.0] * 20 + [10000.0] * 3  # most did a quarter of what "old" has done
    est = estimate(snap, departed=[(f"gone{i}", w) for i, w in enumerate(sizes)], done=done)
    work = one_gpu_time(est.time, est.gmin)
    # a small one, a little more for the chance that it is a long one: (20 + 4) / 20
    assert work[0] == pytest.approx(500.0 * 1.2, rel=0.01)
    # one of the long ones (8000 left), or longer than any (the extra size: 18000 left)
    assert work[1] == pytest.approx((3 * 8000.0 + 18000.0) / 4)
    assert est.time[1, 4] < est.time[1, 1]  # keeps its own speed-up


def test_a_known_application_s_completed_jobs_say_how_much_is_left() -> None:
    jobs = (_job("j", application="app", progress=3000.0),)
    history = tuple(CompletedJob(f"h{i}", "app", 100.0, 400.0, 4000.0, 4) for i in range(3))
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=jobs, history=history)
    est = estimate(snap)
    # as a job that says it has 1000 units of progress left
    told = replace(jobs[0], length_known=True, progress=0.0, progress_per_epoch_hint=1000.0)
    thousand = estimate(replace(snap, jobs=(told,), history=())).time[0, 1]
    # (a little more than 1000: a size no job exceeded yet might be)
    assert est.time[0, 1] == pytest.approx(thousand, rel=0.4)
    assert est.time[0, 1] >= thousand


def test_ones_leaves_no_gpu_idle_around_jobs_of_unknown_length() -> None:
    """Two running jobs of unknown length on 4 of 16 GPUs each: with every job looking a
    second from its end, ONES never resized one and 8 GPUs idled (utilisation 26-30% on
    a whole workload). They grow into the pool."""
    jobs = tuple(
        _job(f"j{i}", progress=500.0 * (i + 1), epoch=1, gpus=4, placement={i: 4}, batch=64,
             micro_batch=16, accum_steps=1, attained_service=600.0, run_time=600.0)
        for i in range(2)
    )  # fmt: skip
    snap = Snapshot(now=0.0, node_gpus=(4, 4, 4, 4), jobs=jobs, restart_cost_s=24.5)
    policy = OnesPolicy(seed=0)
    plan = policy.schedule(snap)
    validate_plan(snap, plan)
    assert sum(p.gpus for p in plan.jobs) == 16


def test_ones_counts_the_work_done_at_the_speed_of_the_gpus_held() -> None:
    """The work a job has done is its one-GPU seconds: time held times the speed-up of the
    GPUs it held (not the progress it reports, which the controller counts at the batch it
    trains with now). A job that left the pool is remembered with it."""
    policy = OnesPolicy(seed=0)
    run = {"gpus": 4, "placement": {0: 4}, "batch": 64, "micro_batch": 16, "epoch": 1}
    jobs = (_job("a", progress=100.0, attained_service=400.0, **run), _job("b", progress=9.0))
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=jobs, restart_cost_s=24.5)
    policy.schedule(snap)
    assert policy._work == {"a": 400.0, "b": 0.0}  # first seen: its GPU-seconds
    est = estimate(snap)
    speedup = (one_gpu_time(est.time, est.gmin) / est.time[:, 4])[0]
    assert 2.0 < speedup < 4.0
    policy.schedule(replace(snap, now=100.0))
    assert policy._work["a"] == pytest.approx(400.0 + 100.0 * speedup, rel=0.05)
    assert len(policy.departed()) == 0
    policy.schedule(replace(snap, now=160.0, jobs=jobs[1:]))
    left = policy.departed()
    assert len(left) == 1 and left[0][0] == "a"
    assert left[0][1] == pytest.approx(400.0 + 100.0 * speedup, rel=0.05)
    assert left[0][2] == 2  # last seen in its epoch 1 (from 0): it trained 2
    c = _job("c", attained_service=50.0, **{**run, "epoch": 0})
    policy.schedule(replace(snap, now=220.0, jobs=(c,)))
    policy.schedule(replace(snap, now=280.0, jobs=()))
    assert policy.departed()[-1][0] == "c" and policy.departed()[-1][2] == 0  # none ended


def test_jobs_of_a_known_application_are_weighed_against_its_own_departed_jobs() -> None:
    jobs = (_job("j", application="app", epoch=2), _job("k", application="other", epoch=2))
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=jobs)
    departed = [("app", 5000.0)] * 3 + [("small", 100.0)] * 20
    est = estimate(snap, departed=departed, done={"j": 50.0, "k": 50.0})
    work = one_gpu_time(est.time, est.gmin)
    assert work[0] == pytest.approx((3 * 4950.0 + 9950.0) / 4)  # its own: all long
    assert work[1] == pytest.approx((20 * 50.0 + 4 * 50.0) / 20)  # the pool's: mostly short


def test_a_job_past_its_first_epochs_gets_the_noise_forecast_of_its_epochs_left() -> None:
    """With its work per epoch known, the work left says how many epochs are left: its
    gradient noise is forecast to grow over them (no history: linearly with the epoch), so
    it scales better on more GPUs than at its current noise alone."""
    job = _job("j", epoch=4, grad_sqr=1.0, grad_var=0.5)
    snap = Snapshot(now=0.0, node_gpus=(4, 4, 4, 4), jobs=(job,))
    departed = [("x", 45000.0)] * 10
    est = estimate(snap, departed=departed, done={"j": 4500.0})  # 1000 per epoch: 40 left
    first = replace(snap, jobs=(replace(job, epoch=0),))  # in its first epoch: unknown
    now_only = estimate(first, departed=departed, done={"j": 4500.0})
    assert est.time[0, 1] == pytest.approx(now_only.time[0, 1])  # the same work left
    speedup = est.time[0, 1] / est.time[0, 8]
    assert speedup > 1.03 * now_only.time[0, 1] / now_only.time[0, 8]


def test_a_new_job_never_measured_is_not_ranked_by_steps_it_cannot_time() -> None:
    """A job of a model never measured declares its length in steps; at a typical job's
    step time the bundled NCF jobs (194,180 steps of 0.01 s) looked among the longest and
    waited for minutes at load 1.0. Once jobs have left the pool it is weighed as a job of
    unknown length until its first measurement."""
    new = _job("ncf", length_known=True, max_epochs=10, progress_per_epoch_hint=19418.0,
               profile=())  # fmt: skip
    snap = Snapshot(now=0.0, node_gpus=(4,), jobs=(new,))
    declared = one_gpu_time(*(lambda e: (e.time, e.gmin))(estimate(snap)))[0]
    departed = [(f"j{i}", 300.0) for i in range(10)] + [("long", 50000.0)]
    weighed = estimate(snap, departed=departed, done={"ncf": 0.0})
    assert one_gpu_time(weighed.time, weighed.gmin)[0] < 400.0 < declared
    measured = replace(new, profile=PROFILE)  # then its own speed and declared length
    told = estimate(replace(snap, jobs=(measured,)), departed=departed, done={"ncf": 0.0})
    alone = estimate(replace(snap, jobs=(measured,)))
    assert told.time[0, 1] == pytest.approx(alone.time[0, 1])
