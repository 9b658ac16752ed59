"""A job's GPU count in its current epoch: ONES's remaining time assumes a job keeps a count
to its end, so a job whose first epoch has tiny gradient noise (yolov3) is planned on the
many GPUs its later epochs use well, where that epoch runs several times slower than on
one. ``now_floor`` plans no count above the current epoch's best that runs it that slowly
(:func:`hpcorch.policy.estimate.slow_now`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hpcorch.policy.estimate import estimate, slow_now
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.types import CompletedJob, JobView, Snapshot, StepSample

EPOCHS = 50
# a step's time grows with the nodes it spans; the all-reduce is the part past compute
PROFILE = (
    StepSample(1, 1, 8, 0.33, 0.0),
    StepSample(1, 4, 8, 0.9, 0.57),
    StepSample(4, 16, 8, 1.2, 0.87),
    StepSample(16, 64, 8, 1.5, 1.17),
)
NOISE = ((1.0, 0.04),) + ((1.0, 100.0),) * (EPOCHS - 1)  # tiny in epoch 0 only


def _snapshot(epoch: int, progress: float, gpus: int = 0) -> Snapshot:
    job = JobView(
        job_id="yolo",
        application="yolo",
        submit_time=0.0,
        requested_gpus=1,
        requested_batch=8,
        min_gpus=1,
        max_gpus=64,
        min_batch=8,
        max_batch=512,
        min_micro_batch=4,
        max_micro_batch=8,
        max_epochs=EPOCHS,
        progress_per_epoch_hint=2000.0,
        epoch=epoch,
        progress=progress,
        grad_sqr=NOISE[epoch][0],
        grad_var=NOISE[epoch][1],
        profile=PROFILE,
        gpus=gpus,
        placement={n: 4 for n in range(gpus // 4)} if gpus else {},
        batch=8 * gpus,
        micro_batch=8 if gpus else 0,
    )
    done = CompletedJob("old", "yolo", 9000.0, 90000.0, 2000.0 * EPOCHS, EPOCHS, PROFILE, NOISE)
    return Snapshot(now=100.0, node_gpus=(4,) * 16, jobs=(job,), history=(done,))


def _gpus(policy: OnesPolicy, snap: Snapshot) -> int:
    return policy.schedule(snap).jobs[0].gpus


def test_a_count_that_only_later_epochs_use_well_is_not_planned_now() -> None:
    snap = _snapshot(epoch=0, progress=0.0)
    est = estimate(snap, explore=4.0)
    assert est.speed_now is not None and est.now_left is not None
    best = int(np.argmax(est.speed_now[0]))
    assert best <= 4 and est.speed_now[0, 64] < 0.5  # epoch 0: a few GPUs, 64 is slow
    assert int(np.argmin(est.time[0, 1:])) + 1 > 16  # kept to the end: many GPUs win
    assert _gpus(OnesPolicy(seed=0), snap) > 16  # so the default plans many now
    assert est.now_left[0] > 300.0
    slow = slow_now(est, 0.5, 300.0)[0]
    assert not slow[: best + 1].any() and slow[64]
    assert _gpus(OnesPolicy(seed=0, now_floor=0.5), snap) <= 4


def test_the_floor_leaves_later_epochs_an_epoch_about_to_end_and_running_jobs_alone() -> None:
    later = _snapshot(epoch=1, progress=2000.0)  # noisy: many GPUs are fast now too
    assert _gpus(OnesPolicy(seed=0, now_floor=0.5), later) > 16
    ending = _snapshot(epoch=0, progress=1990.0)  # 10 steps left in the slow epoch
    est = estimate(ending, explore=4.0)
    assert est.now_left is not None and est.now_left[0] < 300.0
    assert not slow_now(est, 0.5, 300.0).any()
    assert _gpus(OnesPolicy(seed=0, now_floor=0.5), ending) > 16
    running = _snapshot(epoch=0, progress=0.0, gpus=64)
    held = replace(running, jobs=(replace(running.jobs[0], resizable=False),))
    assert _gpus(OnesPolicy(seed=0, now_floor=0.5), held) == 64  # cannot be moved: kept
    # held a round to measure another per-GPU batch: kept, not preempted
    assert _gpus(OnesPolicy(seed=0, now_floor=0.5), running) == 64
    assert _gpus(OnesPolicy(seed=0, now_floor=0.5, probe=False), running) <= 4  # shrunk
    assert not slow_now(estimate(running, explore=4.0), 0.0, 300.0).any()  # 0: off
