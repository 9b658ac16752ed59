"""Elastic fair share: the simple elastic baseline.

Every job that fits gets its minimum, in arrival order; the GPUs left over are dealt out
one at a time to the job holding the fewest (earliest arrival first), up to each job's
maximum. A job whose share is unchanged keeps its placement, so only jobs whose share
changes are restarted. Deterministic, and easy to predict: the controller's integration
tests use it to check growing and shrinking.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcorch.policy.common import arrival_order, job_plan, place_packed
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.types import JobPlan, JobView, Plan, Snapshot


def shares(jobs: list[JobView], total: int) -> dict[str, int]:
    alloc: dict[str, int] = {}
    free = total
    for job in jobs:
        if job.min_gpus <= free:
            alloc[job.job_id] = job.min_gpus
            free -= job.min_gpus
    by_id = {j.job_id: j for j in jobs}
    order = {j.job_id: i for i, j in enumerate(jobs)}
    while free > 0:
        growable = [i for i in alloc if alloc[i] < by_id[i].max_gpus]
        if not growable:
            break
        pick = min(growable, key=lambda i: (alloc[i] / by_id[i].weight, order[i]))
        alloc[pick] += 1
        free -= 1
    return alloc


@dataclass
class SharePolicy:
    """Equal shares within each job's GPU bounds; the requested batch size."""

    name: str = "share"

    def schedule(self, snapshot: Snapshot) -> Plan:
        jobs = arrival_order(list(snapshot.jobs))
        alloc = shares(jobs, snapshot.total_gpus)
        free = list(snapshot.node_gpus)
        plans: list[JobPlan] = []
        placed: dict[str, dict[int, int]] = {}
        # keep the placement of jobs whose share did not change
        for job in jobs:
            if job.job_id in alloc and job.gpus == alloc[job.job_id] and job.placement:
                placed[job.job_id] = dict(job.placement)
                for node, n in job.placement.items():
                    free[node] -= n
        for job in jobs:
            want = alloc.get(job.job_id, 0)
            if want == 0 or job.job_id in placed:
                continue
            placement = place_packed(free, want)
            if placement is None:  # fragmented: fewer GPUs, or none this round
                continue
            placed[job.job_id] = placement
        for job in jobs:
            if job.job_id in placed:
                plans.append(job_plan(job, placed[job.job_id], job.requested_batch))
        return fit_cpus(snapshot, Plan(tuple(plans)))
