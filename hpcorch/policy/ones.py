"""ONES: online evolutionary search over every job's GPU count and global batch size.

Each round:

1. :func:`hpcorch.policy.estimate.estimate` predicts for every job and GPU count ``g`` the
   remaining time ``T[j, g]`` at the best batch for ``g`` (throughput model fitted online,
   gradient-noise convergence model).
2. A schedule (one GPU count per job) is scored by ``sum_j w_j / T'[j, g_j]``, where
   ``T'`` adds the restart cost (and a hysteresis) whenever ``g_j`` differs from the job's
   current GPUs - so a job is resized only when the predicted gain beats the restart cost.
   ``w_j = T[j, 1] ** (1 - priority) * rank_j ** rank_weight`` (rank 1 = longest job):
   shortest-remaining-first tempered towards throughput, with speed-up awareness, which
   is what lowers the average JCT.
3. A population of schedules, kept across rounds (state of the policy object), evolves by
   tournament selection, uniform crossover and mutation (grow, shrink, preempt a job, move
   GPUs between two jobs), each child repaired to the pool size and filled so that no GPU
   idles while some job would gain from it. The current allocation and a greedy schedule
   seed every round.
4. The best schedule is placed by :func:`hpcorch.policy.placement.place_schedule`: jobs
   whose GPU count is unchanged keep their nodes, the rest go on the fewest nodes, with
   fewer GPUs where the free GPUs are too scattered and spreading would be slower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hpcorch.model.throughput import Network
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.estimate import Estimates, estimate, one_gpu_time, slow_now
from hpcorch.policy.lengths import Prior
from hpcorch.policy.ones_ops import Ops, group_masks
from hpcorch.policy.ones_types import schedule_types
from hpcorch.policy.placement import place_schedule
from hpcorch.policy.probe import needs_probe, probe_batches
from hpcorch.policy.tails import age_factor, guarded, restart_guard, restarts_over
from hpcorch.policy.types import JobView, Plan, Snapshot

DEPARTED_KEEP = 2000
"""Jobs that left the pool whose GPU-seconds ONES remembers (the newest)."""
WASTE_HORIZON_S = 3600.0
AGE_S = 1800.0
AGE_CAP = 2.0
RESTARTS_PER_HOUR = 0.0


@dataclass
class OnesPolicy:
    """Evolutionary GPU/batch-size scheduler (population held across rounds)."""

    seed: int = 0
    population: int = 16
    generations: int = 12
    elite: int = 4
    explore: float = 4.0
    max_job_gpus: int = 64
    first_gpus: int = 0
    """GPUs a job of a never-measured application may start with (0: one node's)."""
    first_asked: bool = True
    """... but a job whose user asked for one GPU (``JobView.requested_gpus`` 1, and
    ``gpus_asked``) starts on one: one GPU runs no all-reduce, and a model its user runs on
    one may run slower on a node (ncf: about 3x). A larger ask caps nothing: between one
    node's GPUs and the GPUs asked for, the node measured better (Sia's simulator)."""
    hysteresis: float = 0.1
    """A running job is resized only if it then finishes this fraction sooner."""
    min_resize_s: float = 300.0
    """Jobs predicted to finish within this many seconds keep their GPUs (a resize costs
    a restart, ~25 s, and the controller lets a relaunched job train 60 s before it may
    be stopped again)."""
    whole_set: bool = False
    """Score schedules by the predicted completion of the whole job set (queued jobs
    start shortest-first on the capacity the schedule leaves); else by completion rate."""
    priority: float = 0.3
    """Exponent of remaining time in a job's weight: 1 = completion rate (shortest
    remaining first), 0 = sum of speedups (throughput); in between trades the two."""
    knee: float = 0.0
    """GPUs past the point where one more adds less than this fraction of a GPU's speed
    count only ``knee_discount`` as much: every job first gets its efficient share."""
    knee_discount: float = 0.05
    rank_weight: float = 0.5
    """Further weight each job's score by its rank by remaining time (the longest job
    ranks 1, the shortest n) to this power, as in heSRPT's optimal allocation."""
    now_rate: bool = False
    """Score a GPU count by the job's speed in its current epoch (the remaining time at
    each epoch's best count, stretched by the current relative speed) instead of the
    remaining time if the job kept that count to the end."""
    now_floor: float = 0.0
    """Plan no job on more GPUs than its best count in its current epoch where it would
    train that epoch at under this fraction of its best speed there
    (:func:`hpcorch.policy.estimate.slow_now`; jobs about to finish or that cannot be
    resized keep their GPUs); 0: off. Pools of one GPU type only: the type-aware search
    (:mod:`hpcorch.policy.ones_types`) does not apply it."""
    probe: bool = True
    """Plan a running job measured at one per-GPU batch only at another for a round (a
    batch-only change, no restart: :mod:`hpcorch.policy.probe`)."""
    probe_hold_s: float = 150.0
    """Such a job keeps its GPUs until it has measured the probe (it may be preempted),
    for at most this long (a report that does not come must not pin it)."""
    sees_fixed: bool = True
    """Be shown the running jobs that cannot be resized yet, pinned to their GPUs
    (:func:`hpcorch.policy.split.split_schedule`), so that their ranks and the population
    kept across rounds take them into account; they always keep their GPUs."""
    waste: float = 0.0
    """Weight of the GPU-time a change wastes: a job changed to ``g`` GPUs is scored as if
    it took ``waste x restart cost x g x (other jobs / pool GPUs)`` seconds longer (the
    pool's GPU-seconds idle while it restarts delay every other job's work); 0: only its
    own restart cost counts."""
    tails: str = "all"
    """The jobs the tail guards below apply to (:mod:`hpcorch.policy.tails`): ``all``,
    ``unknown`` (those of unknown length, whose remaining work is a guess that changes as
    they run) or ``none``."""
    waste_horizon_s: float = WASTE_HORIZON_S
    """Charge a guarded running job's change the value of the GPU-time its restart wastes
    (:meth:`charge`), spread over at most this many seconds; 0: not charged."""
    waste_weight: float = 1.0
    by_epochs: bool = True
    """Weigh a job of unknown length that has finished an epoch by the epochs the jobs that
    left the pool trained, at its own work per epoch (:mod:`hpcorch.policy.lengths`)."""
    censor: bool = True
    """Weigh a job of unknown length against the sizes of the jobs that left the pool and
    the work of those still in it (Kaplan-Meier: :func:`hpcorch.policy.lengths.survival`)."""
    kin: float = 1.0
    """With ``by_epochs``: the departed jobs whose work per epoch is near the job's weigh
    most (:class:`hpcorch.policy.lengths.Prior`); 0: all alike."""
    waste_adapt: bool = True
    """Spread a change's waste over the time the job's changes have lasted so far
    (:meth:`lasts`) rather than ``waste_horizon_s``."""
    age_s: float = AGE_S
    """A guarded job behind its fair share of the pool by this many seconds
    (:func:`hpcorch.policy.tails.behind`) weighs twice as much (``age_power`` 1, up to
    ``age_cap``); 0: no aging."""
    age_power: float = 1.0
    age_cap: float = AGE_CAP
    """The most aging multiplies a job's weight by (0: no cap; below 1: no aging). Jobs far
    behind then all weigh alike, ordered among themselves by remaining work rather than by
    who waited longest (aging without a cap shares the pool among the longest jobs, which
    all end late)."""
    restarts_free: float = 2.0
    """Restarts a job may suffer before its own run earns it more (``restarts_per_hour``)."""
    restarts_per_hour: float = RESTARTS_PER_HOUR
    """Restarts a guarded job earns per hour it holds GPUs; one past them (counting the
    restart a change costs) keeps its GPUs unless a change gains ``1 + over`` times what
    it has (:func:`hpcorch.policy.tails.restart_guard`; 0: no bound)."""
    name: str = "ones"
    _pop: list[dict[str, int]] = field(default_factory=list)
    _rng: np.random.Generator | None = None
    _network: Network | None = None
    _probing: dict[str, float] = field(default_factory=dict)
    _typed_pop: list[dict[str, tuple[str, int]]] = field(default_factory=list)
    _type_speeds: dict[str, dict[str, float]] = field(default_factory=dict)
    _work: dict[str, float] = field(default_factory=dict)
    _rates: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    _at: float | None = None
    _keys: dict[str, str] = field(default_factory=dict)
    _departed: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    _epochs: dict[str, int] = field(default_factory=dict)

    def schedule(self, snapshot: Snapshot) -> Plan:
        self.account(snapshot)
        if snapshot.gpu_types:  # type, GPUs and batch per job; one type per launch, also
            return schedule_types(self, snapshot)  # where the site would let it mix them
        rng = self.random()
        est = estimate(
            snapshot,
            explore=self.explore,
            gpu_cap=self.max_job_gpus,
            first_gpus=self.first_gpus or max(snapshot.node_gpus, default=1),
            first_asked=self.first_asked,
            network=self._network,
            departed=self.departed(),
            done=self._work,
            prior=self.prior(),
        )
        self._network = est.network  # the next round models with what this one learned
        self.note_rates(est)
        jobs = est.jobs
        n = len(jobs)
        if n == 0:
            return Plan()
        total = snapshot.total_gpus
        width = est.time.shape[1]
        cur = np.array([min(j.gpus, width - 1) for j in jobs], dtype=np.int64)
        cols = np.arange(width)[None, :]
        change = cols != cur[:, None]
        value, t = self.time_value(snapshot, est, cur)
        # remaining work on one GPU (GPU-seconds at the minimum of a job that needs more)
        value = self.weigh(value, one_gpu_time(est.time, est.gmin), jobs, snapshot)
        value = self.charge(value, t, cur, snapshot)
        value = self.guard(value, cur, jobs)
        over = cols > est.gmax[:, None]
        value[over] = -np.inf
        pinned = self.kept(jobs)
        value[pinned[:, None] & change] = -np.inf  # a fixed job keeps its GPUs
        if self.probe and self.probe_hold_s > 0:
            probing = self.holding(snapshot, np.array(needs_probe(jobs, est), dtype=bool) & ~pinned)
            value[probing[:, None] & change & (cols > 0)] = -np.inf
        if self.now_floor > 0:
            value = self.floor_now(value, est)
        groups = group_masks(snapshot, jobs)
        whole = t if self.whole_set else None
        ops = Ops(value, est.gmax, total, rng, whole, est.gmin, groups, pinned)

        seeds = [ops.fill(ops.repair(np.minimum(cur, est.gmax))), ops.fill(np.zeros(n, np.int64))]
        ids = [j.job_id for j in jobs]
        for ind in self._pop:
            g = np.array([ind.get(k, 0) for k in ids], dtype=np.int64)
            seeds.append(ops.fill(ops.repair(np.minimum(g, est.gmax))))
        pop = np.array(seeds[: self.population])
        while len(pop) < self.population:
            extra = ops.mutate(pop[rng.integers(len(pop))])
            if groups:  # every individual within the group limits
                extra = ops.fill(ops.repair(extra))
            pop = np.vstack([pop, extra[None, :]])
        fit = ops.fitness(pop)
        # Fewer generations for very large job sets keep a round within its time budget.
        gens = min(self.generations, max(2, 10000 // max(n, 1)))
        for _ in range(gens):
            order = np.argsort(-fit, kind="stable")
            children = [pop[i] for i in order[: self.elite]]
            while len(children) < self.population:
                a = ops.tournament(fit)
                b = ops.tournament(fit)
                mask = rng.random(n) < 0.5
                child = np.where(mask, pop[a], pop[b])
                if rng.random() < 0.8:
                    child = ops.mutate(child)
                children.append(ops.fill(ops.repair(child)))
            pop = np.array(children)
            fit = ops.fitness(pop)
        order = np.argsort(-fit, kind="stable")
        pop = pop[order]
        self._pop = [dict(zip(ids, (int(x) for x in ind), strict=True)) for ind in pop]
        plan = place_schedule(snapshot, est, value, pop[0], groups)
        if self.probe:
            plan = probe_batches(jobs, est, plan)
        return fit_cpus(snapshot, plan)

    def kept(self, jobs: Sequence[JobView]) -> np.ndarray:
        """The running jobs that keep their GPUs this round: those that cannot be stopped
        now."""
        return np.array([j.running and not j.resizable for j in jobs], dtype=bool)

    def floor_now(self, value: np.ndarray, est: Estimates) -> np.ndarray:
        """``value`` without the counts too slow in each job's current epoch (see
        ``now_floor``), but for a job left no count to run on (one about to finish, held
        for a probe or that cannot be resized, on such a count now)."""
        slow = slow_now(est, self.now_floor, self.min_resize_s)
        floored = np.where(slow, -np.inf, value)
        left = np.asarray(np.isfinite(floored[:, 1:]).any(axis=1), dtype=bool)
        return np.where(left[:, None], floored, value)

    def guard(self, value: np.ndarray, cur: np.ndarray, jobs: Sequence[JobView]) -> np.ndarray:
        """``value`` with the current allocation of each guarded job past the restarts its
        run has earned worth more (:func:`hpcorch.policy.tails.restart_guard`). ``cur``:
        as for :meth:`charge`."""
        over = restarts_over(jobs, self.restarts_free, self.restarts_per_hour)
        return restart_guard(value, cur, np.where(guarded(jobs, self.tails), over, 0.0))

    def account(self, snapshot: Snapshot) -> None:
        """Before a round: add to each job's work done (in one-GPU seconds at the reference
        speed) what it did since the last round at the rate its GPUs had then
        (:meth:`note_rates`), and note the work of the jobs that left the pool: the sizes a
        job of unknown length is weighed against (:mod:`hpcorch.policy.lengths`; the most
        recent ``DEPARTED_KEEP``). A job first seen is counted at its GPU-seconds. Unlike
        the progress a job reports, this does not depend on the batches it trained with."""
        dt = snapshot.now - self._at if self._at is not None else 0.0
        work: dict[str, float] = {}
        for j in snapshot.jobs:
            w = self._work.get(j.job_id)
            if w is None:
                w = j.attained_service
            elif j.running and dt > 0:
                row = self._rates.get(j.job_id, {}).get(j.gpu_type)
                w += dt * (float(row[j.gpus]) if row is not None and j.gpus < len(row) else 0.0)
            work[j.job_id] = w
        for job_id, w in self._work.items():
            if job_id not in work and w > 0:
                self._departed.pop(job_id, None)
                last = self._epochs.get(job_id, 0)  # 0: it reported no epoch it finished
                self._departed[job_id] = (
                    self._keys.get(job_id, job_id),
                    w,
                    last + 1 if last else 0,
                )
        self._epochs = {j.job_id: j.epoch for j in snapshot.jobs}
        while len(self._departed) > DEPARTED_KEEP:
            self._departed.pop(next(iter(self._departed)))
        self._rates = {k: v for k, v in self._rates.items() if k in work}
        self._keys = {k: v for k, v in self._keys.items() if k in work}
        self._work, self._at = work, snapshot.now

    def note_rates(self, est: Estimates, speed: float = 1.0, gpu_type: str = "") -> None:
        """Each job's work per second on every GPU count of ``gpu_type`` (its one-GPU time
        at ``speed`` over its time there), for the next round's :meth:`account`."""
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = one_gpu_time(est.time, est.gmin)[:, None] * speed / est.time
        rate = np.where(np.isfinite(rate), rate, 0.0)
        for j, row in zip(est.jobs, rate, strict=True):
            self._rates.setdefault(j.job_id, {})[gpu_type] = row
        self._keys.update(est.keys)

    def prior(self) -> Prior:
        """What a job of unknown length's remaining work is inferred from, beyond the sizes
        of the departed jobs."""
        return Prior(censor=self.censor, by_epochs=self.by_epochs, kin=self.kin)

    def departed(self) -> list[tuple[str, float, float]]:
        """The pooling key, the work done and the epochs trained (0: not known) of each
        remembered job that left the pool."""
        return list(self._departed.values())

    def random(self) -> np.random.Generator:
        """The search's random numbers, one stream across rounds (from ``seed``)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def time_value(
        self, snapshot: Snapshot, est: Estimates, cur: np.ndarray, ending: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(value, time): ``time[j, g]`` the job's remaining time on ``g`` GPUs with the
        restart cost (and hysteresis) of a change from ``cur``; ``value`` its inverse (the
        job's completion rate), 0 for no GPUs, -inf where it must not change. ``ending``:
        the jobs about to finish (default: those ``est`` predicts to within
        ``min_resize_s`` at ``cur``), which keep what they have."""
        n, width = est.time.shape
        cols = np.arange(width)[None, :]
        change = cols != cur[:, None]
        base = est.time
        if self.now_rate and est.speed_now is not None and est.remaining is not None:
            with np.errstate(divide="ignore"):
                base = np.where(est.speed_now > 0, est.remaining[:, None] / est.speed_now, np.inf)
            base[:, 0] = np.inf
        cost = restart_costs(snapshot, est.jobs)[:, None]
        t = base + np.where(change, cost, 0.0)
        if self.waste > 0:
            # the GPUs a launch starts on idle for its restart: the other jobs' work waits
            # that GPU-time over the pool, as if this job took that much longer
            others = max(len(est.jobs) - 1, 0) / max(snapshot.total_gpus, 1)
            t = t + np.where(change, self.waste * cost * cols * others, 0.0)
        running = (cur != 0)[:, None]  # -1: running on another GPU type
        t = np.where(change & running, t / (1.0 - self.hysteresis), t)
        # A job about to finish is never resized: the restart would cost more than it saves.
        if ending is None:
            t_now = est.time[np.arange(n), cur][:, None]
            ending = running & (t_now < self.min_resize_s)
        t = np.where(ending.reshape(n, 1) & (cols > 0) & change, np.inf, t)
        with np.errstate(divide="ignore"):
            value = np.where(np.isfinite(t), 1.0 / t, -np.inf)
        value[:, 0] = 0.0
        if self.knee > 0:
            value = _knee(value, est.time, self.knee, self.knee_discount)
        return value, t

    def charge(
        self, value: np.ndarray, t: np.ndarray, cur: np.ndarray, snapshot: Snapshot
    ) -> np.ndarray:
        """``value`` (weighted, jobs first, GPU counts last) less the value of the GPU-time
        a running job's change wastes: its restart idles ``max(g, cur)`` GPUs for the
        restart cost, GPUs worth the pool's value per GPU now (the running jobs' values over
        the pool's GPUs), spread over the time the change is expected to last (the job's
        remaining time ``t`` at ``g``, at most ``waste_horizon_s``). ``cur``: each job's
        current GPUs (0: queued) or, over GPU types, ``(type, GPUs)`` index arrays."""
        mask = guarded(snapshot.jobs, self.tails)
        if self.waste_horizon_s <= 0 or not mask.any():
            return value
        n, width = value.shape[0], value.shape[-1]
        rows = np.arange(n)
        if cur.ndim == 1:
            held = value[rows, cur]
            now = cur
        else:
            kinds, gpus = cur
            held = value[rows, kinds, gpus]
            now = gpus
        running = now > 0
        kept = held[running]
        lam = float(kept[np.isfinite(kept)].sum()) / max(snapshot.total_gpus, 1)
        if lam <= 0:
            return value
        cols = np.arange(width)
        shape = (n,) + (1,) * (value.ndim - 1)
        gpus_used = np.maximum(cols, now.reshape(shape))
        with np.errstate(invalid="ignore"):
            horizon = np.minimum(t, self.lasts(snapshot.jobs).reshape(shape))
            cost = restart_costs(snapshot, snapshot.jobs).reshape(shape)
            pen = lam * cost * gpus_used / np.maximum(horizon, 1.0)
        changed = np.ones(value.shape, dtype=bool)
        if cur.ndim == 1:
            changed[rows, cur] = False
        else:
            changed[rows, cur[0], cur[1]] = False
        changed &= (running & mask).reshape(shape) & (cols > 0)
        changed &= np.isfinite(value) & np.isfinite(pen)
        return np.where(changed, value - self.waste_weight * pen, value)

    def lasts(self, jobs: Sequence[JobView]) -> np.ndarray:
        """How long a change to each job is expected to last: ``waste_horizon_s``, or with
        ``waste_adapt`` the time between the changes the job has had so far, counting
        ``waste_horizon_s`` as one such interval before its first (a job changed often is
        changed again soon: its change wastes its restart over less time)."""
        if not self.waste_adapt:
            return np.full(len(jobs), self.waste_horizon_s)
        run = np.array([j.run_time for j in jobs], dtype=float)
        changes = np.array([j.restarts for j in jobs], dtype=float)
        return np.minimum((run + self.waste_horizon_s) / (changes + 1.0), self.waste_horizon_s)

    def weigh(
        self,
        value: np.ndarray,
        work: np.ndarray,
        jobs: Sequence[JobView],
        snapshot: Snapshot | None = None,
    ) -> np.ndarray:
        """``value`` (jobs first) weighted by each job's remaining ``work`` (GPU-seconds),
        its rank by it, its user's share and, with ``snapshot``, how far it is behind its
        fair share (see the class's fields)."""
        n = len(jobs)
        shape = (n,) + (1,) * (value.ndim - 1)
        if self.priority != 1.0:
            finite = work[np.isfinite(work)]
            # a job whose time cannot be predicted counts as a typical one, not as 1 s
            fallback = float(np.median(finite)) if len(finite) else 1.0
            ref = np.where(np.isfinite(work), work, fallback).reshape(shape)
            value = value * ref ** (1.0 - self.priority)
        if self.rank_weight > 0:
            t1 = np.where(np.isfinite(work), work, 1e12)
            rank = np.empty(n)
            rank[np.argsort(-t1, kind="stable")] = np.arange(1, n + 1)
            value = value * rank.reshape(shape) ** self.rank_weight
        weights = np.array([j.weight for j in jobs])
        if self.age_s > 0 and snapshot is not None and n:
            mask = guarded(jobs, self.tails)
            factor = age_factor(snapshot, jobs, self.age_s, self.age_power, mask, self.age_cap)
            weights = weights * factor
        return np.asarray(value * weights.reshape(shape))  # users' fair shares

    def holding(self, snapshot: Snapshot, probing: np.ndarray) -> np.ndarray:
        """Of the jobs that want a probe, those still held for it (see ``probe_hold_s``)."""
        jobs = snapshot.jobs
        # only the jobs still in the pool: a controller runs for months
        here = {j.job_id for j in jobs}
        self._probing = {k: v for k, v in self._probing.items() if k in here}
        probing = probing.copy()
        for i in np.flatnonzero(probing):
            since = self._probing.setdefault(jobs[i].job_id, snapshot.now)
            probing[i] = snapshot.now - since < self.probe_hold_s
        return probing


def restart_costs(snapshot: Snapshot, jobs: Sequence[JobView]) -> np.ndarray:
    """Each job's restart cost: its own where measured, else the pool's."""
    return np.array([j.restart_cost_s or snapshot.restart_cost_s for j in jobs], dtype=float)


def _knee(value: np.ndarray, time: np.ndarray, eff: float, discount: float) -> np.ndarray:
    """Discount the score of GPUs beyond each job's efficient size (see ``knee``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = np.where(np.isfinite(time), 1.0 / time, 0.0)
        rel = np.diff(speed, axis=1) / np.maximum(speed[:, 1:2], 1e-300)
    ok = rel >= eff
    ok[:, 0] = True  # the first GPU always counts
    knee = np.minimum.accumulate(ok, axis=1).sum(axis=1)  # efficient size per job
    cols = np.arange(value.shape[1])[None, :]
    at = value[np.arange(len(knee)), knee][:, None]
    with np.errstate(invalid="ignore"):
        past = at + discount * (value - at)
    return np.where((cols > knee[:, None]) & np.isfinite(value), past, value)
