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
again as it has, in steps (:func:`_beyond`), and the sizes get one more, at twice the larger
of that and the largest seen.

Work is counted in seconds of one GPU (the reference type's in a pool of several): the
time a job held GPUs times their speed-up over one GPU, as the throughput model predicts
it, summed round by round by the policy (:meth:`hpcorch.policy.ones.OnesPolicy.account`).
Unlike GPU-seconds it does not grow faster for a job given more GPUs than it uses well,
and unlike the progress a job reports it does not depend on the batch it trains with.
Which sizes, in order:

1. the jobs of its own application (the pooling key) that the policy saw leave the pool,
   at least ``MIN_SAME`` (where the regime says which jobs are of one application);
2. with ``by_epochs``, for a job that has finished an epoch, the epochs the jobs that left
   the pool trained (at least ``MIN_SIZES`` that reported one): its work per epoch is then
   known, and only how many epochs it trains is not. Epoch counts spread far less than
   work (2 to 100 in the bundled workloads, against 20 s to 36 GPU-hours), and a long job
   near its end is seen to be near it (not ranked by the work it has done, which keeps a
   long job behind every shorter one until it ends); with ``kin``, the departed jobs whose
   work per epoch is near its own weigh most (jobs of one kind);
3. every job the policy saw leave the pool, at least ``MIN_SIZES``; with ``censor``, the
   work of the jobs still in the pool counted as sizes at least that large (Kaplan-Meier,
   :func:`survival`): the jobs that left first are the short ones;
4. its application's completed jobs in the snapshot's history (at least ``MIN_SAME``), in
   progress units against its own progress (a policy that has not seen jobs leave yet);
5. the GPU-seconds of the completed jobs in the history (at least ``MIN_SIZES``), against
   its attained service;
6. with none of these, the median remaining work of the jobs whose length is known (at
   least the work it has done);
7. with nothing at all, as long again as it has run, at least ``FLOOR_S``.

The remaining work also says how many epochs are left where a job has finished some
(``epochs_left``): its work per epoch so far is known, so the gradient noise can be
forecast over them as for a job that declared its epochs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hpcorch.policy.types import CompletedJob, JobView

MIN_SAME = 3
"""Departed or completed jobs of its application needed to use their sizes."""
MIN_SIZES = 5
"""Departed or completed jobs needed to use the pool's sizes."""
FLOOR_S = 3600.0
"""Remaining one-GPU seconds of a job when nothing is known of any job's length."""
MAX_EPOCHS_LEFT = 1000
"""Epochs forecast at most for a job of unknown length."""

KIN_FLOOR = 0.05
"""With ``Prior.kin``: the weight of a departed job whose work per epoch is nothing like the
job's (1 for the same): no departed job is left out, so a job unlike every one is weighed
by all alike."""


@dataclass(frozen=True)
class Prior:
    """What the remaining work of a job of unknown length is inferred from, beyond the
    sizes of the jobs that left the pool (the module's docstring)."""

    censor: bool = False
    """Source 3 counts the work of the jobs still in the pool (Kaplan-Meier)."""
    by_epochs: bool = False
    """Source 2: a job past its first epoch is weighed by the epochs departed jobs trained."""
    kin: float = 0.0
    """With ``by_epochs``: each departed job weighs by how near its work per epoch is to the
    job's, a Gaussian in the logarithm of that work of this width (1: a factor e away weighs
    0.61, e^2 away 0.14; at least ``KIN_FLOOR``); 0: all alike. Jobs of one kind train
    epochs of similar work and similar numbers of them (the bundled workloads: a CIFAR-10
    job's 100 short epochs, a YOLOv3 job's 50 long ones), and the epoch a job is in says
    nothing of which kind it is."""


PLAIN = Prior()
"""Only the sizes of departed (or completed) jobs."""

Departed = Sequence[tuple[str, float] | tuple[str, float, float]]
"""(pooling key, work done[, epochs trained]) of each job that left the pool (epochs 0:
not known)."""


def _beyond(largest: float, done: float) -> float:
    """The remaining work of a job that has done ``done``, at least the ``largest`` size
    seen: the largest size doubled until it is at least ``done`` (as long again as it has
    run, rounded up to such a step). Not ``done`` itself: two such jobs would then swap
    their GPUs every round or two, each overtaking the other as it runs (LAS's round robin,
    a restart each time; seen at load 1.0: three imagenet jobs, 43 GPUs preempted and
    started again every two minutes); within a step they rank alike, and the running one
    keeps its GPUs."""
    return largest * 2.0 ** math.ceil(math.log2(max(done / largest, 1.0)))


def gittins_remaining(sizes: np.ndarray, done: float) -> float:
    """``1 / index``: the known remaining work a job that has done ``done`` of a size drawn
    from ``sizes`` (sorted, positive) is worth (see the module's docstring)."""
    return gittins_weighted(sizes, np.ones(len(sizes) + 1), done)  # each size alike


def survival(sizes: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The size distribution by Kaplan and Meier: the distinct ``sizes`` (of jobs that
    ended, sorted) with the probability of each, ``censored`` holding the work of jobs
    still running (their size is at least that). Jobs that ended early are the short ones:
    without the running jobs the sizes seen so far understate the long ones. The mass the
    sizes leave (jobs running past the largest) is the last element, for the tail: at
    least one size's share, as :func:`gittins_remaining` gives it."""
    points, ended = np.unique(sizes, return_counts=True)
    cens = np.sort(censored)
    at_risk = (len(sizes) - np.searchsorted(sizes, points, side="left")) + (
        len(cens) - np.searchsorted(cens, points, side="left")
    )
    alive = np.cumprod(1.0 - ended / np.maximum(at_risk, 1))
    mass = np.concatenate(([1.0], alive[:-1])) - alive
    tail = max(float(alive[-1]) if len(alive) else 1.0, 1.0 / (len(sizes) + 1))
    return points, np.append(mass, tail)


def gittins_weighted(points: np.ndarray, mass: np.ndarray, done: float) -> float:
    """:func:`gittins_remaining` over sizes ``points`` (sorted) of probability ``mass``
    (one longer: its last element the tail's, at twice the larger of the largest size and
    ``done``; :func:`survival` gives them), in any scale."""
    if len(points) and done >= points[-1] > 0:
        return _beyond(float(points[-1]), done)
    start = int(np.searchsorted(points, done, side="right"))
    tail = max(2.0 * done, 2.0 * float(points[-1]) if len(points) else 0.0, 1e-9)
    left = np.append(points[start:], tail) - done  # the sizes it may still turn out to have
    w = mass[start:] / mass[start:].sum()
    cum = np.cumsum(w)  # P(S - a <= D | S > a) for D = left[k]
    spent = np.cumsum(w * left) + (1.0 - cum) * left  # E[min(S - a, D) | S > a]
    return float(np.min(spent / np.maximum(cum, 1e-300)))


def _sorted(values: Sequence[float] | np.ndarray) -> np.ndarray:
    out = np.sort(np.asarray(values, dtype=float))
    return out[out > 0]


def remaining_work(
    jobs: Sequence[JobView],
    keys: tuple[Mapping[str, str], Mapping[str, str]],
    departed: Departed,
    history: Sequence[CompletedJob],
    done: np.ndarray,
    measured: np.ndarray | None = None,
    prior: Prior = PLAIN,
) -> np.ndarray:
    """Each job of unknown length's remaining work from the sizes of departed jobs or the
    GPU-seconds of completed ones (sources 1, 2, 3 and 5 of the module's docstring); NaN for
    a job of known length, or where it must come from its own estimates (:func:`factors`).
    A job whose model has no measurement yet (``measured`` False) counts as one of unknown
    length where departed jobs are known: the length it declares is in steps, and without
    a step time its seconds are a guess off by orders of magnitude (a typical job's speed
    made the bundled NCF jobs, 0.1 s of a typical step's work, look among the longest).
    ``keys``: the pooling keys of the jobs and of the completed jobs; ``done``: the work
    each job has done, in the unit of ``departed``; ``prior``: which further sources."""
    key, _ = keys
    out = np.full(len(jobs), np.nan)
    new = np.zeros(len(jobs), dtype=bool) if measured is None else ~measured
    unknown = [i for i, j in enumerate(jobs) if not j.length_known or new[i]]
    if not unknown:
        return out
    by_key: dict[str, list[float]] = {}
    for d in departed:
        by_key.setdefault(d[0], []).append(d[1])
    every = _sorted([d[1] for d in departed])
    trained = _epochs_trained(departed) if prior.by_epochs else np.empty((2, 0))
    held = _sorted([h.gpu_seconds for h in history])
    dist = survival(every, _sorted(done)) if prior.censor and len(every) >= MIN_SIZES else None
    for i in unknown:
        j = jobs[i]
        mine = _sorted(by_key.get(key.get(j.job_id, j.application), []))
        if len(mine) >= MIN_SAME:
            out[i] = gittins_remaining(mine, float(done[i]))
        elif j.epoch >= 1 and trained.shape[1] >= MIN_SIZES and done[i] > 0:
            out[i] = _by_epochs(trained, _trained(j), float(done[i]), prior.kin)
        elif dist is not None:
            out[i] = gittins_weighted(*dist, float(done[i]))
        elif len(every) >= MIN_SIZES:
            out[i] = gittins_remaining(every, float(done[i]))
        elif j.length_known:
            continue  # a new job of known length: its declared length until sizes are known
        elif len(held) >= MIN_SIZES and len(_same(j, keys, history)) < MIN_SAME:
            out[i] = gittins_remaining(held, j.attained_service)
    return out


def _epochs_trained(departed: Departed) -> np.ndarray:
    """The epochs each departed job that reported one trained (row 0, ascending) and the
    logarithm of its work per epoch (row 1)."""
    pairs = sorted((d[2], d[1] / d[2]) for d in departed if len(d) > 2 and d[2] > 0 and d[1] > 0)
    return np.array([[p[0] for p in pairs], [math.log(p[1]) for p in pairs]]).reshape(2, -1)


def _by_epochs(trained: np.ndarray, at: float, done: float, kin: float) -> float:
    """Source 2: the remaining work of a job that has trained ``at`` epochs in ``done``.
    Its work per epoch is known; only how many epochs it trains is not: those of the
    departed jobs (``trained``: :func:`_epochs_trained`), weighed by ``kin``
    (:class:`Prior`)."""
    w = np.ones(trained.shape[1])
    if kin > 0:
        near = (trained[1] - math.log(done / at)) / kin
        w = np.exp(-0.5 * near**2) + KIN_FLOOR
    return done / at * gittins_weighted(trained[0], np.append(w, w.mean()), at)


def _same(
    job: JobView, keys: tuple[Mapping[str, str], Mapping[str, str]], history: Sequence[CompletedJob]
) -> list[float]:
    """The progress of the completed jobs of ``job``'s application in the history."""
    key, hist_key = keys
    mine = key.get(job.job_id, job.application)
    return [h.progress for h in history if h.progress > 0 and hist_key.get(h.job_id) == mine]


def _trained(job: JobView) -> float:
    """The epochs a job of unknown length has trained, half of its current one counted
    done (how far into an epoch it is, it does not say)."""
    return job.epoch + 0.5


def epochs_left(jobs: Sequence[JobView], left: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Epochs each job of unknown length has left, where it finished one or more and its
    remaining work is known: that work over its work per epoch so far (half of the
    current epoch counted done); NaN elsewhere."""
    out = np.full(len(jobs), np.nan)
    for i, j in enumerate(jobs):
        if j.length_known or j.epoch < 1 or not (np.isfinite(left[i]) and done[i] > 0):
            continue
        per_epoch = float(done[i]) / _trained(j)
        out[i] = min(float(left[i]) / per_epoch, MAX_EPOCHS_LEFT)
    return out


def as_forecast(job: JobView, epochs: float) -> JobView:
    """``job`` as one that declared ``epochs`` more epochs of one unit each, half of the
    current one done: its rows then carry the noise forecast over them (their scale is
    set afterwards by :func:`factors`)."""
    total = job.epoch + max(1, math.ceil(epochs + 0.5))
    return replace(
        job,
        max_epochs=total,
        progress_per_epoch_hint=1.0,
        progress=_trained(job),
        length_known=True,
    )


def factors(
    jobs: Sequence[JobView],
    history: Sequence[CompletedJob],
    keys: tuple[Mapping[str, str], Mapping[str, str]],
    left: np.ndarray,
    work: np.ndarray,
    units: np.ndarray,
    done: np.ndarray,
) -> np.ndarray:
    """Factor by which each job's remaining-time row is to be scaled (1 for a job of known
    length). ``left``: :func:`remaining_work`; ``work``: each row's remaining one-GPU
    seconds (in the unit of ``left``); ``units``: the progress units a row stands for."""
    n = len(jobs)
    factor = np.ones(n)
    unknown = np.array([not j.length_known for j in jobs], dtype=bool) | np.isfinite(left)
    if not unknown.any():
        return factor
    known = work[~unknown]
    known = known[np.isfinite(known) & (known > 0)]
    typical = float(np.median(known)) if len(known) else None
    for i in (int(x) for x in np.flatnonzero(unknown)):
        j = jobs[i]
        if not (np.isfinite(work[i]) and work[i] > 0 and units[i] > 0):
            continue
        mine = _same(j, keys, history)
        if np.isfinite(left[i]):
            factor[i] = left[i] / work[i]
        elif len(mine) >= MIN_SAME:
            factor[i] = gittins_remaining(np.sort(mine), j.progress) / units[i]
        elif typical is not None:
            factor[i] = max(typical, float(done[i])) / work[i]
        else:
            factor[i] = max(float(done[i]), FLOOR_S) / work[i]
    return factor
