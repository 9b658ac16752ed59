"""Free measurements: a running job's batch changed for a round to learn its compute curve.

A job never seen before is measured at one per-GPU batch on its first GPUs. From that one
point the model cannot tell the part of a micro-step that grows with the batch from the
part that does not, and that split decides how fast the job runs on more GPUs (a fixed
global batch over more GPUs is a smaller per-GPU batch). Measuring it by a resize costs a
restart; changing the batch of a job that takes a new batch at its next step
(``JobView.rebatch``, the runtime's managed mode) costs nothing but a round at a batch
that may be a little less efficient. So a running job that keeps its GPUs in the plan and
whose model (its own measurements, or its group's) has seen one per-GPU batch only is
planned at half that per-GPU batch (twice it where half is below its bounds). Both
measurements run on the same GPUs, so the all-reduce is the same in each and the
difference is compute alone. Pure.
"""

from __future__ import annotations

from hpcorch.policy.common import keep_plan, split_batch
from hpcorch.policy.estimate import Estimates
from hpcorch.policy.types import JobPlan, JobView, Plan


def _micro_seen(est: Estimates, job: JobView) -> set[int]:
    model = est.models.get(est.keys.get(job.job_id, job.application))
    if model is None:
        return {s.micro_batch for s in job.profile}
    return model.micro_batches


def _probe(job: JobView, p: JobPlan, seen: set[int]) -> JobPlan | None:
    """``p`` at another per-GPU batch, or None where the job's bounds leave none."""
    for micro in (p.micro_batch // 2, p.micro_batch * 2):
        if micro < max(1, job.min_micro_batch) or micro > job.max_micro_batch:
            continue
        batch = micro * p.gpus * p.accum_steps
        if not job.min_batch <= batch <= job.max_batch:
            continue
        total, m, accum = split_batch(job, p.gpus, batch)
        if m not in seen:
            return JobPlan(p.job_id, p.gpus, p.placement, total, m, accum, p.cpus_per_gpu)
    return None


def _wants(job: JobView, est: Estimates) -> set[int] | None:
    """The per-GPU batches measured, for a job a probe is for: running, taking a new batch
    without a restart, measured at one per-GPU batch only (itself or its group)."""
    if not (job.running and job.rebatch and job.predictable and job.profile):
        return None
    seen = _micro_seen(est, job)
    return seen if len(seen) == 1 else None


def needs_probe(jobs: tuple[JobView, ...], est: Estimates) -> list[bool]:
    """Per job: a probe is for it and its bounds allow one at its current GPUs."""
    out = []
    for j in jobs:
        seen = _wants(j, est)
        out.append(seen is not None and _probe(j, keep_plan(j), seen) is not None)
    return out


def probe_batches(jobs: tuple[JobView, ...], est: Estimates, plan: Plan) -> Plan:
    """``plan`` with a probe batch for every job that keeps its GPUs, takes a new batch
    without a restart and has been measured at one per-GPU batch only."""
    by_id = {j.job_id: j for j in jobs}
    out: list[JobPlan] = []
    for p in plan.jobs:
        j = by_id.get(p.job_id)
        seen = _wants(j, est) if j is not None and p.gpus == j.gpus else None
        probe = _probe(j, p, seen) if j is not None and seen is not None else None
        out.append(probe or p)
    return Plan(tuple(out))
