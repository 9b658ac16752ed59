"""Predicted remaining time of every job at every GPU count, from online-fitted models.

For each application the step-time model is fitted on every measurement reported by its
jobs (running and completed). For each job and GPU count ``g`` the best global batch is
picked from a geometric grid between the job's batch bounds (goodput = statistical gain /
iteration time), giving ``time[j, g]``: predicted seconds to finish on ``g`` GPUs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from hpcorch.model.convergence import forecast_noise, noise_ratio, reference_curve
from hpcorch.model.throughput import Network, ThroughputModel, learn_network
from hpcorch.policy.lengths import (
    PLAIN,
    Departed,
    Prior,
    as_forecast,
    epochs_left,
    factors,
    remaining_work,
)
from hpcorch.policy.pooling import model_keys, pooled_profiles
from hpcorch.policy.types import JobView, Snapshot

BATCH_GRID = 10


@dataclass(frozen=True)
class Estimates:
    """``time[j, g]`` (seconds, inf where infeasible) and ``batch[j, g]`` for g = 0..gmax."""

    jobs: tuple[JobView, ...]
    time: np.ndarray
    batch: np.ndarray
    gmax: np.ndarray
    """Largest GPU count each job may get (bounds, pool, exploration cap)."""
    gmin: np.ndarray
    """Smallest GPU count each job may run with."""
    models: dict[str, ThroughputModel] = field(default_factory=dict)
    """Step-time model per model key (see :mod:`hpcorch.policy.pooling`)."""
    keys: dict[str, str] = field(default_factory=dict)
    """Model key of each job (by job id)."""
    speed_now: np.ndarray | None = None
    """``speed_now[j, g]``: speed in the current epoch on ``g`` GPUs relative to the
    fastest count up to ``gmax`` (1 at the best, 0 where infeasible)."""
    remaining: np.ndarray | None = None
    """Seconds to finish if every remaining epoch ran at its own best GPU count."""
    now_left: np.ndarray | None = None
    """Seconds each job's current epoch has left at its best GPU count there (0 where its
    application was never measured: its speeds are a guess)."""
    network: Network | None = None
    """The cluster's seconds per gradient byte learned from this round's models (a policy
    that keeps state passes it to the next round's :func:`estimate`)."""
    done: np.ndarray | None = None
    """The work each job has done (:func:`estimate`'s ``done``, in one-GPU seconds at the
    reference speed): what :mod:`hpcorch.policy.lengths` compares across jobs."""


def _grid(job: JobView, gcap: int) -> np.ndarray:
    lo = max(job.min_batch, 1)
    hi = max(job.max_batch, lo)
    pts = np.unique(np.round(np.geomspace(lo, hi, BATCH_GRID)).astype(np.int64))
    return pts


def estimate(
    snapshot: Snapshot,
    explore: float = 2.0,
    gpu_cap: int = 64,
    first_gpus: int = 1,
    first_asked: bool = False,
    network: Network | None = None,
    keys: tuple[dict[str, str], dict[str, str]] | None = None,
    departed: Departed | None = None,
    done: Mapping[str, float] | None = None,
    speed: float = 1.0,
    prior: Prior = PLAIN,
) -> Estimates:
    """Build the time/batch tables for all jobs of ``snapshot``.

    A job may get up to ``explore`` times the largest GPU count its application has been
    measured on, and at least ``first_gpus`` (the cap of a never-measured application;
    with ``first_asked``, one GPU for such a job whose user asked for one).
    ``network``: the seconds per gradient byte to model with (a previous round's
    ``Estimates.network``); None: learned from this round's measurements first.
    ``keys``: the pooling keys of the jobs and the completed jobs, where the caller has
    them (:func:`hpcorch.policy.pooling.model_keys`). For the jobs of unknown length
    (:mod:`hpcorch.policy.lengths`): ``done``, the work each job has done by job id, in
    seconds of one GPU of the reference speed (a job not in it: its GPU-seconds);
    ``departed``, the work the jobs that left the pool had done; ``speed``, the speed of
    this pool's GPUs relative to the reference (a pool of several types:
    :mod:`hpcorch.policy.typed`); ``prior``: what else their remaining work is inferred
    from (:class:`hpcorch.policy.lengths.Prior`).
    """
    jobs = snapshot.jobs
    n = len(jobs)
    total = snapshot.total_gpus
    per_node = max(snapshot.node_gpus) if snapshot.node_gpus else 1
    key, hist_key = keys or model_keys(jobs, snapshot.history, snapshot.pool_across_owners)
    samples = pooled_profiles(jobs, snapshot.history, key, hist_key)
    sizes: dict[str, list[int]] = {}
    stats: dict[str, list[tuple[float, float]]] = {}
    refs_of: dict[str, list[np.ndarray]] = {}
    for h in snapshot.history:
        hk = hist_key[h.job_id]
        if h.model_bytes > 0:
            sizes.setdefault(hk, []).append(h.model_bytes)
        if h.grad_history:
            refs_of.setdefault(hk, []).append(_ratios(h.grad_history))
    for j in jobs:
        hk = key[j.job_id]
        if j.model_bytes > 0:
            sizes.setdefault(hk, []).append(j.model_bytes)
        if j.grad_sqr is not None and j.grad_var is not None:
            stats.setdefault(hk, []).append((j.grad_sqr, j.grad_var))
    # jobs that share a model and their batch bounds share one table of step times
    groups: dict[tuple[str, int, int, int, int], list[int]] = {}
    for i, j in enumerate(jobs):
        bounds = (j.min_batch, j.max_batch, j.min_micro_batch, j.max_micro_batch)
        groups.setdefault((key[j.job_id], *bounds), []).append(i)
    size = {a: float(np.median(v)) for a, v in sizes.items()}
    # the cluster's seconds per gradient byte, from every model that reports its size
    if network is None:
        network = learn_network(
            [ThroughputModel(s, 1, size[a]) for a, s in samples.items() if a in size and s]
        )
    gmax = np.zeros(n, dtype=np.int64)
    models: dict[str, ThroughputModel] = {}
    for (mk, *_), idx in groups.items():
        if mk not in models:
            models[mk] = ThroughputModel(
                samples.get(mk, ()), jobs[idx[0]].min_batch, size.get(mk, 0.0), network
            )
        cap = max(first_gpus, 1, math.ceil(explore * models[mk].max_gpus_seen))
        unseen = first_asked and models[mk].max_gpus_seen == 0
        for i in idx:
            j = jobs[i]
            c = 1 if unseen and j.gpus_asked and j.requested_gpus <= 1 else cap
            gmax[i] = max(min(j.max_gpus, total, c, gpu_cap), min(j.min_gpus, total))
    width = int(gmax.max()) + 1 if n else 1
    time = np.full((n, width), np.inf)
    batch = np.zeros((n, width), dtype=np.int64)
    speed_now = np.zeros((n, width))
    remaining = np.zeros(n)
    now_left = np.zeros(n)
    units = np.zeros(n)  # remaining progress units each row stands for
    worked = np.array([(done or {}).get(j.job_id, j.attained_service) for j in jobs], dtype=float)
    measured = np.array([bool(samples.get(key[j.job_id])) for j in jobs], dtype=bool)
    left = remaining_work(
        jobs, (key, hist_key), departed or (), snapshot.history, worked, measured, prior
    )
    ahead = epochs_left(jobs, left, worked)
    for (mk, *_), idx in groups.items():
        model = models[mk]
        j0 = jobs[idx[0]]
        gm = int(gmax[idx].max())
        g = np.arange(1, gm + 1)
        m = _grid(j0, gm)
        G, M = np.meshgrid(g, m, indexing="ij")
        accum = -(-M // (G * j0.max_micro_batch))
        micro = M // (G * accum)
        ok = micro >= j0.min_micro_batch
        micro = np.maximum(micro, 1)
        eff = micro * accum * G
        nodes = -(-G // per_node)
        it = model.iteration_time(nodes.ravel(), G.ravel(), micro.ravel(), accum.ravel())
        it = np.where(ok, it.reshape(G.shape), np.inf)
        refs = refs_of.get(mk, [])
        app_stats = stats.get(mk)
        default = float(np.median([noise_ratio(a, b) for a, b in app_stats])) if app_stats else None
        rows = np.arange(gm)
        curves: dict[int, np.ndarray | None] = {}
        for i in idx:
            j = jobs[i] if not np.isfinite(ahead[i]) else as_forecast(jobs[i], ahead[i])
            if j.grad_sqr is not None and j.grad_var is not None:
                cur = noise_ratio(j.grad_sqr, j.grad_var)
            elif refs and len(refs[0]) > j.epoch:
                cur = float(np.median([r[min(j.epoch, len(r) - 1)] for r in refs]))
            else:
                cur = default if default is not None else 1.0
            if j.max_epochs not in curves:
                curves[j.max_epochs] = reference_curve(refs, j.max_epochs)
            rho = forecast_noise(j.epoch, j.max_epochs, cur, curves[j.max_epochs])
            work = np.full(len(rho), j.progress_per_epoch_hint)
            if len(work):
                work[0] = max(
                    (j.epoch + 1) * j.progress_per_epoch_hint - j.progress,
                    0.05 * j.progress_per_epoch_hint,
                )
            else:
                rho = np.array([cur])
                work = np.array([0.05 * j.progress_per_epoch_hint])
            seg_w, seg_rho = _segments(work, rho)
            units[i] = float(seg_w.sum())
            # seconds per unit of progress: (S, G, K)
            gn = _gain(eff[None, :, :], j.min_batch, seg_rho[:, None, None])
            per = it[None, :, :] / gn
            best_now = np.argmin(per[0], axis=1)
            per_best = per.min(axis=2)  # (S, G): seconds per unit progress at the best batch
            total_t = (seg_w[:, None] * per_best).sum(axis=0)
            k = int(gmax[i])
            time[i, 1 : k + 1] = total_t[:k]
            lo = max(min(j.min_gpus, k), 1) - 1
            seg_best = per_best[:, lo:k]
            remaining[i] = float((seg_w * seg_best.min(axis=1)).sum())
            fastest = seg_best[0].min()  # seconds per unit in its current epoch
            with np.errstate(divide="ignore"):
                speed_now[i, lo + 1 : k + 1] = fastest / seg_best[0]
            if measured[i]:
                now_left[i] = float(seg_w[0] * fastest)
            time[i, 1 : min(j.min_gpus, k + 1)] = np.inf  # below the job's minimum
            batch[i, 1 : k + 1] = eff[rows[:k], best_now[:k]]
            g0 = j.gpus
            if g0 and not j.rebatch and g0 <= k and j.batch > 0:
                # its batch changes only when it is relaunched: kept at its GPUs
                it0 = model.iteration_time(
                    np.array([max(1, len(j.placement))]),
                    np.array([g0]),
                    np.array([max(1, j.micro_batch)]),
                    np.array([max(1, j.accum_steps)]),
                )
                gain0 = _gain(np.array(float(j.batch)), j.min_batch, seg_rho)
                time[i, g0] = float((seg_w * float(it0[0]) / gain0).sum())
                batch[i, g0] = j.batch
    gmin = np.array([min(j.min_gpus, int(gmax[i])) for i, j in enumerate(jobs)], dtype=np.int64)
    if np.isfinite(left).any() or not all(j.length_known for j in jobs):
        factor = factors(
            jobs, snapshot.history, (key, hist_key), left, one_gpu_time(time, gmin) * speed,
            units, worked,
        )  # fmt: skip
        time *= factor[:, None]
        remaining *= factor
        now_left *= factor
    return Estimates(
        jobs=jobs,
        time=time,
        batch=batch,
        gmax=gmax,
        gmin=gmin,
        models=models,
        keys=key,
        network=learn_network([m for m in models.values() if m.model_bytes > 0]),
        speed_now=speed_now,
        remaining=remaining,
        now_left=now_left,
        done=worked,
    )


def one_gpu_time(time: np.ndarray, gmin: np.ndarray) -> np.ndarray:
    """Each job's remaining time on one GPU, or for a job that needs more, its remaining
    GPU-seconds at its minimum (``time[j, gmin] x gmin``): a measure of remaining work the
    jobs can be ranked by whatever their minimum (inf where unknown)."""
    n, width = time.shape
    g0 = np.maximum(gmin, 1)
    ok = g0 < width
    out = np.full(n, np.inf)
    rows = np.flatnonzero(ok)
    out[rows] = time[rows, g0[rows]] * g0[rows]
    return out


def slow_now(est: Estimates, floor: float, min_left_s: float) -> np.ndarray:
    """``slow[j, g]``: GPU counts above job ``j``'s best in its current epoch at which it
    would train that epoch at under ``floor`` times its best speed there, for the jobs
    whose current epoch has at least ``min_left_s`` seconds left at its best. The remaining
    time ``time[j, g]`` assumes a job keeps ``g`` GPUs to its end, so it can prefer a count
    that only later epochs use well (yolov3's first epoch, whose gradient noise is tiny,
    runs 3-4x slower on 16-64 GPUs than on one); the job is replanned every round, so
    such a count only slows it now, on more GPUs."""
    n, width = est.time.shape
    if est.speed_now is None or est.now_left is None or floor <= 0 or n == 0:
        return np.zeros((n, width), dtype=bool)
    speed = est.speed_now
    best = np.argmax(speed, axis=1)  # the first count at the best speed
    cols = np.arange(width)[None, :]
    slow = (cols > best[:, None]) & (speed < floor)
    return np.asarray(slow & (est.now_left >= min_left_s)[:, None], dtype=bool)


SEGMENTS = 6


def _gain(batch: np.ndarray, init_batch: float, rho: np.ndarray) -> np.ndarray:
    scale = batch / init_batch
    return np.asarray((rho + 1.0) / (rho / scale + 1.0))


def _segments(work: np.ndarray, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge epochs into at most SEGMENTS groups (work-weighted noise); the current
    epoch stays a group of its own, so the batch chosen now fits the current noise."""
    if len(work) <= SEGMENTS:
        return work, rho
    rest, parts = len(work) - 1, SEGMENTS - 1
    sizes = np.full(parts, rest // parts) + (np.arange(parts) < rest % parts)
    starts = np.concatenate(([0, 1], 1 + np.cumsum(sizes)[:-1])).astype(np.int64)
    w = np.add.reduceat(work, starts)
    r = np.add.reduceat(work * rho, starts) / np.maximum(w, 1e-300)
    return w, r


@functools.lru_cache(maxsize=4096)
def _ratios(history: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Noise ratio grad_var / grad_sqr per finished epoch."""
    arr = np.asarray(history, dtype=float).reshape(-1, 2)
    return np.asarray(np.maximum(arr[:, 1], 0.0) / np.maximum(arr[:, 0], 1e-30))
