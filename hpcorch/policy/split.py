"""Jobs a policy cannot model, set apart before it runs (after AITurbo's split).

* A running job that cannot be resized (its script keeps no checkpoint hpcorch can restart
  it from, or its launch has not yet trained long enough to be stopped) keeps the GPUs it
  has: moving it would lose its work. A policy that plans around such jobs
  (``sees_fixed``) plans them at those GPUs when it runs for the others, and one that
  takes a new batch while it runs (``JobView.rebatch``) gets the batch planned: a batch
  change costs no restart, so a new job trains at the batch its first measurements call
  for without waiting until it may be stopped.
* Unpredictable jobs (their script reports no progress, so no throughput model can be
  fitted) get GPUs by discretized least attained service at the GPU count they asked for,
  within their share of the pool (their number over all jobs), as AITurbo's multi-level
  feedback queue orders its jobs.
* The policy schedules the rest on the GPUs left.

Pure: a snapshot and a policy in, a plan out.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hpcorch.policy.common import free_gpus, job_plan, keep_plan, place_packed
from hpcorch.policy.types import (
    JobPlan,
    JobView,
    Plan,
    Policy,
    Snapshot,
    planned_cpus_per_gpu,
)

LEVELS_GPU_H = (1.0, 4.0, 16.0)
"""Attained-service thresholds (GPU-hours) of the feedback queue's levels."""


def level(job: JobView) -> int:
    hours = job.attained_service / 3600.0
    return sum(hours >= t for t in LEVELS_GPU_H)


def _want(job: JobView) -> int:
    if job.running:
        return job.gpus
    return min(max(job.requested_gpus, job.min_gpus), job.max_gpus)


def split_schedule(policy: Policy, snapshot: Snapshot) -> Plan:
    """``policy``'s plan for the predictable, movable jobs, and the fixed and
    least-attained-service allocations of the others."""
    fixed = [j for j in snapshot.jobs if j.running and not j.resizable]
    fixed_ids = {j.job_id for j in fixed}
    unpredictable = [j for j in snapshot.jobs if not j.predictable and j.job_id not in fixed_ids]
    if not fixed and not unpredictable:
        return policy.schedule(snapshot)
    plans: list[JobPlan] = [keep_plan(j) for j in fixed]
    free = free_gpus(snapshot, {j.job_id: j.placement for j in fixed})
    idle = sum(free)  # before the unpredictable jobs take theirs
    if unpredictable:
        plans += _least_attained(snapshot, unpredictable, free, fixed_ids)
    taken = {p.job_id for p in plans} | {j.job_id for j in unpredictable}
    rest = tuple(j for j in snapshot.jobs if j.job_id not in taken)
    sees = bool(getattr(policy, "sees_fixed", False) and fixed)
    # A policy that plans the fixed jobs' batches is asked also where no other job may
    # move: none is left, or the fixed jobs hold every GPU (the rest are queued). Not where
    # the unpredictable jobs took the last GPUs: a running job shown to it would be planned
    # on GPUs no longer its own.
    if (rest and sum(free) > 0) or (sees and (not rest or idle == 0)):
        cpus = _free_cpus(snapshot, plans)
        shown: tuple[JobView, ...] = ()
        if sees:
            # the fixed jobs, pinned where they are, on GPUs given back to the pool seen:
            # the policy ranks and remembers them as it does every job
            shown = tuple(_pinned(j) for j in fixed)
            free = list(free)
            back = list(cpus)
            fixed_plans = {p.job_id: p for p in plans if p.job_id in fixed_ids}
            for j in fixed:
                per_gpu = 0
                if snapshot.manages_cpus:
                    per_gpu = planned_cpus_per_gpu(snapshot, j, fixed_plans[j.job_id])
                for node, n in j.placement.items():
                    free[node] += n
                    if back:
                        back[node] += n * per_gpu
            cpus = tuple(back)
        inner = policy.schedule(
            replace(snapshot, node_gpus=tuple(free), node_cpus=cpus, jobs=shown + rest)
        )
        plans += [p for p in inner.jobs if p.job_id not in fixed_ids]
        if shown:
            planned, views = inner.by_id(), {j.job_id: j for j in fixed}
            plans = [
                _batch_at_its_gpus(p, views[p.job_id], planned.get(p.job_id))
                if p.job_id in views
                else p
                for p in plans
            ]
    return Plan(tuple(plans))


def _batch_at_its_gpus(kept: JobPlan, job: JobView, planned: JobPlan | None) -> JobPlan:
    """A fixed job's plan (``kept``) with the batch the policy ``planned`` for it, where
    the job takes a new batch while it runs and the plan keeps its GPUs where they are."""
    if (
        planned is None
        or not job.rebatch
        or planned.gpus != kept.gpus
        or dict(planned.placement) != dict(kept.placement)
    ):
        return kept
    return replace(
        kept,
        global_batch=planned.global_batch,
        micro_batch=planned.micro_batch,
        accum_steps=planned.accum_steps,
    )


def _pinned(job: JobView) -> JobView:
    """A fixed job as a policy that plans around it sees it: bounds at its GPUs."""
    return replace(job, min_gpus=job.gpus, max_gpus=job.gpus, resizable=False)


def _free_cpus(snapshot: Snapshot, plans: list[JobPlan]) -> tuple[int, ...]:
    """The pool's CPUs per node less what ``plans`` hold (empty: CPUs not managed)."""
    if not snapshot.manages_cpus:
        return snapshot.node_cpus
    jobs = {j.job_id: j for j in snapshot.jobs}
    free = list(snapshot.node_cpus)
    for p in plans:
        per_gpu = planned_cpus_per_gpu(snapshot, jobs[p.job_id], p)
        for node, n in p.placement.items():
            free[node] -= n * per_gpu
    return tuple(max(0, c) for c in free)


def _least_attained(
    snapshot: Snapshot, jobs: list[JobView], free: list[int], fixed_ids: set[str]
) -> list[JobPlan]:
    """Admit ``jobs`` in (service level, arrival) order within their share; ``free`` is
    updated in place."""
    others = len(snapshot.jobs) - len(fixed_ids)
    share = math.ceil(sum(free) * len(jobs) / max(1, others))
    admitted: list[JobView] = []
    used = 0
    for job in sorted(jobs, key=lambda j: (level(j), -j.weight, j.submit_time, j.job_id)):
        want = _want(job)
        if used and used + want > share:
            continue
        admitted.append(job)
        used += want
    plans: list[JobPlan] = []
    running = [j for j in admitted if j.running]
    for job in running:  # they stay where they are
        for node, n in job.placement.items():
            free[node] -= n
        plans.append(keep_plan(job))
    for job in admitted:
        if job.running:
            continue
        placement = _place_one_type(snapshot, job, free, _want(job))
        if placement is not None:
            plans.append(job_plan(job, placement, job.requested_batch))
    return plans


def _place_one_type(
    snapshot: Snapshot, job: JobView, free: list[int], gpus: int
) -> dict[int, int] | None:
    """``place_packed`` on the nodes of one type the job accepts (the type with the most
    free GPUs first) where the pool has several types and may not mix them; ``free`` is
    updated in place."""
    if not snapshot.gpu_types or snapshot.mix_types:
        return place_packed(free, gpus)
    ok = [t for t in snapshot.gpu_types if not job.gpu_types or t in job.gpu_types]
    by_type = {t: [i for i, nt in enumerate(snapshot.node_types) if nt == t] for t in ok}
    for t in sorted(ok, key=lambda t: -sum(free[i] for i in by_type[t])):
        idx = by_type[t]
        sub = [free[i] for i in idx]
        placed = place_packed(sub, gpus)
        if placed is not None:
            for k, i in enumerate(idx):
                free[i] = sub[k]
            return {idx[k]: c for k, c in placed.items()}
    return None
