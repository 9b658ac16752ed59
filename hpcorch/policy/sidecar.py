"""Sidecar: progress-driven adaptive GPU reallocation (non-intrusive, batch unchanged).

Each round every job is guaranteed one GPU if the pool allows (new arrivals shrink the
running jobs holding most GPUs), then the remaining GPUs go one at a time to the job whose
measured progress would gain most in relative terms (speed-up from its step-time
profile). The job's global batch stays the one it asked for; only its spread over GPUs
changes. A running job is resized only if its predicted gain beats the restart cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcorch.policy.common import free_gpus, job_plan, keep_plan, place_packed
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.estimate import estimate
from hpcorch.policy.types import JobPlan, Plan, Snapshot


@dataclass
class SidecarPolicy:
    """Greedy progress-gain reallocation with a fixed batch size per job."""

    name: str = "sidecar"

    def schedule(self, snapshot: Snapshot) -> Plan:
        est = estimate(snapshot)
        jobs = est.jobs
        n = len(jobs)
        total = snapshot.total_gpus
        cap = np.array(
            [
                max(
                    int(est.gmin[i]),
                    min(int(est.gmax[i]), j.requested_batch // max(j.min_micro_batch, 1)),
                )
                for i, j in enumerate(jobs)
            ]
        )
        g = np.zeros(n, dtype=np.int64)
        left = total
        weight = np.array([j.weight for j in jobs])
        for i in sorted(range(n), key=lambda i: (-jobs[i].weight, jobs[i].submit_time)):
            if est.gmin[i] <= left:
                g[i] = est.gmin[i]
                left -= int(g[i])
        speed = np.where(np.isfinite(est.time), 1.0 / est.time, 0.0)
        while left > 0:
            nxt = np.minimum(g + 1, speed.shape[1] - 1)
            gain = (speed[np.arange(n), nxt] - speed[np.arange(n), g]) / np.maximum(
                speed[np.arange(n), 1], 1e-30
            )
            gain = np.where((g > 0) & (g < cap), gain * weight, -np.inf)
            i = int(np.argmax(gain))
            if not np.isfinite(gain[i]) or gain[i] <= 0:
                break
            g[i] += 1
            left -= 1
        # Keep a running job's size unless the change pays for its restart.
        for i, j in enumerate(jobs):
            if j.running and g[i] > 0 and g[i] != j.gpus and j.gpus <= cap[i]:
                t_new = est.time[i, g[i]] + snapshot.restart_cost_s
                if t_new >= est.time[i, min(j.gpus, est.time.shape[1] - 1)] and g[i] > j.gpus:
                    g[i] = j.gpus
        while int(g.sum()) > total:
            i = int(np.argmax(g))
            g[i] = g[i] - 1 if g[i] - 1 >= est.gmin[i] else 0
        kept = [i for i, j in enumerate(jobs) if g[i] > 0 and g[i] == j.gpus]
        free = free_gpus(snapshot, {jobs[i].job_id: jobs[i].placement for i in kept})
        plans: list[JobPlan] = [keep_plan(jobs[i]) for i in kept]
        placed = set(kept)
        for i in sorted(range(n), key=lambda i: -int(g[i])):
            if g[i] == 0 or i in placed:
                continue
            placement = place_packed(free, int(g[i]))
            if placement is not None:
                plans.append(job_plan(jobs[i], placement, jobs[i].requested_batch))
        return fit_cpus(snapshot, Plan(tuple(plans)))
