"""Lower bounds on average JCT for a workload on a pool.

* isolated: each job alone on the pool at its best configuration, re-chosen every epoch
  (GPUs on the fewest nodes, global batch on a grid between the job's bounds), plus the
  wait for the first round after arrival and one restart cost;
* capacity: all jobs on a fluid machine of the pool's GPUs, each needing its least
  GPU-seconds, served shortest-remaining-first (optimal for that relaxation).

The bound reported is the larger of the two means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from hpcorch.planner import plan_batch
from hpcorch.sim.config import SimConfig
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

_CACHE: dict[tuple[int, str, int, int], tuple[float, float]] = {}


def packed(gpus: int, per_node: int) -> tuple[int, ...]:
    full, rem = divmod(gpus, per_node)
    return (per_node,) * full + ((rem,) if rem else ())


def app_bound(app: AppTrace, total_gpus: int, per_node: int) -> tuple[float, float]:
    """(best isolated seconds, least GPU-seconds) to train ``app`` to completion."""
    key = (id(app), app.name, total_gpus, per_node)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    batches = np.unique(
        np.round(np.geomspace(app.init_batch, app.max_batch, 16)).astype(int)
    ).tolist()
    work = np.diff(app.epoch_end)  # progress per epoch
    gmax = min(total_gpus, app.max_batch // app.min_micro)
    best_t = np.full(len(work), np.inf)
    best_w = np.full(len(work), np.inf)
    gains: dict[int, np.ndarray] = {}
    for g in range(1, gmax + 1):
        counts = packed(g, per_node)
        for b in batches:
            if b < g * app.min_micro:
                continue
            bp = plan_batch(b, g, app.max_micro)
            it = app.iteration_time(counts, bp.micro_batch, bp.accum_steps)
            gain = gains.get(bp.global_batch)
            if gain is None:
                gain = np.array([app.gain(bp.global_batch, e) for e in range(len(work))])
                gains[bp.global_batch] = gain
            t = work * it / gain
            best_t = np.minimum(best_t, t)
            best_w = np.minimum(best_w, t * g)
    res = (float(best_t.sum()), float(best_w.sum()))
    _CACHE[key] = res
    return res


def lower_bound(
    workload: list[WorkloadJob], apps: Mapping[str, AppTrace], config: SimConfig
) -> float:
    total = config.nodes * config.gpus_per_node
    iso = []
    arrivals = []
    work = []
    for job in workload:
        t, w = app_bound(apps[job.application], total, config.gpus_per_node)
        first_round = math.ceil(job.time / config.round_s - 1e-9) * config.round_s
        if first_round <= job.time:
            first_round += config.round_s
        wait = first_round - job.time
        iso.append(wait + config.restart_cost + t)
        arrivals.append(job.time)
        work.append(w)
    return max(float(np.mean(iso)), _srpt_fluid(arrivals, work, total))


def _srpt_fluid(arrivals: list[float], work: list[float], capacity: float) -> float:
    """Mean response time of preemptive SRPT on one machine of speed ``capacity``."""
    order = np.argsort(arrivals, kind="stable")
    arr = np.asarray(arrivals)[order]
    rem = list(np.asarray(work)[order] / capacity)
    n = len(rem)
    done_at = [0.0] * n
    queue: list[int] = []
    t = 0.0
    i = 0
    finished = 0
    while finished < n:
        if not queue:
            t = max(t, float(arr[i]))
        while i < n and arr[i] <= t:
            queue.append(i)
            i += 1
        k = min(queue, key=lambda q: rem[q])
        horizon = float(arr[i]) if i < n else math.inf
        if t + rem[k] <= horizon:
            t += rem[k]
            rem[k] = 0.0
            done_at[k] = t
            queue.remove(k)
            finished += 1
        else:
            rem[k] -= horizon - t
            t = horizon
    return float(np.mean([done_at[k] - arr[k] for k in range(n)]))
