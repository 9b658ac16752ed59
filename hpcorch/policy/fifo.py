"""FIFO with backfill: the Slurm status quo.

Each job gets the GPUs and batch size it asked for, in arrival order; a job that does not
fit waits while later jobs that fit run (backfill). Running jobs are never resized or
preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcorch.policy.common import arrival_order, free_gpus, job_plan, keep_plan, place_packed
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.types import JobPlan, Plan, Snapshot


@dataclass
class FifoPolicy:
    """First come, first served with backfill; no resizing."""

    name: str = "fifo"

    def schedule(self, snapshot: Snapshot) -> Plan:
        running = [j for j in snapshot.jobs if j.running and j.min_gpus <= j.gpus <= j.max_gpus]
        free = free_gpus(snapshot, {j.job_id: j.placement for j in running})
        plans: list[JobPlan] = [keep_plan(j) for j in running]
        kept = {j.job_id for j in running}
        for job in arrival_order([j for j in snapshot.jobs if j.job_id not in kept]):
            need = min(job.requested_gpus, snapshot.total_gpus)
            placement = place_packed(free, need)
            if placement is not None:
                plans.append(job_plan(job, placement, job.requested_batch))
        return fit_cpus(snapshot, Plan(tuple(plans)))
