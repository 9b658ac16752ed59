"""A new global batch without a restart: rank 0 watches the launch's plan file.

The controller changes a running job's global batch (at the same GPUs) by writing its plan
again with the same launch number. Rank 0 looks at the file at every step boundary (one
``stat``); when it changed, it reads it and proposes the new split to the other ranks in
the step-boundary all-reduce, so that every rank switches at the same step
(hpcorch/runtime/job.py). Pure apart from reading the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcorch.planner import BatchPlan, PlanWatcher, batch_from_plan

__all__ = ["PlanWatcher", "apply", "batch_from_plan", "propose"]

if TYPE_CHECKING:
    from hpcorch.runtime.job import ElasticJob


def propose(job: ElasticJob) -> tuple[int, int]:
    """Rank 0: (micro-batch, accumulation) of a changed plan's batch, or (0, 0)."""
    plan = job._plan_watch.changed()
    if plan is None:
        if job._plan_watch.error:
            job.log(f"ignoring the rewritten plan: {job._plan_watch.error}")
            job._plan_watch.error = ""
        return 0, 0
    s = job.settings
    new = batch_from_plan(
        plan,
        world_size=job.world_size,
        job_id=s.job_id,
        launch=s.plan_launch,
        lower=s.min_global_batch,
        upper=s.max_global_batch,
    )
    if new is None or new == job.batch:
        return 0, 0
    return new.micro_batch, new.accum_steps


def apply(job: ElasticJob, micro: int, accum: int) -> bool:
    """Every rank: switch to the agreed split from the next step; the LR factor ramps from
    the one in effect to the new batch's over the warm-up, as after a relaunch."""
    new = BatchPlan(job.world_size, micro, accum)
    old = job.batch
    if new == old:
        return False
    job._batch = new
    job._prev_factor = job.lr_factor
    job._since_change = 0
    job.metrics.event(
        "rebatch",
        step=job.global_step,
        from_batch=old.global_batch,
        global_batch=new.global_batch,
        per_gpu_batch=micro,
        accum_steps=accum,
    )
    job.log(f"global batch {old.describe()} -> {new.describe()} from step {job.global_step}")
    return True
