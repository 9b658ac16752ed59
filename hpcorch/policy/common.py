"""Helpers shared by the policies: placement on free GPUs and batch splitting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hpcorch.planner import BatchPlanError, plan_batch
from hpcorch.policy.types import JobPlan, JobView, Snapshot


def free_gpus(snapshot: Snapshot, kept: Mapping[str, Mapping[int, int]]) -> list[int]:
    """Free GPUs per node once the placements in ``kept`` stay where they are."""
    free = list(snapshot.node_gpus)
    for placement in kept.values():
        for node, n in placement.items():
            free[node] -= n
    return free


def place_most_free(free: list[int], gpus: int) -> dict[int, int] | None:
    """Take ``gpus`` GPUs from the nodes with the most free GPUs first (lowest index on ties).

    Updates ``free`` in place; returns None (and leaves ``free`` alone) if they do not fit.
    """
    if gpus > sum(free):
        return None
    placement: dict[int, int] = {}
    left = gpus
    arr = np.asarray(free)
    while left > 0:
        node = int(np.argmax(arr))  # most free GPUs, lowest index on ties
        n = min(free[node], left)
        arr[node] -= n
        placement[node] = placement.get(node, 0) + n
        free[node] -= n
        left -= n
    return placement


def place_packed(free: list[int], gpus: int) -> dict[int, int] | None:
    """Place on as few nodes as possible: a single node that fits (best fit), else most-free.

    Updates ``free`` in place; returns None if the GPUs do not fit.
    """
    if gpus > sum(free):
        return None
    arr = np.asarray(free)
    fits = arr >= gpus
    if fits.any():
        node = int(np.argmin(np.where(fits, arr, np.iinfo(np.int64).max)))  # best fit
        free[node] -= gpus
        return {node: gpus}
    return place_most_free(free, gpus)


def split_batch(job: JobView, gpus: int, batch: int) -> tuple[int, int, int]:
    """(global, micro, accum) for ``batch`` on ``gpus`` within the job's memory bound."""
    batch = max(batch, gpus * job.min_micro_batch)
    try:
        bp = plan_batch(batch, gpus, job.max_micro_batch, job.min_micro_batch)
    except BatchPlanError:
        bp = plan_batch(batch, gpus, job.max_micro_batch)
    return bp.global_batch, bp.micro_batch, bp.accum_steps


def job_plan(job: JobView, placement: Mapping[int, int], batch: int) -> JobPlan:
    gpus = sum(placement.values())
    total, micro, accum = split_batch(job, gpus, batch)
    return JobPlan(job.job_id, gpus, dict(placement), total, micro, accum)


def keep_plan(job: JobView) -> JobPlan:
    """The job's current allocation, unchanged."""
    return JobPlan(
        job.job_id,
        job.gpus,
        dict(job.placement),
        job.micro_batch * job.accum_steps * job.gpus,
        job.micro_batch,
        job.accum_steps,
    )


def arrival_order(jobs: Sequence[JobView]) -> list[JobView]:
    """Heaviest weight first (see ``JobView.weight``), then first come, first served."""
    return sorted(jobs, key=lambda j: (-j.weight, j.submit_time))
