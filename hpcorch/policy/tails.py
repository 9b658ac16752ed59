"""Fair tails for ONES: long jobs neither starved nor churned.

ONES scores a schedule by the jobs' weighted completion rates, which favours the jobs
predicted to end soon. Where a job's remaining work is a guess that changes as it runs (a
job of unknown length, weighed against the jobs that left the pool: a new job ranks as a
small one and drops in rank as it outlives the small sizes), that ranking preempts and
shrinks the longer jobs at every arrival, and waiting or shrunk jobs fall behind without
end. Three guards, each applied to the jobs :func:`guarded` selects:

* **restarts per hour of a job's own run** (:func:`restart_guard`): a job may suffer
  ``free`` restarts plus ``per_hour`` for every hour it has held GPUs; one that has had
  more (counting the one a change would cost) keeps its GPUs unless a change gains more
  than ``1 + over`` times what it has: its current allocation's value is multiplied by
  that. Softer than pinning it (a long job pinned on its GPUs holds back the short ones
  that arrive; measured worse);
* **aging** (:func:`age_factor`): a job behind an equal share of the pool by ``age_s``
  seconds (waiting, or shrunk below its share) weighs twice as much, and at most
  ``age_cap`` times as much;
* **the GPU-time a resize wastes**
  (:meth:`hpcorch.policy.ones.OnesPolicy.charge`): a running job's change is charged the
  value of the GPU-seconds its restart idles, spread over the time the change would last.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcorch.policy.types import JobView, Snapshot

TAILS = ("all", "unknown", "none")
"""Which jobs the guards apply to: every job, the jobs of unknown length, none."""


def guarded(jobs: Sequence[JobView], which: str) -> np.ndarray:
    """The jobs the guards apply to (``which``: one of :data:`TAILS`)."""
    if which not in TAILS:
        raise ValueError(f"tails must be one of {', '.join(TAILS)}, not {which!r}")
    if which == "all":
        return np.ones(len(jobs), dtype=bool)
    if which == "none":
        return np.zeros(len(jobs), dtype=bool)
    return np.array([not j.length_known for j in jobs], dtype=bool)


def restarts_over(jobs: Sequence[JobView], free: float, per_hour: float) -> np.ndarray:
    """How many restarts each running job would be past what its own run has earned
    (``free`` plus ``per_hour`` per hour it held GPUs) if it were restarted now; 0 for a
    job within its allowance or not running, and where ``per_hour`` is 0 (no bound)."""
    if per_hour <= 0:
        return np.zeros(len(jobs))
    earned = np.array([free + per_hour * j.run_time / 3600.0 for j in jobs])
    suffered = np.array([j.restarts + 1 for j in jobs], dtype=float)
    running = np.array([j.running and j.gpus > 0 for j in jobs], dtype=bool)
    return np.where(running, np.maximum(suffered - earned, 0.0), 0.0)


def restart_guard(value: np.ndarray, cur: np.ndarray, over: np.ndarray) -> np.ndarray:
    """``value`` (jobs first) with each job's current allocation worth ``1 + over`` times
    as much: a change (a resize, a move, a preemption) must then gain that much more.
    ``cur``: each job's current GPUs (0: queued), or over GPU types ``(type, GPUs)`` index
    arrays."""
    if not (over > 0).any():
        return value
    out = value.copy()
    rows = np.flatnonzero(over > 0)
    at = (rows, cur[rows]) if cur.ndim == 1 else (rows, cur[0][rows], cur[1][rows])
    held = out[at]
    ok = np.isfinite(held) & (held > 0)
    boosted = held * (1.0 + over[rows])
    out[at] = np.where(ok, boosted, held)
    return out


def behind(snapshot: Snapshot, jobs: Sequence[JobView]) -> np.ndarray:
    """Seconds each job is behind an equal share of the pool: the time since it was
    submitted less the time an equal share (the pool's GPUs over the jobs in it now) would
    have taken to give it the GPU-seconds it has had; 0 for a job ahead of its share."""
    share = snapshot.total_gpus / max(len(jobs), 1)
    waited = np.array([snapshot.now - j.submit_time for j in jobs])
    served = np.array([j.attained_service for j in jobs]) / max(share, 1e-9)
    return np.maximum(waited - served, 0.0)


def age_factor(
    snapshot: Snapshot,
    jobs: Sequence[JobView],
    age_s: float,
    power: float,
    mask: np.ndarray,
    cap: float = 0.0,
) -> np.ndarray:
    """Each job's weight factor for how far it is behind its share (1 where ``age_s`` is 0
    or the job is not in ``mask``): ``(1 + behind / age_s) ** power``, at most
    ``max(cap, 1)`` (a cap below 1 ages no job; 0 or less: no cap)."""
    if age_s <= 0 or not mask.any():
        return np.ones(len(jobs))
    factor = (1.0 + behind(snapshot, jobs) / age_s) ** power
    if cap > 0:
        factor = np.minimum(factor, max(cap, 1.0))
    return np.where(mask, factor, 1.0)
