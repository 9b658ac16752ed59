"""A new job's compute curve measured for free: ONES plans a running job measured at one
per-GPU batch only at another for a round (a batch-only change, no restart), and keeps
its GPUs until that measurement is in (pure logic, fake snapshots)."""

from __future__ import annotations

from dataclasses import replace

from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.types import JobView, Snapshot, StepSample, validate_plan

# a new job on one node's 4 GPUs, measured there at per-GPU batch 32 only
ONE_POINT = (StepSample(1, 4, 32, 0.30, 0.0, 1),)


def _job(**kw: object) -> JobView:
    base = JobView(
        job_id="new",
        application="job:1",
        submit_time=0.0,
        requested_gpus=4,
        requested_batch=128,
        min_gpus=1,
        max_gpus=16,
        min_batch=32,
        max_batch=1024,
        min_micro_batch=4,
        max_micro_batch=64,
        max_epochs=50,
        progress_per_epoch_hint=200_000.0,
        gpus=4,
        placement={0: 4},
        batch=128,
        micro_batch=32,
        accum_steps=1,
        profile=ONE_POINT,
        model_bytes=4_000_000,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _plan(job: JobView, **policy: object) -> tuple[int, int, int]:
    snap = Snapshot(now=600.0, node_gpus=(4, 4, 4, 4), jobs=(job,), restart_cost_s=25.0)
    plan = OnesPolicy(**policy).schedule(snap)  # type: ignore[arg-type]
    validate_plan(snap, plan)
    p = plan.by_id()["new"]
    return p.gpus, p.micro_batch, p.global_batch


def test_a_job_measured_at_one_batch_is_probed_at_half_of_it_on_its_gpus() -> None:
    gpus, micro, batch = _plan(_job())
    assert (gpus, micro, batch) == (4, 16, 64)  # on 16 GPUs unprobed (below)


def test_without_probing_the_guess_moves_it_at_once() -> None:
    # the point of holding it: on a guess from one measurement, ONES would resize it now
    gpus, _micro, _batch = _plan(_job(), probe=False)
    assert gpus != 4


def test_a_job_measured_at_two_batches_is_scheduled_as_usual() -> None:
    two = (*ONE_POINT, StepSample(1, 4, 16, 0.22, 0.0, 1))
    gpus, micro, _batch = _plan(_job(profile=two))
    assert gpus != 4 or micro != 16  # no longer held at the probe


def test_a_job_that_cannot_take_a_new_batch_is_not_probed() -> None:
    gpus, _micro, _batch = _plan(_job(rebatch=False))
    assert gpus != 4  # a batch change would cost it a restart: no probe, no hold


def test_a_job_whose_bounds_allow_no_other_batch_is_not_held() -> None:
    fixed = _job(min_micro_batch=32, max_micro_batch=32)  # per-GPU batch 32 or nothing
    gpus, micro, _batch = _plan(fixed)
    assert micro == 32
    # a probe that cannot happen must not pin the job to its first GPUs forever
    assert gpus != 4
