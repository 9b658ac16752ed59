"""ONES's genetic operators over GPU-count vectors (:class:`Ops`) and the two steps they
share with the search over GPU types (:mod:`hpcorch.policy.ones_types`): :func:`trim` GPUs
from the jobs that lose least, :func:`grow` the jobs that gain most.

Every individual is repaired into the feasible space: the pool's GPUs, and the limits of
groups of jobs (``groups``: a user's jobs under a QOS's ``MaxTRESPerUser``, an account's
under ``GrpTRES``; :mod:`hpcorch.policy.limits`), so the search compares only schedules
Slurm would run."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcorch.policy.types import JobView, Snapshot

Group = tuple[np.ndarray, int | None, int | None]
"""A group limit over the jobs: (its members as a boolean mask, the GPUs they may hold
together or None, how many of them may hold GPUs or None)."""


class Ops:
    """Genetic operators over GPU-count vectors, scored by a separable value table."""

    def __init__(
        self,
        value: np.ndarray,
        gmax: np.ndarray,
        total: int,
        rng: np.random.Generator,
        time: np.ndarray | None = None,
        gmin: np.ndarray | None = None,
        groups: Sequence[Group] = (),
        fixed: np.ndarray | None = None,
    ) -> None:
        self.value = value
        self.groups = tuple(groups)
        """Group limits every individual is repaired into (see :data:`Group`)."""
        self.movable = ~fixed if fixed is not None else np.ones(len(gmax), dtype=bool)
        """Jobs whose GPUs may change (a fixed job keeps its GPUs whatever a group says)."""
        self.gmin = gmin if gmin is not None else np.ones_like(gmax)
        self.time = time
        if time is not None:
            t1 = time[:, 1] if time.shape[1] > 1 else np.full(len(gmax), np.inf)
            self.srpt = np.argsort(t1, kind="stable")
            self.t1 = np.where(np.isfinite(t1), t1, 1e12)
        self.gmax = gmax
        self.total = total
        self.rng = rng
        self.rows = np.arange(len(gmax))

    def fitness(self, pop: np.ndarray) -> np.ndarray:
        if self.time is None:
            return np.asarray(self.value[self.rows[None, :], pop].sum(axis=1))
        return np.array([-self._whole_set(g) for g in pop])

    def _whole_set(self, g: np.ndarray) -> float:
        """Predicted sum of remaining completion times of all jobs under schedule ``g``.

        Running jobs finish at their predicted time; queued jobs then run one GPU each,
        shortest first, as fluid work on the capacity the running jobs free over time.
        """
        assert self.time is not None
        run = g > 0
        fin = self.time[self.rows[run], g[run]]
        fin = np.where(np.isfinite(fin), fin, 1e12)
        queued = self.srpt[~run[self.srpt]]
        if len(queued) == 0:
            return float(fin.sum())
        order = np.argsort(fin, kind="stable")
        tau = fin[order]
        freed = g[run][order]
        f0 = self.total - int(g.sum())
        rate = f0 + np.concatenate(([0], np.cumsum(freed)))  # free GPUs on each segment
        area = np.concatenate(([0.0], np.cumsum(rate[:-1] * np.diff(np.concatenate(([0.0], tau))))))
        knots = np.concatenate(([0.0], tau))
        need = np.cumsum(self.t1[queued])
        done = np.interp(need, area, knots)
        beyond = need > area[-1]
        done = np.where(beyond, knots[-1] + (need - area[-1]) / self.total, done)
        done = np.maximum(done, self.t1[queued])
        return float(fin.sum() + done.sum())

    def tournament(self, fit: np.ndarray) -> int:
        a, b = self.rng.integers(len(fit), size=2)
        return int(a if fit[a] >= fit[b] else b)

    def snap(self, g: np.ndarray) -> np.ndarray:
        """Jobs between 0 and their minimum GPU count are queued instead."""
        return np.where((g > 0) & (g < self.gmin), 0, np.minimum(g, self.gmax))

    def mutate(self, g: np.ndarray) -> np.ndarray:
        g = g.copy()
        n = len(g)
        for _ in range(1 + int(self.rng.integers(3))):
            j = int(self.rng.integers(n))
            op = self.rng.random()
            if op < 0.2:
                g[j] = 0  # preempt
            elif op < 0.45:
                g[j] = min(max(g[j] * 2, 1), self.gmax[j])
            elif op < 0.7:
                g[j] = g[j] // 2
            else:
                k = int(self.rng.integers(n))
                moved = min(g[k], self.gmax[j] - g[j])
                if moved > 0:
                    step = int(self.rng.integers(1, moved + 1))
                    g[k] -= step
                    g[j] += step
        return self.snap(g)

    def repair(self, g: np.ndarray) -> np.ndarray:
        """Take GPUs from the jobs that lose least until the schedule fits the pool and
        every group limit."""
        g = self.snap(g).astype(np.int64)
        trim(self.value, g, self.gmin, int(g.sum()) - self.total)
        for mask, gpus, jobs in self.groups:
            on = mask & self.movable
            if jobs is not None:
                while int(((g > 0) & mask).sum()) > jobs:
                    cand = np.flatnonzero(on & (g > 0))
                    if not len(cand):
                        break
                    g[cand[np.argmin(self.value[cand, g[cand]])]] = 0  # the one worth least
            if gpus is not None:
                trim(self.value, g, self.gmin, int(g[mask].sum()) - gpus, on)
        return g

    def fill(self, g: np.ndarray) -> np.ndarray:
        """Give free GPUs to the jobs that gain most from them, while any gains
        (:func:`grow`), and no group limit is passed (its jobs are left out once it is
        full; GPUs a group had to give back go to the others)."""
        for _ in range(3 if self.groups else 1):
            free = self.total - int(g.sum())
            if free <= 0:
                return g
            counts = grow(self.value, g, self.gmax, self.gmin, free, self.room(g))
            if counts is None:
                return g.copy()
            g = np.asarray(self.repair(g + counts))
        return g

    def room(self, g: np.ndarray) -> np.ndarray | None:
        """The jobs that may take more GPUs under the group limits (None: all)."""
        if not self.groups:
            return None
        cand = np.ones(len(g), dtype=bool)
        for mask, gpus, jobs in self.groups:
            if gpus is not None and int(g[mask].sum()) >= gpus:
                cand &= ~mask
            if jobs is not None and int(((g > 0) & mask).sum()) >= jobs:
                cand &= ~(mask & (g == 0))
        return cand


def trim(
    value: np.ndarray, g: np.ndarray, gmin: np.ndarray, excess: int, on: np.ndarray | None = None
) -> None:
    """Take ``excess`` GPUs, in place, from the jobs (of ``on``) that lose least
    (``value[j, g]``); a job brought below its minimum ``gmin`` gives up all its GPUs."""
    while excess > 0:
        cand = np.flatnonzero(g > 0 if on is None else on & (g > 0))
        if not len(cand):
            return
        prev = np.where(g[cand] - 1 < gmin[cand], 0, g[cand] - 1)
        with np.errstate(invalid="ignore"):
            loss = value[cand, g[cand]] - value[cand, prev]
        loss = np.where(np.isnan(loss), -np.inf, loss)
        k = min(max(1, excess // 8), len(cand))
        for i in cand[np.argsort(loss, kind="stable")[:k]]:
            drop = int(g[i]) if g[i] - 1 < gmin[i] else 1
            g[i] -= drop
            excess -= drop


def grow(
    value: np.ndarray,
    g: np.ndarray,
    gmax: np.ndarray,
    gmin: np.ndarray,
    free: int,
    cand: np.ndarray | None = None,
) -> np.ndarray | None:
    """GPUs to add to each job (of ``cand``, the rest at 0) for the ``free`` GPUs that gain
    most, or None where none gains.

    Vectorised greedy: every job's marginal values for one, two, ... more GPUs are made
    non-increasing (a GPU only counts if the ones before it are taken) and the largest
    positive ones over all jobs win. A queued job below its minimum takes its minimum at
    once (its marginal value is the average over those GPUs).
    """
    rows = np.arange(len(g))
    width = value.shape[1]
    steps = np.arange(1, width)
    tgt = g[:, None] + steps[None, :]
    valid = tgt <= gmax[:, None]
    if cand is not None:
        valid &= cand[:, None]
    tgt = np.minimum(tgt, width - 1)
    vals = value[rows[:, None], tgt]
    base = value[rows, g]
    prev = np.concatenate([base[:, None], vals[:, :-1]], axis=1)
    with np.errstate(invalid="ignore"):
        marg = vals - prev
    queued = (g == 0) & (gmin > 1)
    for j in np.flatnonzero(queued if cand is None else queued & cand):
        m = int(gmin[j])
        if m < width:
            marg[j, :m] = value[j, m] / m
    marg = np.where(valid & ~np.isnan(marg), marg, -np.inf)
    marg = np.minimum.accumulate(marg, axis=1)
    flat = marg.ravel()
    pos = int((flat > 0).sum())
    if pos == 0:
        return None
    take = min(free, pos)
    top = np.argpartition(-flat, take - 1)[:take] if take < len(flat) else np.arange(len(flat))
    return np.bincount(top // (width - 1), minlength=len(g))


def fits_groups(groups: Sequence[Group], g: np.ndarray, i: int, more: int) -> bool:
    """Whether job ``i`` may take ``more`` GPUs on top of ``g`` under ``groups``."""
    for mask, gpus, jobs in groups:
        if not mask[i]:
            continue
        if gpus is not None and int(g[mask].sum()) + more > gpus:
            return False
        if jobs is not None and g[i] == 0 and int(((g > 0) & mask).sum()) >= jobs:
            return False
    return True


def group_masks(snapshot: Snapshot, jobs: Sequence[JobView]) -> list[Group]:
    """The snapshot's group limits on GPUs and jobs over ``jobs`` (as :data:`Group`)."""
    out: list[Group] = []
    for g in snapshot.limits.groups:
        if g.gpus is None and g.jobs is None:
            continue
        members = set(g.members)
        mask = np.array([j.job_id in members for j in jobs], dtype=bool)
        if mask.any():
            out.append((mask, g.gpus, g.jobs))
    return out
