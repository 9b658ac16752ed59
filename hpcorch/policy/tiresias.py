"""Tiresias: discretized two-dimensional least-attained-service (gang-scheduled).

Configured as in Pollux's published comparison: two queues, a job is demoted once its
attained service (seconds x requested GPUs) reaches 16 GPU-hours, no starvation promotion.
A job runs only with all the GPUs it requested, queue 0 before queue 1, in arrival order
within a queue; a running job keeps its GPUs unless it is preempted; GPUs are taken from
the nodes with the most free GPUs first. Jobs use the batch size they asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcorch.policy.common import free_gpus, job_plan, keep_plan, place_most_free
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.types import JobPlan, Plan, Snapshot


@dataclass
class TiresiasPolicy:
    """2D-LAS with discrete queues; holds its queues across rounds."""

    threshold_gpu_s: float = 16 * 3600.0
    name: str = "tiresias"
    _queues: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))

    def schedule(self, snapshot: Snapshot) -> Plan:
        jobs = {j.job_id: j for j in snapshot.jobs}
        q0, q1 = self._queues
        q0[:] = [k for k in q0 if k in jobs]
        q1[:] = [k for k in q1 if k in jobs]
        known = set(q0) | set(q1)
        for j in snapshot.jobs:
            if j.job_id not in known:
                q0.append(j.job_id)
        for j in snapshot.jobs:
            if j.running and j.job_id in q0 and j.attained_service >= self.threshold_gpu_s:
                q0.remove(j.job_id)
                q1.append(j.job_id)
        left = snapshot.total_gpus
        run: list[str] = []
        heavy = {k: -jobs[k].weight for k in jobs}  # within a queue: weight, then arrival
        for key in (*sorted(q0, key=heavy.__getitem__), *sorted(q1, key=heavy.__getitem__)):
            count = min(jobs[key].requested_gpus, snapshot.total_gpus)
            if count <= left:
                run.append(key)
                left -= count
        need = {k: min(jobs[k].requested_gpus, snapshot.total_gpus) for k in run}
        kept = {k: jobs[k].placement for k in run if jobs[k].gpus == need[k]}
        free = free_gpus(snapshot, kept)
        plans: list[JobPlan] = []
        for key in run:
            job = jobs[key]
            if key in kept:
                plans.append(keep_plan(job))
                continue
            placement = place_most_free(free, need[key])
            assert placement is not None
            plans.append(job_plan(job, placement, job.requested_batch))
        return fit_cpus(snapshot, Plan(tuple(plans)))
