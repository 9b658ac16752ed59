"""How much work a job that never said how long it trains has left, from what is observable.

A job of unknown length (``JobView.length_known`` False: neither its user nor its script
declared epochs and a dataset size) shows the controller's placeholders, one epoch of one
step, which would make it look a second from done. Its remaining work is instead inferred
from how much it has done against the sizes of the jobs that finished before it, as
LAS/Tiresias-style schedulers do, with the uncertainty carried into the ranking by the
Gittins index (the optimal priority for the mean completion time of jobs whose sizes are
drawn from a known distribution): a job that has done ``a`` gets

    index(a) = max over D of P(S - a <= D | S > a) / E[min(S - a, D) | S > a]

(its best achievable rate of completion per unit of further work) and is scored as a job
of known remaining work ``1 / index(a)``. With many small jobs and a few long ones a new
job ranks as a small one; a job that outlived the small ones ranks as one of the long ones
it has turned out to be among; one that outlived every size seen is expected to run as long
again as it has (the sizes get one more, at twice the larger of that and the largest seen).

Work is counted in seconds of one GPU at the job's best speed per sample (its progress
times its model's one-GPU seconds per unit of progress, ``Estimates.done``): unlike
GPU-seconds held, it does not grow faster for a job given more GPUs than it uses well.
Which sizes, in order:

1. its application's completed jobs (the pooling key; at least ``MIN_SAME``), in progress
   units (samples / initial batch), against its own progress, where the regime shows that
   history;
2. the work of the jobs a policy saw leave the pool (at least ``MIN_SIZES``), against the
   work it has done;
3. the GPU-seconds of the completed jobs in the history (at least ``MIN_SIZES``), against
   its attained service (a policy that has not yet seen jobs leave);
4. with none of these, the median remaining work of the jobs whose length is known (at
   least the work it has done);
5. with nothing at all, as long again as it has run, at least ``FLOOR_S``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hpcorch.policy.types import CompletedJob, JobView

MIN_SAME = 3
"""Completed jobs of its application needed to use their sizes."""
MIN_SIZES = 5
"""Departed jobs needed to use the pool's sizes."""
FLOOR_S = 3600.0
"""Remaining GPU-seconds of a job when nothing is known of any job's length."""


def gittins_remaining(sizes: np.ndarray, done: float) -> float:
    """``1 / index``: the known remaining work a job that has done ``done`` of a size drawn
    from ``sizes`` (sorted, positive) is worth (see the module's docstring)."""
    start = int(np.searchsorted(sizes, done, side="right"))
    tail = max(2.0 * done, 2.0 * float(sizes[-1]) if len(sizes) else 0.0, 1e-9)
    left = np.append(sizes[start:], tail) - done  # the sizes it may still turn out to have
    m = len(left)
    k = np.arange(1, m + 1)
    spent = np.cumsum(left) + (m - k) * left  # E[min(S - a, D)] x m for D = left[k - 1]
    return float(np.min(spent / k))


def unknown_work(
    jobs: Sequence[JobView],
    history: Sequence[CompletedJob],
    keys: tuple[Mapping[str, str], Mapping[str, str]],
    departed: np.ndarray | None,
    work: np.ndarray,
    units: np.ndarray,
    done: np.ndarray,
) -> np.ndarray:
    """Factor by which each job's remaining-time row is to be scaled (1 for a job of known
    length). ``keys``: the pooling keys of the jobs and of the completed jobs;
    ``departed``: the work of jobs that left the pool (None: none seen); ``work``: each
    job's remaining one-GPU seconds as estimated from its placeholders; ``units``: the
    progress units those stand for; ``done``: the work each job has done (both in the
    unit of ``departed``)."""
    n = len(jobs)
    factor = np.ones(n)
    unknown = np.array([not j.length_known for j in jobs], dtype=bool)
    if not unknown.any():
        return factor
    key, hist_key = keys
    same: dict[str, list[float]] = {}
    for h in history:
        if h.progress > 0:
            same.setdefault(hist_key.get(h.job_id, h.application), []).append(h.progress)
    left_by = np.sort(np.asarray(departed if departed is not None else (), dtype=float).ravel())
    left_by = left_by[left_by > 0]
    held = np.sort([h.gpu_seconds for h in history if h.gpu_seconds > 0])
    known = work[~unknown]
    known = known[np.isfinite(known) & (known > 0)]
    typical = float(np.median(known)) if len(known) else None
    for i in (int(x) for x in np.flatnonzero(unknown)):
        j = jobs[i]
        if not (np.isfinite(work[i]) and work[i] > 0 and units[i] > 0):
            continue
        mine = same.get(key.get(j.job_id, j.application), [])
        if len(mine) >= MIN_SAME:
            factor[i] = gittins_remaining(np.sort(mine), j.progress) / units[i]
        elif len(left_by) >= MIN_SIZES:
            factor[i] = gittins_remaining(left_by, float(done[i])) / work[i]
        elif len(held) >= MIN_SIZES:
            factor[i] = gittins_remaining(held, j.attained_service) / work[i]
        elif typical is not None:
            factor[i] = max(typical, float(done[i])) / work[i]
        else:
            factor[i] = max(float(done[i]), FLOOR_S) / work[i]
    return factor
