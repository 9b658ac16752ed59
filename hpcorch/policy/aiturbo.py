"""AITurbo: predictable jobs sized by a performance model, the rest by attained service.

A job is *predictable* when its application appears in the history of completed jobs (its
step times and length are then known from its predecessors). Predictable jobs are ranked
by predicted remaining time and get the GPU count and batch size the performance model
says is most efficient (the largest count whose marginal GPU still adds at least half a
GPU's worth of speed); unpredictable jobs are ranked by least attained service and get the
GPUs and batch size they asked for. A Borda count merges the two rankings inside each level
of a multi-level feedback queue (levels by attained GPU-hours), and jobs are started in
that order without preempting a running job that still fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcorch.policy.common import free_gpus, job_plan, keep_plan, place_packed
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.estimate import estimate
from hpcorch.policy.types import JobPlan, Plan, Snapshot

LEVELS_GPU_H = (1.0, 4.0, 16.0)


@dataclass
class AiturboPolicy:
    """Borda-count MLFQ over predictable and unpredictable jobs."""

    efficiency: float = 0.5
    name: str = "aiturbo"

    def schedule(self, snapshot: Snapshot) -> Plan:
        est = estimate(snapshot)
        jobs = est.jobs
        seen = {h.application for h in snapshot.history}
        pred = [i for i, j in enumerate(jobs) if j.application in seen]
        unpred = [i for i, j in enumerate(jobs) if j.application not in seen]
        want: dict[int, int] = {}
        for i in pred:
            t = est.time[i, 1 : int(est.gmax[i]) + 1]
            speed = t[0] / t
            g = 1
            while g < len(t) and speed[g] - speed[g - 1] >= self.efficiency:
                g += 1
            want[i] = max(g, int(est.gmin[i]))
            cur = jobs[i].gpus
            if cur and cur <= est.gmax[i] and cur / 2 < want[i] < 2 * cur:
                want[i] = cur  # not worth a restart
        for i in unpred:
            want[i] = max(min(jobs[i].requested_gpus, snapshot.total_gpus), int(est.gmin[i]))
        pred.sort(key=lambda i: est.time[i, want[i]])
        unpred.sort(key=lambda i: jobs[i].attained_service)
        borda: dict[int, float] = {}
        for ranking in (pred, unpred):
            for r, i in enumerate(ranking):
                borda[i] = (len(ranking) - r) / max(len(ranking), 1)
        level = {
            i: int(np.searchsorted(LEVELS_GPU_H, j.attained_service / 3600.0, side="right"))
            for i, j in enumerate(jobs)
        }
        order = sorted(
            range(len(jobs)),
            key=lambda i: (level[i], -jobs[i].weight, -borda[i], jobs[i].submit_time),
        )
        left = snapshot.total_gpus
        chosen: list[int] = []
        for i in order:
            g = jobs[i].gpus if jobs[i].gpus == want[i] else want[i]
            if g <= left:
                chosen.append(i)
                left -= g
        keep = {i for i in chosen if jobs[i].running and jobs[i].gpus == want[i]}
        free = free_gpus(snapshot, {jobs[i].job_id: jobs[i].placement for i in keep})
        plans: list[JobPlan] = []
        for i in chosen:
            job = jobs[i]
            if i in keep:
                batch = int(est.batch[i, want[i]]) if i in pred else job.requested_batch
                plans.append(job_plan(job, job.placement, batch) if i in pred else keep_plan(job))
                continue
            placement = place_packed(free, want[i])
            if placement is None:
                continue
            batch = int(est.batch[i, want[i]]) if i in pred else job.requested_batch
            plans.append(job_plan(job, placement, batch))
        return fit_cpus(snapshot, Plan(tuple(plans)))
