"""ONES over GPU types: the evolutionary search decides each job's type, GPUs and batch.

In a pool of several GPU types (``Snapshot.gpu_types``) :class:`hpcorch.policy.ones.OnesPolicy`
schedules here. Every job is estimated on every type it accepts
(:func:`hpcorch.policy.typed.type_estimates`: its own measurements on a type, else its
measurements elsewhere scaled by the types' learned relative speed), which gives a value
table ``value[j, t, g]``: the job's completion rate on ``g`` GPUs of type ``t``, with the
restart cost of any change of type or count, weighted as in ONES (remaining work on the
fastest type, rank, fair share). An individual is a pair of vectors, GPUs and type per job;
the population evolves as in ONES (tournament, uniform crossover of (type, GPUs) pairs,
mutations: grow, shrink, preempt, move GPUs between jobs, and move a job to another type),
each child repaired to every type's capacity and filled type by type (in a random order, so
that queued jobs are tried on every type) while some job gains from a free GPU. The best
individual is placed type by type on that type's nodes
(:func:`hpcorch.policy.placement.place_schedule`), so no launch spans two types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from hpcorch.model.throughput import Network
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.estimate import Estimates, one_gpu_time
from hpcorch.policy.lengths import Prior
from hpcorch.policy.ones_ops import grow, trim
from hpcorch.policy.placement import place_schedule
from hpcorch.policy.probe import needs_probe, probe_batches
from hpcorch.policy.typed import TypedEstimates, type_estimates
from hpcorch.policy.types import JobPlan, JobView, Plan, Snapshot


class TypedSearch(Protocol):
    """What the search over types needs of its policy
    (:class:`hpcorch.policy.ones.OnesPolicy`): its settings, its value table and the state
    it keeps across rounds."""

    population: int
    generations: int
    elite: int
    explore: float
    max_job_gpus: int
    first_gpus: int
    first_asked: bool
    min_resize_s: float
    probe: bool
    probe_hold_s: float
    _network: Network | None
    _typed_pop: list[dict[str, tuple[str, int]]]
    _type_speeds: dict[str, dict[str, float]]

    def random(self) -> np.random.Generator: ...

    def departed(self) -> list[tuple[str, float, float]]: ...

    def note_rates(self, est: Estimates, speed: float = 1.0, gpu_type: str = "") -> None: ...

    _work: dict[str, float]

    def prior(self) -> Prior: ...

    def kept(self, jobs: Sequence[JobView]) -> np.ndarray: ...

    def time_value(
        self, snapshot: Snapshot, est: Estimates, cur: np.ndarray, ending: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def weigh(
        self,
        value: np.ndarray,
        work: np.ndarray,
        jobs: Sequence[JobView],
        snapshot: Snapshot | None = None,
    ) -> np.ndarray: ...

    def holding(self, snapshot: Snapshot, probing: np.ndarray) -> np.ndarray: ...

    def charge(
        self, value: np.ndarray, t: np.ndarray, cur: np.ndarray, snapshot: Snapshot
    ) -> np.ndarray: ...

    def guard(self, value: np.ndarray, cur: np.ndarray, jobs: Sequence[JobView]) -> np.ndarray: ...


def schedule_types(policy: TypedSearch, snapshot: Snapshot) -> Plan:
    """``policy``'s plan on a pool of several GPU types (no launch spans two)."""
    rng = policy.random()
    te = type_estimates(
        snapshot,
        explore=policy.explore,
        gpu_cap=policy.max_job_gpus,
        first_gpus=policy.first_gpus,
        first_asked=policy.first_asked,
        network=policy._network,
        memory=policy._type_speeds,
        departed=policy.departed(),
        done=policy._work,
        prior=policy.prior(),
    )
    policy._network = te.est[0].network
    for t, e in zip(te.types, te.est, strict=True):
        policy.note_rates(e, te.speed[t], t)
    jobs = snapshot.jobs
    n, kinds = len(jobs), len(te.types)
    if n == 0:
        return Plan()
    # each job's current type (-1: queued, or on a type not planned)
    cur_k = np.array([te.types.index(j.gpu_type) if j.gpu_type in te.types else -1 for j in jobs])
    value, gmax, gmin = _values(policy, snapshot, te, cur_k)
    cap = np.array([sum(v.node_gpus) for v in te.views], dtype=np.int64)
    cur_g = np.where(cur_k >= 0, [j.gpus for j in jobs], 0).astype(np.int64)
    speed = np.array([te.speed[t] for t in te.types])
    fastest = np.argsort(-speed, kind="stable")
    ops = _TypedOps(value, gmax, gmin, cap, rng)
    g0, k0 = ops.repair(
        np.minimum(cur_g, gmax[np.arange(n), np.maximum(cur_k, 0)]), np.maximum(cur_k, 0)
    )
    seeds = [
        ops.fill(g0, k0, fastest),
        ops.fill(np.zeros(n, np.int64), np.zeros(n, np.int64), fastest),
    ]
    ids = [j.job_id for j in jobs]
    for ind in policy._typed_pop:
        k = np.array(
            [te.types.index(ind[i][0]) if i in ind and ind[i][0] in te.types else 0 for i in ids]
        )
        g = np.array([ind[i][1] if i in ind else 0 for i in ids], dtype=np.int64)
        seeds.append(ops.fill(*ops.repair(g, k), fastest))
    pop_g = np.array([s[0] for s in seeds[: policy.population]])
    pop_k = np.array([s[1] for s in seeds[: policy.population]])
    while len(pop_g) < policy.population:
        i = int(rng.integers(len(pop_g)))
        g, k = ops.fill(*ops.repair(*ops.mutate(pop_g[i], pop_k[i])), rng.permutation(kinds))
        pop_g, pop_k = np.vstack([pop_g, g]), np.vstack([pop_k, k])
    fit = ops.fitness(pop_g, pop_k)
    gens = min(policy.generations, max(2, 10000 // max(n, 1)))
    for _ in range(gens):
        order = np.argsort(-fit, kind="stable")
        new_g = [pop_g[i] for i in order[: policy.elite]]
        new_k = [pop_k[i] for i in order[: policy.elite]]
        while len(new_g) < policy.population:
            a, b = ops.tournament(fit), ops.tournament(fit)
            mask = rng.random(n) < 0.5
            g, k = np.where(mask, pop_g[a], pop_g[b]), np.where(mask, pop_k[a], pop_k[b])
            if rng.random() < 0.8:
                g, k = ops.mutate(g, k)
            g, k = ops.fill(*ops.repair(g, k), rng.permutation(kinds))
            new_g.append(g)
            new_k.append(k)
        pop_g, pop_k = np.array(new_g), np.array(new_k)
        fit = ops.fitness(pop_g, pop_k)
    order = np.argsort(-fit, kind="stable")
    pop_g, pop_k = pop_g[order], pop_k[order]
    policy._typed_pop = [
        {i: (te.types[int(k)], int(g)) for i, g, k in zip(ids, pg, pk, strict=True)}
        for pg, pk in zip(pop_g, pop_k, strict=True)
    ]
    return _place(policy, snapshot, te, value, (pop_g[0], pop_k[0]), fastest)


def _values(
    policy: TypedSearch, snapshot: Snapshot, te: TypedEstimates, cur_k: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value[j, t, g], gmax[j, t], gmin[j, t]) over every type; ``cur_k``: each job's
    current type index (-1: none)."""
    jobs = snapshot.jobs
    n, kinds = len(jobs), len(te.types)
    width = max(e.time.shape[1] for e in te.est)
    running = np.array([j.running for j in jobs], dtype=bool) & (cur_k >= 0)
    ending = np.zeros(n, dtype=bool)
    for k, e in enumerate(te.est):
        on = np.flatnonzero(running & (cur_k == k))
        at = np.minimum([jobs[i].gpus for i in on], e.time.shape[1] - 1).astype(np.int64)
        ending[on] = e.time[on, at] < policy.min_resize_s
    value = np.full((n, kinds, width), -np.inf)
    times = np.full((n, kinds, width), np.inf)
    gmax = np.zeros((n, kinds), dtype=np.int64)
    gmin = np.ones((n, kinds), dtype=np.int64)
    work = np.full(n, np.inf)
    pinned = policy.kept(jobs) & running
    probing = np.zeros(n, dtype=bool)
    for k, (e, view) in enumerate(zip(te.est, te.views, strict=True)):
        w = e.time.shape[1]
        here = running & (cur_k == k)
        cur = np.where(here, np.minimum([j.gpus for j in jobs], w - 1), 0).astype(np.int64)
        # a job running on another type changes whatever it gets here: cur = -1
        cur = np.where(running & ~here, -1, cur)
        v, tk = policy.time_value(view, e, cur, ending)
        times[:, k, :w] = tk
        v[running & ~here, 0] = 0.0
        v[np.arange(w)[None, :] > e.gmax[:, None]] = -np.inf
        v[~te.accepts[:, k], 1:] = -np.inf
        value[:, k, :w] = v
        gmax[:, k] = np.where(te.accepts[:, k], np.minimum(e.gmax, w - 1), 0)
        gmin[:, k] = np.maximum(e.gmin, 1)
        work = np.fmin(work, np.where(te.accepts[:, k], one_gpu_time(e.time, e.gmin), np.inf))
        if policy.probe and policy.probe_hold_s > 0:
            probing |= np.array(needs_probe(view.jobs, e), dtype=bool) & here
    value = policy.weigh(value, work, jobs, snapshot)
    at_g = np.where(running, np.minimum([j.gpus for j in jobs], width - 1), 0).astype(np.int64)
    at = np.stack([np.maximum(cur_k, 0), at_g])
    value = policy.guard(policy.charge(value, times, at, snapshot), at, jobs)
    if policy.probe and policy.probe_hold_s > 0:
        held = policy.holding(snapshot, probing & ~pinned)
        # a job measuring its probe keeps its type and count (it may be preempted)
        for i in np.flatnonzero(held):
            kept = value[i, cur_k[i], jobs[i].gpus]
            value[i, :, 1:] = -np.inf
            value[i, cur_k[i], jobs[i].gpus] = kept
    for i in np.flatnonzero(pinned):  # a fixed job keeps its type and GPUs
        kept = value[i, cur_k[i], jobs[i].gpus]
        value[i] = -np.inf
        value[i, cur_k[i], jobs[i].gpus] = kept if np.isfinite(kept) else 1.0
    return value, gmax, gmin


class _TypedOps:
    """Genetic operators over (GPUs, type) vectors, scored by ``value[j, t, g]``."""

    def __init__(
        self,
        value: np.ndarray,
        gmax: np.ndarray,
        gmin: np.ndarray,
        cap: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        self.value, self.gmax, self.gmin, self.cap, self.rng = value, gmax, gmin, cap, rng
        n, self.kinds, self.width = value.shape
        self.rows = np.arange(n)
        self.alts = [np.flatnonzero(gmax[j] > 0) for j in range(n)]
        # each job's best GPU count on each type (its value's maximum)
        self.best = np.argmax(np.where(np.isnan(value), -np.inf, value), axis=2)

    def fitness(self, pop_g: np.ndarray, pop_k: np.ndarray) -> np.ndarray:
        return np.asarray(self.value[self.rows[None, :], pop_k, pop_g].sum(axis=1))

    def tournament(self, fit: np.ndarray) -> int:
        a, b = self.rng.integers(len(fit), size=2)
        return int(a if fit[a] >= fit[b] else b)

    def snap(self, g: np.ndarray, k: np.ndarray) -> np.ndarray:
        lo, hi = self.gmin[self.rows, k], self.gmax[self.rows, k]
        return np.where((g > 0) & (g < lo), 0, np.minimum(g, hi)).astype(np.int64)

    def mutate(self, g: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        g, k = g.copy(), k.copy()
        n = len(g)
        for _ in range(1 + int(self.rng.integers(3))):
            j = int(self.rng.integers(n))
            op = self.rng.random()
            hi = int(self.gmax[j, k[j]])
            if op < 0.15:
                g[j] = 0  # preempt
            elif op < 0.35:
                g[j] = min(max(g[j] * 2, 1), hi)
            elif op < 0.55:
                g[j] = g[j] // 2
            elif op < 0.75 and len(self.alts[j]) > 1:  # another type, at its best count there
                k[j] = int(self.rng.choice(self.alts[j][self.alts[j] != k[j]]))
                g[j] = self.best[j, k[j]]
            else:
                d = int(self.rng.integers(n))
                if k[d] == k[j]:
                    moved = min(g[d], hi - g[j])
                    if moved > 0:
                        step = int(self.rng.integers(1, moved + 1))
                        g[d] -= step
                        g[j] += step
        return self.snap(g, k), k

    def repair(self, g: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Take GPUs from the jobs that lose least until every type's GPUs suffice."""
        g = self.snap(g, k)
        used = np.bincount(k, weights=g, minlength=self.kinds)
        for t in np.flatnonzero(used > self.cap):
            on = k == t
            trim(self.value[:, t, :], g, self.gmin[:, t], int(g[on].sum()) - int(self.cap[t]), on)
        return g, k

    def fill(
        self, g: np.ndarray, k: np.ndarray, order: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Free GPUs of each type (in ``order``) to the jobs that gain most from them: the
        jobs on that type and the queued ones (which then take the type)."""
        g, k = g.copy(), k.copy()
        for t in order:
            free = int(self.cap[t]) - int(g[k == t].sum())
            if free <= 0:
                continue
            cand = (g == 0) | (k == t)
            counts = grow(
                self.value[:, t, :], np.where(cand, g, 0), self.gmax[:, t], self.gmin[:, t],
                free, cand,
            )  # fmt: skip
            if counts is None:
                continue
            k[(counts > 0) & (g == 0)] = t
            g, k = self.repair(g + counts, k)
        return g, k


def _place(
    policy: TypedSearch,
    snapshot: Snapshot,
    te: TypedEstimates,
    value: np.ndarray,
    best: tuple[np.ndarray, np.ndarray],
    order: np.ndarray,
) -> Plan:
    """Place each type's jobs on that type's nodes; GPUs a placement leaves free go to a
    job on the type or a queued one, never to a job another type holds."""
    g, k = best
    plans: list[JobPlan] = []
    taken = np.zeros(len(g), dtype=bool)
    for t in order:
        view, e, nodes = te.views[t], te.est[t], te.nodes[t]
        w = e.time.shape[1]
        here = (k == t) & (g > 0)
        v = value[:, t, :w].copy()
        v[(~here & (g > 0)) | taken, 1:] = -np.inf
        with np.errstate(invalid="ignore"):  # -inf - -inf where a job may not grow
            sub = place_schedule(view, e, v, np.where(here, np.minimum(g, w - 1), 0))
        if policy.probe:
            sub = probe_batches(view.jobs, e, sub)
        name = te.types[t]
        index = {j.job_id: i for i, j in enumerate(view.jobs)}
        for p in sub.jobs:
            taken[index[p.job_id]] = True
            placement = {nodes[node]: c for node, c in p.placement.items()}
            plans.append(replace(p, placement=placement, gpu_type=name))
    return fit_cpus(snapshot, Plan(tuple(plans)))
